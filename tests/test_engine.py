"""The native engine against known data, on both backends, with real files and io_uring."""

import errno
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import replace

import numpy as np
import pytest

from qual import engine
from qual.engine import (DataMismatch, DeviceIoError, Fault, InvalidJob,
                         IoJob, NoSpace, QualError, TargetUnavailable, run_job)

from testbed import IS_ROOT, flip_byte

BACKENDS = ["io_uring", "psync"]
MiB = 1 << 20


def job(path, **kw):
    kw.setdefault("op", "read")
    kw.setdefault("pattern", "sequential")
    kw.setdefault("block_size", 64 << 10)
    kw.setdefault("size", os.path.getsize(path) if os.path.exists(path) else 8 * MiB)
    return IoJob(target=str(path), **kw)


def blank_file(path, size):
    with open(path, "wb") as f:
        f.write(b"\0" * size)
        os.fsync(f.fileno())
    return path


# ------------------------------------------------------------------ known data


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", ["sequential", "random"])
def test_reads_return_what_python_wrote(pattern_file, backend, pattern):
    """Python writes the pattern; the engine reads it back and checks every block it reads."""
    path = pattern_file(8 * MiB, seed=7)
    res = run_job(job(path, pattern=pattern, backend=backend, queue_depth=8, workers=2,
                      verify=True, seed=7, bytes=16 * MiB))
    assert res.backend == backend
    assert res.bytes == 16 * MiB and res.ops == 16 * MiB // (64 << 10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_corrupted_byte_is_found_and_named(pattern_file, backend):
    path = pattern_file(4 * MiB, seed=9)
    bad = 3 * MiB + 777
    flip_byte(path, bad)
    with pytest.raises(DataMismatch) as e:
        run_job(job(path, backend=backend, verify=True, seed=9, bytes=4 * MiB, queue_depth=4))
    err = e.value
    assert err.errno == errno.EBADMSG and err.op == "read"
    assert err.offset == bad - bad % 512  # the 512-byte unit holding the bad byte
    assert err.target == str(path) and str(path) in str(err)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequential_writes_land_at_every_offset(tmp_path, backend):
    """Engine writes the pattern over the whole region with 3 workers; Python reads every
    512-byte unit back and checks its offset stamp and its content."""
    size = 6 * MiB
    path = blank_file(tmp_path / "w.dat", size)
    res = run_job(job(path, op="write", backend=backend, workers=3, queue_depth=4,
                      block_size=128 << 10, size=size, bytes=size, verify=True, seed=3))
    assert res.bytes == size
    data = np.fromfile(path, dtype=np.uint8)
    stamps = data.reshape(-1, 512)[:, :8].copy().view("<u8").ravel()
    assert (stamps == np.arange(0, size, 512, dtype=np.uint64)).all()
    assert engine.pattern_check(data, 3, 0) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_writes_are_block_aligned_and_in_the_region(tmp_path, backend):
    size, bs, region_off, region = 8 * MiB, 16 << 10, 1 * MiB, 4 * MiB
    path = blank_file(tmp_path / "r.dat", size)
    run_job(job(path, op="write", pattern="random", backend=backend, queue_depth=8,
                block_size=bs, offset=region_off, size=region, bytes=2 * MiB, verify=True,
                seed=5))
    blocks = np.fromfile(path, dtype=np.uint8).reshape(-1, bs)
    written = np.flatnonzero(blocks.any(axis=1))
    assert len(written) > 0
    offsets = written * bs
    assert offsets.min() >= region_off and offsets.max() < region_off + region
    for i in written:  # every written block is whole and belongs to its own offset
        assert engine.pattern_check(blocks[i], 5, int(i) * bs) is None


def test_write_data_is_incompressible_and_unique_per_block(tmp_path):
    size = 4 * MiB
    path = blank_file(tmp_path / "x.dat", size)
    run_job(job(path, op="write", block_size=64 << 10, size=size, bytes=size, seed=11))
    data = path.read_bytes()
    assert len(zlib.compress(data, 6)) > 0.99 * len(data)
    pages = np.frombuffer(data, dtype=np.uint8).reshape(-1, 4096)
    stamps = pages[:, :8].copy().view("<u8").ravel()
    assert (stamps == np.arange(0, size, 4096, dtype=np.uint64)).all()
    assert len({bytes(p) for p in pages}) == len(pages)  # no two pages alike: nothing to dedupe


# ------------------------------------------------------------------ bounds, results


@pytest.mark.parametrize("batch", [0, 1, 3, 8])
def test_every_submission_batch_reads_the_right_data(pattern_file, batch):
    path = pattern_file(4 * MiB, seed=13)
    res = run_job(job(path, pattern="random", queue_depth=8, submit_batch=batch, verify=True,
                      seed=13, bytes=8 * MiB, block_size=16 << 10))
    assert res.bytes == 8 * MiB


def test_bytes_bound_is_exact(pattern_file):
    res = run_job(job(pattern_file(8 * MiB), bytes=3 * MiB, queue_depth=4))
    assert res.bytes == 3 * MiB and res.ops == 48 and res.latency.count == 48


def test_bytes_bound_is_shared_across_workers(pattern_file):
    res = run_job(job(pattern_file(8 * MiB), bytes=5 * MiB, workers=3, pattern="random"))
    assert res.bytes == 5 * MiB


def test_time_bound_stops_the_job(pattern_file):
    res = run_job(job(pattern_file(8 * MiB), runtime=0.4, queue_depth=2, block_size=4096))
    assert 0.4 <= res.elapsed < 5
    assert res.ops > 0 and res.latency.count == res.ops


def test_a_worker_woken_after_the_deadline_still_issues(pattern_file):
    # a round of 1 µs is over before any worker runs, as a 100 ms round is on a host whose
    # cores are busy: each worker still brings back one I/O, so the round is not empty
    res = run_job(job(pattern_file(8 * MiB), runtime=1e-6, workers=3, queue_depth=1))
    assert 3 <= res.ops <= 6 and res.latency.count == res.ops


def test_first_bound_reached_wins(pattern_file):
    res = run_job(job(pattern_file(8 * MiB), runtime=60, bytes=1 * MiB))
    assert res.bytes == 1 * MiB and res.elapsed < 60


def test_result_fields_are_consistent(pattern_file):
    res = run_job(job(pattern_file(8 * MiB), bytes=8 * MiB, queue_depth=4))
    assert res.bandwidth == pytest.approx(res.bytes / res.elapsed)
    assert res.iops == pytest.approx(res.ops / res.elapsed)
    assert res.cpu > 0 and res.cpu_per_io == pytest.approx(res.cpu / res.ops)
    lat = res.latency.summary()
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["p99.99"] <= lat["max"]
    assert res.latency.min_ns <= lat["mean"] <= lat["max"]
    doc = res.to_dict()
    assert {"backend", "bw_bytes", "iops", "lat_ns", "cpu_s"} <= doc.keys()
    assert {"p50", "p99", "p99.9", "p99.99", "max", "mean"} <= doc["lat_ns"].keys()


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("bad, message", [
    (dict(block_size=1000), "not a multiple"),
    (dict(offset=100), "offset 100"),
    (dict(queue_depth=0), "queue depth 0"),
    (dict(workers=0), "workers 0"),
    (dict(submit_batch=9, queue_depth=8), "submit batch 9"),
    (dict(bytes=None, runtime=None), "no bound"),
    (dict(bytes=0), "byte bound 0 is outside"),
    (dict(bytes=100_000), "not a whole number of 65536-byte blocks"),
    (dict(runtime=0), "runtime 0 s is outside"),
    (dict(runtime=-1), "runtime -1 s is outside"),
    (dict(runtime=float("nan")), "runtime nan s is outside"),
    (dict(op="trim"), "op 'trim'"),
    (dict(size=1000), "holds no"),
    (dict(align=3), "power of two"),
])
def test_bad_jobs_are_refused_before_any_io(tmp_path, bad, message):
    path = tmp_path / "never.dat"
    kw = dict(bytes=MiB, size=8 * MiB)
    kw.update(bad)
    with pytest.raises(InvalidJob, match=message):
        job(path, **kw)
    assert not path.exists()


def test_kernel_alignment_error_names_op_and_offset(pattern_file):
    """A job Python lets through (alignment 1) but O_DIRECT refuses: the kernel's EINVAL
    surfaces from the engine with the op and offset of the failed I/O."""
    path = pattern_file(1 * MiB)
    with pytest.raises(InvalidJob) as e:
        run_job(job(path, block_size=1000, align=1, size=1000 * 1000, bytes=100_000))
    assert e.value.errno == errno.EINVAL and e.value.op == "read" and e.value.offset == 0


def test_region_beyond_the_end_of_the_file_is_refused(pattern_file):
    path = pattern_file(1 * MiB)
    with pytest.raises(InvalidJob, match="beyond the end"):
        run_job(job(path, size=2 * MiB, bytes=MiB))


def test_missing_target(tmp_path):
    with pytest.raises(TargetUnavailable) as e:
        run_job(job(tmp_path / "absent.dat", bytes=MiB))
    assert e.value.errno == errno.ENOENT


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["read", "write"])
def test_injected_eio_names_target_op_and_offset(pattern_file, backend, op):
    path = pattern_file(4 * MiB)
    fault = Fault(op=op, error=errno.EIO, offset_lo=2 * MiB, offset_hi=2 * MiB + 1)
    with pytest.raises(DeviceIoError) as e:
        run_job(job(path, op=op, backend=backend, bytes=4 * MiB, faults=(fault,)))
    err = e.value
    assert (err.errno, err.op, err.offset, err.target) == (errno.EIO, op, 2 * MiB, str(path))


def test_injected_short_read_is_an_error(pattern_file):
    path = pattern_file(2 * MiB)
    fault = Fault(op="read", short_bytes=512, offset_lo=MiB, offset_hi=MiB + 1)
    with pytest.raises(DeviceIoError, match="short read: 512 of 65536 bytes at offset 1048576"):
        run_job(job(path, bytes=2 * MiB, faults=(fault,)))


def test_injected_enospc_is_no_space(pattern_file):
    path = pattern_file(2 * MiB)
    fault = Fault(op="write", error=errno.ENOSPC, every=5)
    with pytest.raises(NoSpace):
        run_job(job(path, op="write", bytes=2 * MiB, faults=(fault,)))


def test_injected_delay_shows_in_latency(pattern_file):
    path = pattern_file(2 * MiB)
    fault = Fault(delay=0.05, limit=1)
    res = run_job(job(path, bytes=2 * MiB, faults=(fault,)))
    assert res.latency.max_ns >= 50_000_000
    assert res.latency.percentile(50) < 50_000_000


def test_errors_survive_pickling():
    """pytest-xdist ships a worker's exception to the controller."""
    err = DeviceIoError(errno.EIO, "boom", op="read", offset=4096, target="/x")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is DeviceIoError and str(back) == str(err) and back.offset == 4096


# ------------------------------------------------------------------ backend selection


# The kernel refuses io_uring to this one process, as a container's seccomp profile does
# (Docker's default refuses io_uring_setup with EPERM), never machine-wide: the sysctl
# kernel.io_uring_disabled would reach every other test running beside it.
WITHOUT_IO_URING = """
import ctypes, json, struct, sys
IO_URING_SETUP = 425  # the same number on x86_64 and the generic table (aarch64)
program = b"".join(struct.pack("HBBI", *insn) for insn in [
    (0x20, 0, 0, 0),                    # load the system call's number
    (0x15, 0, 1, IO_URING_SETUP),       # io_uring_setup?
    (0x06, 0, 0, 0x00050000 | 1),       #   refused: EPERM
    (0x06, 0, 0, 0x7fff0000)])          # anything else: allowed
insns = ctypes.create_string_buffer(program)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = Prog(len(program) // 8, ctypes.addressof(insns))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()  # a filter
from qual import engine
from qual.engine import IoJob, QualError, run_job
try:
    res = run_job(IoJob(target=sys.argv[1], op="read", pattern="sequential", block_size=65536,
                        size=2 << 20, bytes=2 << 20, queue_depth=4, backend=sys.argv[2]))
    print(json.dumps({"status": engine.io_uring_status(), "backend": res.backend}))
except QualError as e:
    print(json.dumps({"status": engine.io_uring_status(), "error": str(e)}))
"""


def without_io_uring(path, backend: str) -> dict:
    """A 2 MiB read of path through the engine in a process the kernel refuses io_uring."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_IO_URING, str(path), backend],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_auto_falls_back_to_psync_without_io_uring(pattern_file):
    out = without_io_uring(pattern_file(2 * MiB), "auto")
    assert "Operation not permitted" in out["status"] and out["backend"] == "psync"


def test_asking_for_io_uring_without_it_is_an_error(pattern_file):
    out = without_io_uring(pattern_file(2 * MiB), "io_uring")
    assert "io_uring is unavailable here: Operation not permitted" in out["error"]


def test_auto_uses_io_uring_where_it_works(pattern_file):
    if engine.io_uring_status() is not None:
        pytest.skip(f"io_uring unavailable here: {engine.io_uring_status()}")
    assert run_job(job(pattern_file(2 * MiB), bytes=2 * MiB)).backend == "io_uring"


# ------------------------------------------------------------------ interruption


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_ctrl_c_stops_a_long_job_within_about_a_second(tmp_path, backend):
    proc = subprocess.Popen(
        [sys.executable, "-m", "qual.cli", "io", "--target", str(tmp_path), "--rw", "randread",
         "--bs", "4k", "--iodepth", "4", "--size", "16M", "--runtime", "120", "--engine",
         backend], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # past start-up and the scratch fill, into the job
    assert proc.poll() is None
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    stopped = time.monotonic() - sent
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert stopped < 5, f"took {stopped:.1f} s to stop"


# ------------------------------------------------------------------ CRC32C


def _crc32c_reference(data: bytes, crc: int = 0) -> int:
    """CRC32C bit by bit (reflected polynomial 0x82F63B78): slow and plainly right."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("length", [0, 1, 7, 8, 24575, 24576, 24577, 2 * 24576 + 13, 100_003])
def test_crc32c_matches_the_reference_at_every_length(length):
    """Around the three-stream stripes (3 x 8 KiB) and their tails, and continued at odd cuts."""
    data = np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8).tobytes()
    want = _crc32c_reference(data)
    assert engine.crc32c(data) == want
    cut = length // 3 + 1 if length else 0
    assert engine.crc32c(data[cut:], engine.crc32c(data[:cut])) == want
    assert engine.crc32c(b"123456789") == 0xE3069283  # the standard check value


# ------------------------------------------------------------------ mixed reads and writes


@pytest.mark.skipif(not IS_ROOT, reason="loop devices need root")
def test_a_70_30_mixed_job_splits_so_and_the_device_counts_each_direction(loop_device):
    from qual import honesty
    from qual.targets import Target

    dev = loop_device(64 << 20)
    target = Target(dev, allow_destructive=True, confirm_serial=Target(dev).identity.serial)
    target.lock()
    try:
        job = target.prepare(target.job(op="mixed", rwmixread=70, pattern="random",
                                        block_size=4096, queue_depth=16, workers=2,
                                        size=32 << 20, bytes=20000 * 4096))
        before = target.device_stat()
        r = engine.run_job(job)
        seen = honesty.between(before, target.device_stat())
    finally:
        target.unlock()
    assert r.ops == r.read.ops + r.write.ops == 20000
    assert r.bytes == r.read.bytes + r.write.bytes
    assert abs(r.read.ops / r.ops - 0.70) <= 0.02 and abs(r.write.ops / r.ops - 0.30) <= 0.02
    assert seen["read_bytes"] == pytest.approx(r.read.bytes, rel=0.05)
    assert seen["write_bytes"] == pytest.approx(r.write.bytes, rel=0.05)
    assert r.read.latency.count == r.read.ops and r.write.latency.count == r.write.ops
    assert honesty.check_io(r, seen, target.identity)["device_truth"] == honesty.COUNTED


def test_a_mixed_job_with_verify_writes_the_pattern_and_checks_what_it_reads(tmp_path):
    """Reads in a mixed job check the pattern that the writes (and the set-up) laid down: a
    flipped byte under the region is found."""
    from qual.targets import Target

    target = Target(tmp_path)
    common = dict(block_size=4096, size=4 << 20, seed=9, verify=True, queue_depth=8)
    engine.run_job(target.prepare(target.job(op="write", pattern="sequential", bytes=4 << 20,
                                             **common)))
    mixed = target.prepare(target.job(op="mixed", rwmixread=50, pattern="random",
                                      bytes=8 << 20, **common))
    assert engine.run_job(mixed).write.ops > 0
    for block in range(16):  # a write may restore one before a read sees it; not all 16
        flip_byte(target.path, (3 << 20) + block * 4096 + 100)
    with pytest.raises(DataMismatch):
        engine.run_job(replace(mixed, rwmixread=90, bytes=32 << 20))


URING_FEATURES = {  # what each feature looks like in the engine's system calls (strace; an
    # older strace writes SINGLE_ISSUER | DEFER_TASKRUN as 0x3000)
    "defer_taskrun": r"IORING_SETUP_DEFER_TASKRUN|flags=0x3000\b",
    "fixed_files": r"IORING_REGISTER_FILES,",
    "fixed_buffers": r"IORING_REGISTER_BUFFERS,",
    "registered_ring": r"IORING_ENTER_REGISTERED_RING",
    # the ring's tick bounds a wait for one completion: such a wait carries no timeout
    "tick": r"IORING_ENTER_GETEVENTS(?!\|IORING_ENTER_EXT_ARG)",
}


def _uring_calls(tmp_path, without: str = "", depth: int = 8) -> str:
    """The io_uring system calls of one `qual io` job on a file, traced."""
    if not shutil.which("strace"):
        pytest.skip("strace is not installed (scripts/setup installs it)")
    trace = tmp_path / f"strace-{without or 'all'}-{depth}.txt"
    env = {**os.environ, "QUAL_URING_WITHOUT": without}
    proc = subprocess.run(["strace", "-f", "-o", str(trace), "-e",
                           "trace=io_uring_setup,io_uring_register,io_uring_enter",
                           sys.executable, "-m", "qual.cli", "io", "--target", str(tmp_path),
                           "--rw", "randread", "--bs", "4k", "--iodepth", str(depth),
                           "--size", "8M", "--runtime", "0.1s", "--engine", "io_uring", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return trace.read_text()


@pytest.mark.slow
def test_each_io_uring_feature_is_used_and_can_be_left_out(tmp_path):
    """Where the kernel offers them (this one does), a job's ring has deferred task work, its
    file and buffers registered, its own descriptor registered (entered by index) and a tick
    that bounds its waits; each named in QUAL_URING_WITHOUT is left out and the others kept,
    and the job still runs."""
    calls = _uring_calls(tmp_path)
    for feature, seen in URING_FEATURES.items():
        assert re.search(seen, calls), feature
    for feature, seen in URING_FEATURES.items():
        calls = _uring_calls(tmp_path, without=feature)
        assert not re.search(seen, calls), feature
        assert all(re.search(other, calls) for name, other in URING_FEATURES.items()
                   if name != feature), feature


ENTER = re.compile(r"io_uring_enter\(\d+, (\d+), (\d+), ")  # fd, to_submit, min_complete


@pytest.mark.slow
def test_at_depth_one_an_io_is_handed_over_alone_and_waited_for_in_a_second_call(tmp_path):
    """With nothing older in flight, the queue submits in one call and waits in another, as fio
    does: a device that answers within the submission has its completion ready for the wait
    (docs/benchmarks.md: 4 KiB at depth 1). A completion already in the ring when the wait
    comes needs no call (CI saw 4 of 759; a loaded host here, 77 of 471, when the loop
    device's worker ran before the wait), so most, not all, submissions have a wait of their
    own. At depth 8, with older I/Os in flight, a submission also waits in the same call."""
    def calls(depth: int) -> dict[tuple[int, int], int]:
        seen: dict[tuple[int, int], int] = {}
        for to_submit, min_complete in ENTER.findall(_uring_calls(tmp_path, depth=depth)):
            key = (int(to_submit) > 0, int(min_complete) > 0)
            seen[key] = seen.get(key, 0) + 1
        return seen
    one = calls(1)
    submits, waits = one.get((True, False), 0), one.get((False, True), 0)
    assert submits > 50 and waits > 0.5 * submits and one.get((True, True), 0) <= 2, one
    assert calls(8).get((True, True), 0) > 10

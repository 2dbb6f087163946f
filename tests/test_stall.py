"""A device that stops answering (a FUSE file whose reads never complete, stallfs.py): the
queue ends the job with a stall error within the command timeout, Ctrl-C still returns at
once, and a device that keeps saying EAGAIN is an error after a bounded back-off, not a spin."""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from qual.engine import Fault, IoJob, QualError, Stalled, run_job
from qual.engine.cache import FeatureCache
from qual.watchdog import IO_URING, Stall, Watchdog

from testbed import cells_profile, time_limit, write_pattern_file

BACKENDS = ["io_uring", "psync"]
MiB = 1 << 20
HERE = Path(__file__).resolve().parent


@pytest.fixture
def stalled_file(misbehaving):
    """A 1 MiB file on a filesystem whose reads of it are never answered."""
    return misbehaving("--stall-reads", "stall.dat", size=MiB).file


def stall_job(path, backend: str, **kw) -> IoJob:
    return IoJob(target=str(path), op="read", pattern="sequential", block_size=4096, size=MiB,
                 bytes=MiB, queue_depth=2, direct=False, backend=backend, **kw)


@pytest.mark.parametrize("backend, without", [("io_uring", ""), ("io_uring", "tick"),
                                              ("psync", "")])
def test_a_read_that_never_completes_ends_with_a_stall_error(stalled_file, backend, without,
                                                             monkeypatch):
    """The ring's tick bounds its waits; without it (a kernel before Linux 6.4), each wait's
    own timeout does."""
    monkeypatch.setenv("QUAL_URING_WITHOUT", without)
    started = time.monotonic()
    with time_limit(30, "a stalled read"), pytest.raises(Stalled) as e:
        run_job(stall_job(stalled_file, backend, command_timeout=1.0))
    took = time.monotonic() - started
    assert 1.0 <= took < 2.0, took
    assert e.value.errno == errno.ETIMEDOUT
    assert "read of 4096 bytes at offset 0 has been outstanding for 1." in str(e.value)
    assert "command timeout 1.0 s" in str(e.value)


def _threads_in(call: str) -> int:
    """Threads of this process now inside the system call `call` (by /proc, as the watchdog
    reads them)."""
    from qual.watchdog import SYSCALLS
    number = next(n for n, name in SYSCALLS.items() if name == call)
    found = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            line = Path(f"/proc/self/task/{tid}/syscall").read_text()
        except OSError:
            continue
        found += line.split()[0] == str(number)
    return found


def test_the_watchdog_sees_a_ring_entered_by_its_registered_slot(misbehaving):
    """Where one thread issues, the engine enters its io_uring by the ring's registered slot
    (IORING_ENTER_REGISTERED_RING): the call's first argument is then no descriptor, and slot 0
    reads as standard input. A read the storage never answers, with the engine's own clock far
    off (a checkpoint rank's), is still a stall on the ring for the watchdog."""
    storage = misbehaving("--stall-reads", "stall.dat", size=MiB)
    fired: list[Stall] = []
    ended: list[BaseException] = []

    def job():
        try:
            run_job(stall_job(storage.file, "io_uring", command_timeout=30.0))
        except QualError as e:
            ended.append(e)

    worker = threading.Thread(target=job)
    started = time.monotonic()
    with Watchdog(1.0, fired.append):
        worker.start()
        while not fired and time.monotonic() - started < 5:
            time.sleep(0.1)
    storage.close()  # the connection aborts: the read fails and the job ends
    worker.join(10)
    assert ended and not worker.is_alive()
    assert fired, "the watchdog did not see the read the storage never answered"
    assert fired[0].call == "io_uring_enter" and fired[0].file == IO_URING, fired[0]
    assert 1.0 < fired[0].age < 2.5


@pytest.mark.slow
def test_psync_has_one_read_in_flight_whatever_the_depth(stalled_file):
    """psync is synchronous, as fio's is: a job asking for depth 8 has one read outstanding,
    decided where the queue opens (ioq_open), not by each client."""
    failed = []

    def job():
        try:
            run_job(IoJob(target=str(stalled_file), op="read", pattern="random", block_size=4096,
                          size=MiB, bytes=MiB, queue_depth=8, direct=False, backend="psync",
                          command_timeout=3.0))
        except Stalled as e:
            failed.append(e)

    t = threading.Thread(target=job)
    t.start()
    time.sleep(1.5)  # every read the job will issue is issued, and none comes back
    in_pread = _threads_in("pread64")
    t.join(10)
    assert failed and not t.is_alive()
    assert in_pread == 1


def _ctrl_c_returns_within_2_s(call) -> None:
    """Ctrl-C one second into call(), which waits on storage that never answers (the command
    timeout is 30 s): KeyboardInterrupt within 2 s of it."""
    sent: list[float] = []

    def ctrl_c():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(1.0, ctrl_c)
    timer.start()
    try:
        with time_limit(30, "Ctrl-C during a stall"), pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
    assert sent and time.monotonic() - sent[0] < 2.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_ctrl_c_during_a_stall_returns_within_2_s(stalled_file, backend):
    _ctrl_c_returns_within_2_s(lambda: run_job(stall_job(stalled_file, backend)))


@pytest.mark.slow
def test_ctrl_c_during_a_stalled_gather_returns_within_2_s(stalled_file):
    """The feature cache waits for up to 8 completions at once (its reads time nothing): the
    ring's tick ends such a wait too, as any timeout's completion does, so Ctrl-C still ends
    a gather whose reads never come back."""
    cache = FeatureCache(str(stalled_file), rows=256, row_bytes=4096, row_stride=4096,
                         capacity_pages=64, queue_depth=16, max_coalesce=1, direct=False)
    out = np.empty((64, 4096), dtype=np.uint8)
    _ctrl_c_returns_within_2_s(lambda: cache.gather(np.arange(0, 256, 4), out))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_a_persistent_eagain_is_an_error_after_a_bounded_back_off(tmp_path, backend):
    path = tmp_path / "data.bin"
    write_pattern_file(path, MiB, seed=1)
    job = IoJob(target=str(path), op="read", pattern="random", block_size=4096, size=MiB,
                bytes=MiB, queue_depth=4, backend=backend,
                faults=(Fault(op="read", error=errno.EAGAIN),))
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    with time_limit(30, "a persistent EAGAIN"), pytest.raises(QualError) as e:
        run_job(job)
    cpu1, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - wall0
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    assert e.value.errno == errno.EAGAIN
    assert "still failed with Resource temporarily unavailable after 5.0 s of retries" in \
        str(e.value)
    assert 5.0 <= wall < 8.0
    assert cpu < 0.1 * wall, f"{cpu:.2f} s of CPU in {wall:.2f} s: a spin"


# ------------------------------------------------------------------ storage that stops answering

COMMAND_TIMEOUT = 2.0
BOUND = COMMAND_TIMEOUT + 5.0  # the run ends this long after the storage stops, at most


def gone(*markers: str, within: float = 10.0) -> bool:
    """No process whose command line holds one of `markers` is left (after the storage went
    away)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [subprocess.run(["pgrep", "-f", m], capture_output=True, text=True).stdout.strip()
                for m in markers]
        if not any(left):
            return True
        time.sleep(0.2)
    return False


def ends_within_the_bound(storage, tmp_path: Path, command: str, *args: str) -> str:
    """`qual COMMAND ARGS` on storage that stops answering everything (at the point its flags
    chose) ends within the command timeout + 5 s, exit 1, naming the call that did not return,
    with no traceback; once the storage is gone no qual process is left (rank processes
    included: their command lines name the job file under this test's TMPDIR). Returns
    stderr."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "qual.cli", command, *args, "--command-timeout",
         f"{COMMAND_TIMEOUT:g}s", "-q"], cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = storage.stopped_at()
    out, err = proc.communicate(timeout=120)  # the pipes close too: nothing keeps them open
    took = time.monotonic() - stopped
    assert proc.returncode == 1, err[-3000:]
    assert took < BOUND, f"ended {took:.1f} s after the storage stopped"
    assert f"qual {command}: error: Stalled: " in err and "has not returned for" in err, err
    assert f"command timeout {COMMAND_TIMEOUT:g} s" in err
    assert "Traceback" not in err
    storage.close()
    assert gone(str(storage.point), str(tmp)), "a qual process outlived the storage"
    return err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_qual_io_ends_when_the_storage_stops_answering_everything(misbehaving, tmp_path,
                                                                   backend):
    """Reads, lookups, closes: nothing is answered once the server stops (after 900 requests,
    reads under way). The engine's own stall error names the read first (io_uring issues
    O_DIRECT reads on FUSE from its workers, so the submitter is never the one stuck), then
    the call that blocked afterwards (the cleanup) ends the command at once."""
    storage = misbehaving("--answer", "900", size=64 * MiB)
    err = ends_within_the_bound(storage, tmp_path, "io", "--target", str(storage.file), "--rw",
                                "randread", "--bs", "4k", "--iodepth", "8", "--size", "64M",
                                "--runtime", "60s", "--engine", backend)
    assert re.search(r"Stalled: \S+stall.dat: read: read of 4096 bytes at offset \d+ has been "
                     r"outstanding for 2\.\d s", err), err


@pytest.mark.slow
def test_qual_checkpoint_ends_when_the_storage_stops_during_a_write(misbehaving, tmp_path):
    """The first write of a rank file is never answered, nor anything after it: the rank
    processes sit in the kernel, and the command still ends."""
    storage = misbehaving("--stop-on", "WRITE:rank-")
    ends_within_the_bound(storage, tmp_path, "checkpoint", "--target", str(storage.point),
                          "--tp", "2", "--scale", "1e-4", "--count", "3")


@pytest.mark.slow
def test_qual_checkpoint_read_only_ends_when_the_storage_stops_during_the_restore(
        misbehaving, tmp_path):
    storage = misbehaving("--stop-on", "READ:rank-")
    written = subprocess.run(  # straight into the backing folder: no request reaches stallfs
        [sys.executable, "-m", "qual.cli", "checkpoint", "--target", str(storage.backing),
         "--tp", "2", "--scale", "1e-4", "--count", "1", "--write-only", "-q"],
        capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    ends_within_the_bound(storage, tmp_path, "checkpoint", "--read-only",
                          str(storage.point / "qual-checkpoints" / "ckpt-000001"))


@pytest.mark.slow
def test_qual_train_ends_when_the_storage_stops_during_an_epoch(misbehaving, tmp_path):
    storage = misbehaving("--stop-on", "READ:train/")
    ends_within_the_bound(storage, tmp_path, "train", "--target", str(storage.point),
                          "--files", "16", "--record-scale", "0.002", "--computation-time",
                          "10ms", "--accelerators", "1", "--epochs", "1")


@pytest.mark.parametrize("stop_on, stuck_in", [
    ("WRITE:qual-igbh", None),  # generating the dataset
    ("READ:node_feat", "a page fault"),  # the features, read through a memory map
])
@pytest.mark.slow
def test_qual_gnn_ends_when_the_storage_stops(misbehaving, tmp_path, stop_on, stuck_in):
    storage = misbehaving("--stop-on", stop_on)
    err = ends_within_the_bound(storage, tmp_path, "gnn", "--target", str(storage.point),
                                "--scale", "0.01", "--fanouts", "3,2", "--steps", "3",
                                "--warmup", "1", "--batch-size", "128")
    assert stuck_in is None or f"Stalled: {stuck_in}" in err, err


@pytest.mark.slow
def test_a_run_whose_storage_stops_records_the_error_and_skips_the_rest(misbehaving, tmp_path):
    """A two-cell `qual run`: the cell that stalled is ERROR, the other is skipped for it, the
    record and the Allure results are written (elsewhere), exit 1, within the bound."""
    storage = misbehaving("--answer", "400", size=64 * MiB)
    profile = cells_profile(tmp_path / "stall.toml", "tests: two read cells on storage that "
                            "stops", ["seq_read", "rand_read"], runtime="5 s",
                            bandwidth=f'command_timeout = "{COMMAND_TIMEOUT:g} s"\n')
    results = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qual.cli", "run", "--target", str(storage.file), "--profile",
         str(profile), "--results", str(results), "-k", "test_cell"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = storage.stopped_at()
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - stopped
    assert proc.returncode == 1, out[-3000:] + err[-2000:]
    assert took < BOUND, f"ended {took:.1f} s after the storage stopped"
    assert "qual: Stalled: " in out and "verdict: ERROR" in out, out[-3000:]
    record = json.loads((results / "qual-run.json").read_text())
    outcomes = {t["nodeid"].split("::")[1]: (t["outcome"], t["message"]) for t in record["tests"]}
    (first, second) = (outcomes["test_cell[seq_read-64K-qd4]"],
                       outcomes["test_cell[rand_read-64K-qd4]"])
    assert first[0] == "broken" and first[1].startswith("Stalled: ")
    assert second[0] == "skipped" and "stopped answering" in second[1]
    assert record["summary"]["verdict"] == "ERROR" and record["stalled"]["test"].endswith(
        "test_cell[seq_read-64K-qd4]")
    allure = [json.loads(p.read_text()) for p in (results / "allure-results").glob(
        "*-result.json")]
    assert sorted(d["status"] for d in allure) == ["broken", "skipped"]
    storage.close()
    assert gone(str(results)), "a qual process outlived the storage"

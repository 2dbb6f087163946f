"""Every loop that ends on a count or a deadline ends, in any combination of the two: a byte
bound binds every worker (one with no share issues nothing), a time bound ends the job, and an
exception in the caller stops the native job before the call returns."""

from __future__ import annotations

import errno
import json
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from qual import cli, engine, steady
from qual.engine import InvalidJob, IoJob, run_job

from testbed import os_threads, time_limit, write_pattern_file

BACKENDS = ["io_uring", "psync"]
KiB, MiB = 1 << 10, 1 << 20
JOB_LIMIT = 10.0  # seconds: every job here moves at most a few MiB


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    """1 MiB of known data; the jobs here only read it."""
    path = tmp_path_factory.mktemp("bounds") / "data.bin"
    write_pattern_file(path, MiB, seed=5)
    return path


# ------------------------------------------------------------------ the zero-share workers


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("direct", [True, False])
def test_random_job_of_one_block_over_two_workers_ends_with_one_read(data_file, backend, direct):
    """The reproducer: `qual io --size 64k --bs 64K --numjobs 2` read forever on its second
    worker, whose share of the byte bound is zero."""
    with time_limit(JOB_LIMIT, "a 1-block job over 2 workers"):
        res = run_job(IoJob(target=str(data_file), op="read", pattern="random",
                            block_size=64 * KiB, size=64 * KiB, workers=2, bytes=64 * KiB,
                            backend=backend, direct=direct))
    assert (res.ops, res.bytes) == (1, 64 * KiB)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequential_byte_bound_below_one_block_per_worker_is_exact(data_file, backend):
    with time_limit(JOB_LIMIT, "a 1-block sequential job over 2 workers"):
        res = run_job(IoJob(target=str(data_file), op="read", pattern="sequential",
                            block_size=4096, size=MiB, workers=2, bytes=4096, backend=backend,
                            verify=True, seed=5))
    assert (res.ops, res.bytes) == (1, 4096)


@pytest.mark.parametrize("argv, ops", [
    (["--size", "64k", "--bs", "64K", "--numjobs", "2"], 1),
    (["--size", "1M", "--bs", "1M", "--numjobs", "2", "--engine", "psync", "--direct", "0"], 1),
    (["--size", "1M", "--bs", "1M", "--numjobs", "2", "--engine", "io_uring"], 1),
    (["--size", "10k", "--bs", "4k", "--numjobs", "3"], 2),  # fio: whole blocks of --size
])
def test_qual_io_reproducers_end_with_their_byte_bound(data_file, capsys, argv, ops):
    with time_limit(JOB_LIMIT, f"qual io {' '.join(argv)}"):
        rc = cli.main(["io", "--target", str(data_file), "--json", *argv])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["ops"] == ops and doc["bytes"] == ops * doc["bs"]


# ------------------------------------------------------------------ any combination of bounds


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(backend=st.sampled_from(BACKENDS), pattern=st.sampled_from(["sequential", "random"]),
       block_size=st.sampled_from([4 * KiB, 64 * KiB]), blocks=st.integers(1, 16),
       workers=st.integers(1, 6), depth=st.integers(1, 8),
       bound_blocks=st.one_of(st.none(), st.integers(1, 40)),
       runtime=st.one_of(st.none(), st.floats(0.001, 0.05)))
@pytest.mark.slow
def test_every_job_ends_at_its_first_bound(data_file, backend, pattern, block_size, blocks,
                                           workers, depth, bound_blocks, runtime):
    bytes_bound = None if bound_blocks is None else bound_blocks * block_size
    kw = dict(target=str(data_file), op="read", pattern=pattern, block_size=block_size,
              size=blocks * block_size, workers=workers, queue_depth=depth, backend=backend,
              bytes=bytes_bound, runtime=runtime)
    assume(pattern == "random" or blocks >= workers)  # sequential slices need a block each
    if bytes_bound is None and runtime is None:
        with pytest.raises(InvalidJob, match="no bound"):
            IoJob(**kw)
        return
    job = IoJob(**kw)
    started = time.monotonic()
    with time_limit(JOB_LIMIT, repr(job)):
        res = run_job(job)
    took = time.monotonic() - started
    assert res.ops * block_size == res.bytes == res.latency.count * block_size
    if runtime is None:
        assert res.bytes == bytes_bound, job
    else:
        assert took <= runtime + 1.0, job
        if bytes_bound is not None:
            assert res.bytes == bytes_bound or res.elapsed >= runtime, job
            assert res.bytes <= bytes_bound, job


# ------------------------------------------------------------------ exceptions in the caller


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_timeout_in_the_caller_stops_the_native_job(data_file, backend):
    """An hour-long job; the caller's timeout fires after 1 s. By the time the exception
    reaches the caller, the native job has stopped: no engine thread left (native ones
    counted by the kernel), its counters frozen, all within 2 s of the timeout."""
    threads = os_threads()
    ctl = engine.new_ctl()
    job = IoJob(target=str(data_file), op="read", pattern="random", block_size=4096, size=MiB,
                workers=2, queue_depth=4, runtime=3600.0, backend=backend)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        with time_limit(1.0, "an hour-long job"):
            run_job(job, ctl=ctl)
    assert 1.0 <= time.monotonic() - started < 3.0
    _assert_stopped(ctl, threads, by=started + 3.0)


def _assert_stopped(ctl, threads: set[int], by: float) -> None:
    """No thread started since `threads` was taken is left (the OS thread of one that Python
    has joined may take a moment to exit) by the time `by`, and the counters no longer move."""
    while os_threads() - threads and time.monotonic() < by:
        time.sleep(0.01)
    assert not os_threads() - threads
    assert not [t for t in threading.enumerate() if t.name == "qual-engine"]
    ops = int(ctl.ops_done)
    time.sleep(0.3)
    assert int(ctl.ops_done) == ops > 0


def test_an_error_in_the_progress_callback_stops_the_native_job(data_file):
    threads = os_threads()
    ctl = engine.new_ctl()

    def progress(done, ops, seconds):
        raise RuntimeError("the progress display broke")

    job = IoJob(target=str(data_file), op="read", pattern="random", block_size=4096, size=MiB,
                queue_depth=4, runtime=3600.0)
    with time_limit(JOB_LIMIT, "a job whose progress callback fails"):
        with pytest.raises(RuntimeError, match="progress display broke"):
            run_job(job, ctl=ctl, progress=progress, interval=0.1)
    _assert_stopped(ctl, threads, by=time.monotonic() + 2.0)


class Interrupted(Exception):
    """Ctrl-C, arriving at a chosen instant."""


@contextmanager
def interrupt_when(happened):
    """Raise Interrupted in this thread the moment `happened(frame, event, arg)` says so, as a
    Ctrl-C does: between two bytecodes, wherever they are (a profile hook's exception goes
    into the code it watches, and the hook is gone after it)."""
    def hook(frame, event, arg):
        if happened(frame, event, arg):
            sys.setprofile(None)
            raise Interrupted("Ctrl-C the instant after the engine call was handed over")
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)


def test_an_exception_the_instant_after_the_hand_over_stops_the_native_job(data_file):
    """The hand-over itself is no refuge: an exception the moment the engine's thread has
    started, before the caller waits on it, stops the hour-long job before it reaches the
    caller (CI caught `qual gnn` freeing a feature cache under a gather still running)."""
    threads = os_threads()
    ctl = engine.new_ctl()
    job = IoJob(target=str(data_file), op="read", pattern="random", block_size=4096, size=MiB,
                workers=2, queue_depth=4, runtime=3600.0)
    started = threading.Thread.start.__code__
    with time_limit(JOB_LIMIT, "an hour-long job interrupted at its hand-over"):
        with pytest.raises(Interrupted):
            with interrupt_when(lambda frame, event, arg: event == "return" and
                                frame.f_code is started):
                run_job(job, ctl=ctl)
    by = time.monotonic() + 2.0
    while os_threads() - threads and time.monotonic() < by:
        time.sleep(0.01)
    assert not os_threads() - threads  # it never started, or it stopped: nothing runs on
    ops = int(ctl.ops_done)
    time.sleep(0.3)
    assert int(ctl.ops_done) == ops


@pytest.mark.parametrize("instant", ["c_call", "c_return"])
def test_a_gather_interrupted_at_its_hand_over_is_over_and_the_cache_reads_on(tmp_path,
                                                                              instant):
    """A feature cache's gathers go to its own engine thread; an exception the instant before
    one is queued there (it is withdrawn: no 5 s wait for a call that never started) or just
    after (it is cancelled and waited for) leaves no gather running: the next one starts, is
    not told an earlier one never returned, and gathers the right bytes."""
    rows, row = 4096, 4096
    path = tmp_path / "features.bin"
    write_pattern_file(path, rows * row, seed=9)
    cache = engine.FeatureCache(str(path), rows=rows, row_bytes=row, row_stride=row,
                                capacity_pages=rows, queue_depth=8, max_coalesce=1)
    order = np.random.default_rng(3).permutation(rows).astype(np.int64)
    out = np.zeros((rows, row), np.uint8)
    calls = cache._thread._calls  # the one place a gather is handed over

    def queued(frame, event, arg):
        return event == instant and getattr(arg, "__self__", None) is calls
    with time_limit(JOB_LIMIT, "a gather interrupted at its hand-over"):
        with pytest.raises(Interrupted):  # itself, at once: not EngineStuck after STOP_WAIT
            with interrupt_when(queued):
                cache.gather(order, out)
        cache.gather(order[:64], out[:64])
    want = bytearray(row)
    for i in (0, 63):
        engine.pattern_fill(memoryview(want), 9, int(order[i]) * row)
        assert bytes(out[i]) == bytes(want)
    cache.close()


# ------------------------------------------------------------------ the other counted loops


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096])
def test_the_sample_reader_ends_on_any_file_size(tmp_path, backend, size):
    path = tmp_path / f"sample-{size}.bin"
    path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    reader = engine.SampleReader(block_size=4096, queue_depth=4, align=512, direct=False,
                                 backend=backend)
    with time_limit(JOB_LIMIT, f"reading a {size}-byte file"):
        assert reader.read(str(path)) == size
    reader.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("span_bytes", [0, 1, 4096, 3 * 4096 + 1])
def test_checkpoint_files_end_on_any_span_size(tmp_path, backend, span_bytes):
    path = tmp_path / f"ckpt-{span_bytes}.bin"
    data = np.frombuffer(bytes(range(256)) * 64, np.uint8)[:span_bytes].copy()
    file_size = max(4096, -(-span_bytes // 4096) * 4096)
    with time_limit(JOB_LIMIT, f"a checkpoint file of {span_bytes} bytes"):
        crcs, written = engine.write_checkpoint_file(str(path), [(0, data)], file_size,
                                                     chunk_size=4096, queue_depth=4,
                                                     backend=backend, direct=False)
        back = np.zeros_like(data)
        engine.read_checkpoint_file(str(path), [(0, back)], file_size, crcs, chunk_size=4096,
                                    queue_depth=4, backend=backend, direct=False)
    assert written.bytes == file_size and np.array_equal(back, data)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("blocks", [1, 2, 3, 4, 7, 12])
def test_integrity_passes_end_on_any_block_count(tmp_path, backend, blocks):
    path = tmp_path / "verify.bin"
    path.write_bytes(bytes(blocks * 4096))
    kw = dict(block_size=4096, queue_depth=4, offset=0, size=blocks * 4096, seed=3, seq=1,
              random=True, direct=False, backend=backend)
    with time_limit(JOB_LIMIT, f"verifying {blocks} blocks"):
        engine.verify_blocks(str(path), op="write", **kw)
        res = engine.verify_blocks(str(path), op="read", **kw)
    assert res.blocks == blocks and res.bad_blocks == 0
    with pytest.raises(InvalidJob, match="size above 0"):
        engine.verify_blocks(str(path), op="read", **{**kw, "size": 0})


@pytest.mark.parametrize("rows", [0, 1, 5])
def test_a_feature_gather_ends_on_any_row_count(tmp_path, rows):
    path = tmp_path / "features.bin"
    path.write_bytes(bytes(range(256)) * 16 * 8)  # 8 rows of 4 KiB
    cache = engine.FeatureCache(str(path), rows=8, row_bytes=4096, row_stride=4096,
                                capacity_pages=4, queue_depth=4, direct=False)
    out = np.empty((rows, 4096), np.uint8)
    with time_limit(JOB_LIMIT, f"gathering {rows} rows"):
        cache.gather(np.arange(rows, dtype=np.int64) % 8, out)
    cache.close()
    assert all(bytes(out[i]) == bytes(range(256)) * 16 for i in range(rows))


@settings(max_examples=300, deadline=None)
@given(max_rounds=st.integers(-2, 40), values=st.lists(st.floats(0, 10), max_size=60))
def test_steady_state_rounds_end_by_max_rounds(max_rounds, values):
    calls = []

    def one_round():
        value = values[len(calls)] if len(calls) < len(values) else 1.0 + len(calls) % 2
        calls.append(value)
        return value, len(calls)

    if max_rounds < 1:
        with pytest.raises(ValueError, match="at least one round"):
            steady.rounds_until_steady(one_round, max_rounds)
        assert not calls
        return
    state, results = steady.rounds_until_steady(one_round, max_rounds)
    assert 1 <= len(results) == len(calls) == state.rounds <= max_rounds
    assert state.reached or len(calls) == max_rounds


@pytest.mark.parametrize("bytes_bound, runtime_ns, message", [
    (0, None, "a byte bound of 0 moves nothing"),
    (None, 0, "a time bound of 0 ns"),
    (None, None, "job has no bound"),
    (4096 + 512, None, "not a whole number of 4096-byte blocks"),
])
def test_the_native_job_refuses_zero_as_a_bound(data_file, bytes_bound, runtime_ns, message):
    """At the C API too, 0 is a bound (and refused), never "unbounded": QUAL_UNBOUNDED is."""
    from qual._native import ffi, lib

    path = ffi.new("char[]", str(data_file).encode())
    cjob = ffi.new("struct qual_job *", dict(
        path=path, op=lib.QUAL_OP_READ, pattern=lib.QUAL_RANDOM, backend=lib.QUAL_BACKEND_AUTO,
        block_size=4096, queue_depth=1, workers=2, align=512, size=MiB,
        bytes=lib.QUAL_UNBOUNDED if bytes_bound is None else bytes_bound,
        runtime_ns=lib.QUAL_UNBOUNDED if runtime_ns is None else runtime_ns))
    ctl, res = ffi.new("struct qual_ctl *"), ffi.new("struct qual_result *")
    with time_limit(JOB_LIMIT, message):
        rc = lib.qual_job_run(cjob, ctl, res)
    assert rc == -errno.EINVAL and message in ffi.string(res.error_msg).decode()
    assert res.ops == 0

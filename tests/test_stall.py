"""A device that stops answering (a FUSE file whose reads never complete, stallfs.py): the
queue ends the job with a stall error within the command timeout, Ctrl-C still returns at
once, and a device that keeps saying EAGAIN is an error after a bounded back-off, not a spin."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from qual.engine import Fault, IoJob, QualError, Stalled, run_job

from testbed import IS_ROOT, time_limit, write_pattern_file

BACKENDS = ["io_uring", "psync"]
MiB = 1 << 20
HERE = Path(__file__).resolve().parent


@pytest.fixture
def stalled_file(tmp_path):
    """A 1 MiB file on a filesystem whose reads are never answered."""
    if not IS_ROOT or not os.path.exists("/dev/fuse"):
        pytest.skip("a stalling FUSE filesystem needs root and /dev/fuse")
    point = tmp_path / "stallfs"
    point.mkdir()
    daemon = subprocess.Popen([sys.executable, str(HERE / "stallfs.py"), str(point), str(MiB)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with time_limit(10, "mounting stallfs"):
            line = daemon.stdout.readline()
        if line.strip() != "ready":
            pytest.skip(f"stallfs could not mount here: {daemon.stderr.read().strip()}")
        yield point / "stall.dat"
    finally:
        daemon.kill()  # the connection aborts: reads still pending fail with ENOTCONN
        daemon.wait(timeout=10)
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def stall_job(path, backend: str, **kw) -> IoJob:
    return IoJob(target=str(path), op="read", pattern="sequential", block_size=4096, size=MiB,
                 bytes=MiB, queue_depth=2, direct=False, backend=backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_read_that_never_completes_ends_with_a_stall_error(stalled_file, backend):
    started = time.monotonic()
    with time_limit(30, "a stalled read"), pytest.raises(Stalled) as e:
        run_job(stall_job(stalled_file, backend, command_timeout=1.0))
    took = time.monotonic() - started
    assert 1.0 <= took < 2.0, took
    assert e.value.errno == errno.ETIMEDOUT
    assert "read of 4096 bytes at offset 0 has been outstanding for 1." in str(e.value)
    assert "command timeout 1.0 s" in str(e.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_during_a_stall_returns_within_2_s(stalled_file, backend):
    """Ctrl-C one second into a read that never completes (the command timeout is 30 s)."""
    sent: list[float] = []

    def ctrl_c():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(1.0, ctrl_c)
    timer.start()
    try:
        with time_limit(30, "Ctrl-C during a stall"), pytest.raises(KeyboardInterrupt):
            run_job(stall_job(stalled_file, backend))
    finally:
        timer.cancel()
    assert sent and time.monotonic() - sent[0] < 2.0


@pytest.mark.parametrize("backend", BACKENDS)
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

"""The private binding: the only module that imports the cffi library. It holds the codes the
C API uses, one check() for a return code, and the one helper for long calls, which run on a
helper thread so that the caller can report progress and cancel them on any exception."""

from __future__ import annotations

import errno as errno_mod
import math
import os
import queue
import threading
import time
from collections.abc import Callable

from qual._native import ffi, lib
from qual import watchdog
from qual.errors import EngineStuck, QualError, Stalled, error_for

OPS = ("read", "write")  # an I/O's direction
JOB_OPS = (*OPS, "mixed")  # a job's: "mixed" reads and writes (fio's randrw, rw)
PATTERNS = ("sequential", "random")
BACKENDS = ("auto", "io_uring", "psync")
MAX_QUEUE_DEPTH = lib.QUAL_MAX_DEPTH
MAX_WORKERS = lib.QUAL_MAX_WORKERS
MAX_BLOCK_SIZE = lib.QUAL_MAX_BLOCK
UNBOUNDED = lib.QUAL_UNBOUNDED  # a byte or time bound that does not bound (never 0)
STOP_WAIT = 5.0  # seconds a cancelled engine call may take to bring its I/Os back

OP_CODE = {"read": lib.QUAL_OP_READ, "write": lib.QUAL_OP_WRITE, "mixed": lib.QUAL_OP_MIXED}
PATTERN_CODE = {"sequential": lib.QUAL_SEQUENTIAL, "random": lib.QUAL_RANDOM}
BACKEND_CODE = {
    "auto": lib.QUAL_BACKEND_AUTO,
    "io_uring": lib.QUAL_BACKEND_IO_URING,
    "psync": lib.QUAL_BACKEND_PSYNC,
}
BACKEND_NAME = {code: name for name, code in BACKEND_CODE.items()}


def engine_error(err: int, message: str, **where) -> QualError:
    """The QualError for an engine failure. A stall (an I/O the device never completed) also
    tells the watchdog: whatever touches that storage afterwards (a close, the cleanup) gets
    no second command timeout (docs/ARCHITECTURE.md §4, "A watchdog")."""
    error = error_for(err)(err, message or os.strerror(err), **where)
    if isinstance(error, Stalled):
        watchdog.storage_stalled(str(error), where.get("target"))
    return error


def check(rc: int, *, op: str | None = None, target: str | None = None,
          offset: int | None = None) -> None:
    """Raise the QualError for a negative engine return code, with the engine's context."""
    if rc < 0:
        message = ffi.string(lib.qual_last_error()).decode(errors="replace")
        raise engine_error(-rc, message, op=op, offset=offset, target=target)


Progress = Callable[[int, int, float], None]


def ns(seconds: float) -> int:
    return round(seconds * 1e9) if math.isfinite(seconds) else UNBOUNDED


class Handover:
    """One long engine call handed from the caller's thread to the thread that runs it.

    An exception (Ctrl-C, a test's timeout) can reach the caller between any two of its
    bytecodes, even the instant after the call was handed over and before the caller waits on
    it; the caller then either withdraws the call before it starts (withdraw() is True: it
    never runs) or, once it has started, cancels it and waits for it to finish. Either way it
    does not go on while the call still runs on memory the caller is about to free (a feature
    cache closed under a gather). The lock makes withdraw and start exclusive."""

    def __init__(self, call):
        self._call = call
        self._lock = threading.Lock()
        self._state = "handed over"  # then "running" or "withdrawn"
        self.finished = threading.Event()  # an Event, not Thread.join: a join that an
        # exception interrupts can report a live thread as stopped (CPython)
        self.outcome: tuple[int, str] | None = None

    def run(self) -> None:  # on the engine's thread
        with self._lock:
            if self._state == "withdrawn":
                return
            self._state = "running"
        try:
            rc = self._call()
            # the context of a failure is per thread: take it here, on the thread that failed
            self.outcome = (rc, ffi.string(lib.qual_last_error()).decode(errors="replace"))
        finally:
            self.finished.set()

    def withdraw(self) -> bool:
        """True if the call had not started and now never will; False once it runs."""
        with self._lock:
            if self._state != "handed over":
                return False
            self._state = "withdrawn"
        self.finished.set()
        return True


class EngineThread:
    """One helper thread for all of an engine object's long calls, one at a time: for engine
    state that belongs to the thread using it (a feature cache's io_uring ring, made for a
    single submitter, which spares the kernel its cross-thread completion work)."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._last: Handover | None = None
        self.thread = threading.Thread(target=self._serve, args=(self._calls,), name=name,
                                       daemon=True)
        self.thread.start()

    @staticmethod
    def _serve(calls: queue.SimpleQueue) -> None:  # idle between calls; None ends it
        while (job := calls.get()) is not None:
            job.run()

    def start(self, job: Handover, memory) -> None:
        if self._last is not None and not self._last.finished.is_set():
            raise EngineStuck(errno_mod.ETIMEDOUT, "an earlier engine call on this object never "
                              "returned: its I/Os are still with the kernel")
        self._last = job
        self.thread.engine_memory = memory
        self._calls.put(job)

    def close(self) -> None:
        self._calls.put(None)


def long_call(call, ctl, keep, progress: Progress | None, interval: float,
              thread: EngineThread | None = None) -> tuple[int, str]:
    """Run a long engine call on a helper thread (a fresh one, or the given EngineThread), so
    that the main thread stays free to report progress(bytes_done, ops_done, seconds) every
    `interval` and to notice an exception (Ctrl-C, a test's timeout, a failing progress
    callback). Any exception that leaves this call, wherever it lands, withdraws the engine
    call if it has not started, or cancels it through ctl and waits, at most STOP_WAIT
    seconds, for it to stop: no engine call outlives the call that started it."""
    job = Handover(call)
    worker = None
    started = time.monotonic()
    try:  # the hand-over too: an exception the instant after it must still stop the call
        if thread:
            thread.start(job, (ctl, keep))
        else:
            worker = threading.Thread(target=job.run, name="qual-engine", daemon=True)
            # the engine reads these until it returns, even if a second Ctrl-C abandons the wait
            worker.engine_memory = (ctl, keep)
            worker.start()
        last = started
        while not job.finished.wait(0.05):
            now = time.monotonic()
            if progress and now - last >= interval:
                progress(int(ctl.bytes_done), int(ctl.ops_done), now - started)
                last = now
    except BaseException as stop:
        ctl.cancel = 1
        if not job.withdraw() and not job.finished.wait(STOP_WAIT):
            raise EngineStuck(errno_mod.ETIMEDOUT, f"still running {STOP_WAIT:g} s after it was "
                              f"cancelled ({type(stop).__name__}): I/Os the kernel has not "
                              "returned") from stop
        raise
    if worker:
        worker.join()  # past finished: only the thread's own exit is left
    return job.outcome


def check_outcome(outcome: tuple[int, str], **where) -> None:
    """check() for a call made through long_call (its context comes from the worker thread)."""
    rc, message = outcome
    if rc < 0:
        raise engine_error(-rc, message, **where)


def raise_result(res, target: str, default_op: str | None) -> None:
    if res.error:
        op = OPS[res.error_op] if res.error_op >= 0 else default_op
        offset = int(res.error_offset) if res.error_op >= 0 else None
        raise engine_error(-res.error, ffi.string(res.error_msg).decode(errors="replace"),
                           op=op, offset=offset, target=target)


def fill_faults(cfaults, faults) -> None:
    for cf, f in zip(cfaults, faults):
        cf.op = -1 if f.op is None else OP_CODE[f.op]
        cf.error = f.error
        cf.offset_lo, cf.offset_hi = f.offset_lo, f.offset_hi
        cf.every, cf.limit, cf.short_bytes = f.every, f.limit, f.short_bytes
        cf.delay_ns = int(f.delay * 1e9)


def new_ctl():
    """A control block to share among engine calls: set .cancel = 1 to stop them."""
    return ffi.new("struct qual_ctl *")

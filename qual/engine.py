"""The Pythonic face of the native engine: I/O jobs, their results, and the QualError family.

This is the only module that touches the cffi `ffi`/`lib`. Every engine call goes through
`check()`, which turns a negative errno into a `QualError` subclass carrying errno, operation,
offset and target. An engine error is never an AssertionError: in a qualification report it is
*broken* (the run could not measure), distinct from a threshold *failed*.
"""

from __future__ import annotations

import errno as errno_mod
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qual._native import ffi, lib

OPS = ("read", "write")
PATTERNS = ("sequential", "random")
BACKENDS = ("auto", "io_uring", "psync")
PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99)
MAX_QUEUE_DEPTH = 4096
MAX_WORKERS = 1024
MAX_BLOCK_SIZE = 64 << 20
PATTERN_UNIT = 512
UNBOUNDED = lib.QUAL_UNBOUNDED  # a byte or time bound that does not bound (never 0)
STOP_WAIT = 5.0  # seconds a cancelled engine call may take to bring its I/Os back

_OP_CODE = {"read": lib.QUAL_OP_READ, "write": lib.QUAL_OP_WRITE}
_PATTERN_CODE = {"sequential": lib.QUAL_SEQUENTIAL, "random": lib.QUAL_RANDOM}
_BACKEND_CODE = {
    "auto": lib.QUAL_BACKEND_AUTO,
    "io_uring": lib.QUAL_BACKEND_IO_URING,
    "psync": lib.QUAL_BACKEND_PSYNC,
}
_BACKEND_NAME = {code: name for name, code in _BACKEND_CODE.items()}


# ------------------------------------------------------------------ errors


class QualError(Exception):
    """An engine or target failure: errno, what was being done, where, and on what."""

    def __init__(self, errno: int, message: str, *, op: str | None = None,
                 offset: int | None = None, target: str | None = None):
        self.errno = errno
        self.message = message
        self.op = op
        self.offset = offset
        self.target = target
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.target:
            where.append(str(self.target))
        if self.op:
            where.append(self.op if self.offset is None else f"{self.op} at offset {self.offset}")
        name = errno_mod.errorcode.get(self.errno, str(self.errno))
        prefix = ": ".join(where)
        return f"{prefix}: {self.message} [{name}]" if prefix else f"{self.message} [{name}]"

    def __reduce__(self):  # keeps the fields when pytest-xdist or multiprocessing pickles it
        return (_rebuild_error, (type(self), self.errno, self.message, self.op, self.offset,
                                 self.target))


def _rebuild_error(cls, errno, message, op, offset, target):
    return cls(errno, message, op=op, offset=offset, target=target)


class InvalidJob(QualError):
    """Job parameters the engine cannot run (raised before any I/O)."""


class TargetUnavailable(QualError):
    """The target cannot be opened or used: missing, no permission, busy, read-only."""


class DeviceIoError(QualError):
    """The device failed an I/O, or returned less than asked."""


class Stalled(DeviceIoError):
    """An I/O stayed outstanding past the command timeout: the device stopped answering."""


class DataMismatch(DeviceIoError):
    """Data read back is not what was written there."""


class NoSpace(QualError):
    """The target ran out of space."""


class BackendUnavailable(QualError):
    """The requested I/O backend cannot be used on this machine."""


class Cancelled(QualError):
    """The job was cancelled before it finished."""


_ERROR_CLASS = {
    errno_mod.EINVAL: InvalidJob,
    errno_mod.ENOENT: TargetUnavailable,
    errno_mod.ENODEV: TargetUnavailable,
    errno_mod.ENXIO: TargetUnavailable,
    errno_mod.EACCES: TargetUnavailable,
    errno_mod.EPERM: TargetUnavailable,
    errno_mod.EBUSY: TargetUnavailable,
    errno_mod.EROFS: TargetUnavailable,
    errno_mod.ENOTSUP: TargetUnavailable,
    errno_mod.EIO: DeviceIoError,
    errno_mod.ENODATA: DeviceIoError,
    errno_mod.EBADMSG: DataMismatch,
    errno_mod.ETIMEDOUT: Stalled,
    errno_mod.ENOSPC: NoSpace,
    errno_mod.EDQUOT: NoSpace,
    errno_mod.ENOSYS: BackendUnavailable,
    errno_mod.ECANCELED: Cancelled,
}


def error_for(err: int) -> type[QualError]:
    return _ERROR_CLASS.get(err, QualError)


def check(rc: int, *, op: str | None = None, target: str | None = None,
          offset: int | None = None) -> None:
    """Raise the QualError for a negative engine return code, with the engine's context."""
    if rc < 0:
        message = ffi.string(lib.qual_last_error()).decode(errors="replace") or os.strerror(-rc)
        raise error_for(-rc)(-rc, message, op=op, offset=offset, target=target)


# ------------------------------------------------------------------ latency histogram


class LatencyHistogram:
    """Completion latencies (ns) in the engine's log-linear histogram (<= 0.78 % error)."""

    BUCKETS = lib.QUAL_HIST_BUCKETS

    def __init__(self, cdata=None):
        self._h = ffi.new("struct qual_hist *")
        if cdata is None:
            check(lib.qual_hist_init(self._h))
        else:
            ffi.memmove(self._h, ffi.addressof(cdata), ffi.sizeof("struct qual_hist"))

    @classmethod
    def from_samples(cls, samples_ns) -> LatencyHistogram:
        hist = cls()
        for ns in samples_ns:
            check(lib.qual_hist_record(hist._h, int(ns)))
        return hist

    @classmethod
    def from_bins(cls, bins: dict, *, min_ns: int, max_ns: int, sum_ns: int) -> LatencyHistogram:
        """Rebuild from `to_bins()` output (as stored in a run record)."""
        hist = cls()
        for value, count in bins.items():
            index = bucket_index(int(value))
            hist._h.buckets[index] += int(count)
            hist._h.count += int(count)
        hist._h.min_ns, hist._h.max_ns, hist._h.sum_ns = min_ns, max_ns, sum_ns
        return hist

    @property
    def count(self) -> int:
        return int(self._h.count)

    @property
    def min_ns(self) -> int:
        return int(self._h.min_ns) if self.count else 0

    @property
    def max_ns(self) -> int:
        return int(self._h.max_ns)

    @property
    def mean_ns(self) -> float:
        return self._h.sum_ns / self.count if self.count else 0.0

    def percentile(self, pct: float) -> int:
        out = ffi.new("uint64_t *")
        check(lib.qual_hist_percentile(self._h, float(pct), out))
        return int(out[0])

    def merge(self, other: LatencyHistogram) -> None:
        check(lib.qual_hist_merge(self._h, other._h))

    def counts(self) -> np.ndarray:
        return np.frombuffer(ffi.buffer(self._h.buckets), dtype=np.uint64).copy()

    def to_bins(self) -> dict[int, int]:
        """Non-empty buckets as {representative ns: count}, like fio's json+ `bins`."""
        counts = self.counts()
        return {bucket_value(int(i)): int(counts[i]) for i in np.flatnonzero(counts)}

    def summary(self) -> dict[str, float]:
        """p50 … p99.99, max and mean in ns (empty histogram: all zero)."""
        out = {f"p{pct:g}": (self.percentile(pct) if self.count else 0) for pct in PERCENTILES}
        out["max"] = self.max_ns
        out["mean"] = self.mean_ns
        return out


def bucket_value(index: int) -> int:
    out = ffi.new("uint64_t *")
    check(lib.qual_hist_bucket_value(index, out))
    return int(out[0])


def bucket_index(value_ns: int) -> int:
    out = ffi.new("uint32_t *")
    check(lib.qual_hist_bucket_of(value_ns, out))
    return int(out[0])


# ------------------------------------------------------------------ jobs


@dataclass(frozen=True)
class Fault:
    """A fault-injection rule (see struct qual_fault in native/include/qual.h)."""

    op: str | None = None  # "read", "write" or None for both
    error: int = 0  # errno to complete with
    offset_lo: int = 0
    offset_hi: int = 2**64 - 1
    every: int = 1
    limit: int = 0
    short_bytes: int = 0
    delay: float = 0.0  # seconds

    def __post_init__(self):
        if self.op not in (None, *OPS):
            raise InvalidJob(errno_mod.EINVAL, f"fault op {self.op!r} is not read, write or None")
        if not (self.error or self.short_bytes or self.delay):
            raise InvalidJob(errno_mod.EINVAL, "a fault needs an error, a short length or a delay")
        if self.offset_hi <= self.offset_lo or self.every < 1 or self.limit < 0:
            raise InvalidJob(errno_mod.EINVAL, "fault range, every or limit is invalid")


@dataclass(frozen=True)
class IoJob:
    """One I/O job: what the engine runs (see struct qual_job)."""

    target: str
    op: str
    pattern: str
    block_size: int
    size: int
    queue_depth: int = 1
    workers: int = 1
    submit_batch: int = 1  # io_uring: I/Os per submission syscall (0: all ready); fio's default
    offset: int = 0
    bytes: int | None = None  # bound: total bytes, whole blocks (None: no byte bound)
    runtime: float | None = None  # bound: seconds (None: no time bound)
    command_timeout: float = 30.0  # an I/O outstanding this long is a stall (NVMe's default)
    seed: int = 0
    backend: str = "auto"
    direct: bool = True
    verify: bool = False
    expect: tuple[int, int] | None = None  # (st_dev, st_ino) the path must open: see Target
    align: int = 512
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def __post_init__(self):
        problem = self._problem()
        if problem:
            raise InvalidJob(errno_mod.EINVAL, problem, target=self.target)

    def _problem(self) -> str | None:
        if self.op not in OPS:
            return f"op {self.op!r} is not one of {', '.join(OPS)}"
        if self.pattern not in PATTERNS:
            return f"pattern {self.pattern!r} is not one of {', '.join(PATTERNS)}"
        if self.backend not in BACKENDS:
            return f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}"
        if self.align < 1 or self.align & (self.align - 1):
            return f"alignment {self.align} is not a power of two"
        if not 0 < self.block_size <= MAX_BLOCK_SIZE:
            return f"block size {self.block_size} is outside 1..{MAX_BLOCK_SIZE}"
        if self.block_size % self.align:
            return (f"block size {self.block_size} is not a multiple of the target's "
                    f"{self.align}-byte logical block")
        if self.offset < 0 or self.offset % self.align:
            return f"region offset {self.offset} is not a multiple of {self.align}"
        if self.verify and self.block_size % PATTERN_UNIT:
            return f"verify needs a block size that is a multiple of {PATTERN_UNIT}"
        if not 1 <= self.queue_depth <= MAX_QUEUE_DEPTH:
            return f"queue depth {self.queue_depth} is outside 1..{MAX_QUEUE_DEPTH}"
        if not 0 <= self.submit_batch <= self.queue_depth:
            return f"submit batch {self.submit_batch} is outside 0..queue depth {self.queue_depth}"
        if not 1 <= self.workers <= MAX_WORKERS:
            return f"workers {self.workers} is outside 1..{MAX_WORKERS}"
        if self.size < self.block_size:
            return f"region of {self.size} bytes holds no {self.block_size}-byte block"
        if self.pattern == "sequential" and self.size // self.block_size < self.workers:
            return f"region of {self.size // self.block_size} blocks cannot be split over {self.workers} workers"
        if self.bytes is None and self.runtime is None:
            return "job has no bound: give bytes, runtime or both"
        if self.bytes is not None:
            if not 0 < self.bytes < UNBOUNDED:
                return f"byte bound {self.bytes} is outside 1..{UNBOUNDED - 1}"
            if self.bytes % self.block_size:
                return (f"byte bound {self.bytes} is not a whole number of "
                        f"{self.block_size}-byte blocks")
        if not 1 <= _ns(self.command_timeout) < UNBOUNDED:
            return f"command timeout {self.command_timeout} s is outside 1 ns..584 years"
        if self.runtime is not None and not 1 <= _ns(self.runtime) < UNBOUNDED:
            return f"runtime {self.runtime} s is outside 1 ns..{(UNBOUNDED - 1) / 1e9:.0f} s"
        return None

    @property
    def rw(self) -> str:
        """fio's name for the op and pattern (read, randread, write, randwrite)."""
        return ("rand" if self.pattern == "random" else "") + self.op


@dataclass(frozen=True)
class IoResult:
    """What a job did; bandwidth and IOPS are over its elapsed time (writes include sync)."""

    job: IoJob
    backend: str
    bytes: int
    ops: int
    elapsed: float
    cpu_user: float
    cpu_sys: float
    latency: LatencyHistogram

    @property
    def bandwidth(self) -> float:
        return self.bytes / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def iops(self) -> float:
        return self.ops / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def cpu(self) -> float:
        return self.cpu_user + self.cpu_sys

    @property
    def cpu_per_io(self) -> float:
        return self.cpu / self.ops if self.ops else 0.0

    def to_dict(self) -> dict:
        """The `qual io --json` document (fio-like key names)."""
        return {
            "target": self.job.target,
            "rw": self.job.rw,
            "bs": self.job.block_size,
            "iodepth": self.job.queue_depth,
            "numjobs": self.job.workers,
            "direct": self.job.direct,
            "backend": self.backend,
            "bytes": self.bytes,
            "ops": self.ops,
            "elapsed_s": self.elapsed,
            "bw_bytes": self.bandwidth,
            "iops": self.iops,
            "cpu_s": self.cpu,
            "cpu_user_s": self.cpu_user,
            "cpu_sys_s": self.cpu_sys,
            "lat_ns": self.latency.summary(),
        }


Progress = Callable[[int, int, float], None]


def _ns(seconds: float) -> int:
    return round(seconds * 1e9) if math.isfinite(seconds) else UNBOUNDED


class EngineStuck(QualError):
    """A cancelled engine call did not stop: the kernel has not returned its I/Os."""


def _call(call, ctl, keep, progress: Progress | None, interval: float) -> int:
    """Run a long engine call on a helper thread, so that the main thread stays free to report
    progress(bytes_done, ops_done, seconds) every `interval` and to notice an exception (Ctrl-C,
    a test's timeout, a failing progress callback). Any exception that leaves this call
    cancels the engine call through ctl and waits, at most STOP_WAIT seconds, for it to stop:
    no engine thread outlives the call that started it."""
    outcome: list[tuple[int, str]] = []
    # an Event, not Thread.join: a join that an exception interrupts can report a live thread
    # as stopped (CPython), and then the engine would run on past this call
    finished = threading.Event()

    def work():
        try:
            rc = call()
            # the context of a failure is per thread: take it here, on the thread that failed
            outcome.append((rc, ffi.string(lib.qual_last_error()).decode(errors="replace")))
        finally:
            finished.set()

    worker = threading.Thread(target=work, name="qual-engine", daemon=True)
    # the engine reads these until it returns, even if a second Ctrl-C abandons the wait
    worker.engine_memory = (ctl, keep)
    started = time.monotonic()
    worker.start()
    try:
        last = started
        while not finished.wait(0.05):
            now = time.monotonic()
            if progress and now - last >= interval:
                progress(int(ctl.bytes_done), int(ctl.ops_done), now - started)
                last = now
    except BaseException as stop:
        ctl.cancel = 1
        if not finished.wait(STOP_WAIT):
            raise EngineStuck(errno_mod.ETIMEDOUT, f"still running {STOP_WAIT:g} s after it was "
                              f"cancelled ({type(stop).__name__}): I/Os the kernel has not "
                              "returned") from stop
        worker.join()  # past finished: only the thread's own exit is left
        raise
    worker.join()
    return outcome[0]


def _check_call(outcome: tuple[int, str], **where) -> None:
    """check() for a call made through _call (its context comes from the worker thread)."""
    rc, message = outcome
    if rc < 0:
        raise error_for(-rc)(-rc, message or os.strerror(-rc), **where)


def _raise_result(res, target: str, default_op: str | None) -> None:
    if res.error:
        op = OPS[res.error_op] if res.error_op >= 0 else default_op
        offset = int(res.error_offset) if res.error_op >= 0 else None
        raise error_for(-res.error)(-res.error, ffi.string(res.error_msg).decode(errors="replace"),
                                    op=op, offset=offset, target=target)


def run_job(job: IoJob, *, progress: Progress | None = None, interval: float = 0.5,
            ctl=None) -> IoResult:
    """Run a job to its bound. Any exception in the caller (Ctrl-C, a timeout) cancels it and
    re-raises once it has stopped. `ctl` (new_ctl()) lets the caller watch its counters."""
    cjob = ffi.new("struct qual_job *")
    keep = _fill_job(cjob, job)
    ctl = ctl if ctl is not None else new_ctl()
    res = ffi.new("struct qual_result *")
    _call(lambda: lib.qual_job_run(cjob, ctl, res), ctl, (cjob, res, keep), progress, interval)
    _raise_result(res, job.target, job.op)
    return IoResult(
        job=job,
        backend=_BACKEND_NAME[res.backend],
        bytes=int(res.bytes),
        ops=int(res.ops),
        elapsed=res.elapsed_ns / 1e9,
        cpu_user=res.cpu_user_s,
        cpu_sys=res.cpu_sys_s,
        latency=LatencyHistogram(res.lat),
    )


def _fill_job(cjob, job: IoJob) -> list:
    """Copy an IoJob into a struct qual_job; returns the cdata that must outlive the call."""
    path = ffi.new("char[]", os.fsencode(job.target))
    cjob.path = path
    cjob.op = _OP_CODE[job.op]
    cjob.pattern = _PATTERN_CODE[job.pattern]
    cjob.backend = _BACKEND_CODE[job.backend]
    cjob.direct = int(job.direct)
    cjob.verify = int(job.verify)
    cjob.expect.dev, cjob.expect.ino = job.expect or (0, 0)
    cjob.block_size = job.block_size
    cjob.queue_depth = job.queue_depth
    cjob.workers = job.workers
    cjob.submit_batch = job.submit_batch
    cjob.align = job.align
    cjob.offset = job.offset
    cjob.size = job.size
    cjob.bytes = UNBOUNDED if job.bytes is None else job.bytes
    cjob.runtime_ns = UNBOUNDED if job.runtime is None else _ns(job.runtime)
    cjob.command_timeout_ns = _ns(job.command_timeout)
    cjob.seed = job.seed & (2**64 - 1)
    keep = [path]
    if job.faults:
        faults = ffi.new("struct qual_fault[]", len(job.faults))
        _fill_faults(faults, job.faults)
        cjob.faults, cjob.nfaults = faults, len(job.faults)
        keep.append(faults)
    return keep


def _fill_faults(cfaults, faults) -> None:
    for cf, f in zip(cfaults, faults):
        cf.op = -1 if f.op is None else _OP_CODE[f.op]
        cf.error = f.error
        cf.offset_lo, cf.offset_hi = f.offset_lo, f.offset_hi
        cf.every, cf.limit, cf.short_bytes = f.every, f.limit, f.short_bytes
        cf.delay_ns = int(f.delay * 1e9)


# ------------------------------------------------------------------ checkpoint files


@dataclass(frozen=True)
class FileResult:
    """What writing or reading one checkpoint file took (a write includes fdatasync)."""

    path: str
    backend: str
    bytes: int
    elapsed: float
    sync: float
    cpu_user: float
    cpu_sys: float

    @property
    def bandwidth(self) -> float:
        return self.bytes / self.elapsed if self.elapsed > 0 else 0.0


def _ckpt_file(path: str, spans, file_size: int, crcs, *, chunk_size: int, queue_depth: int,
               align: int, backend: str, direct: bool, faults, writable: bool):
    cf = ffi.new("struct qual_ckpt_file *")
    cpath = ffi.new("char[]", os.fsencode(path))
    cspans = ffi.new("struct qual_span[]", max(1, len(spans)))
    views = []
    for cs, (offset, buf) in zip(cspans, spans):
        view = ffi.from_buffer(buf, require_writable=writable)
        views.append(view)
        cs.data = ffi.cast("void *", view)
        cs.offset = offset
        cs.nbytes = len(view)
    cf.path, cf.backend, cf.direct, cf.align = cpath, _BACKEND_CODE[backend], int(direct), align
    cf.chunk_size, cf.queue_depth, cf.file_size = chunk_size, queue_depth, file_size
    cf.spans, cf.nspans = cspans, len(spans)
    cf.crcs, cf.ncrcs = crcs, len(crcs)
    keep = [cpath, cspans, views, crcs]
    if faults:
        cfaults = ffi.new("struct qual_fault[]", len(faults))
        _fill_faults(cfaults, faults)
        cf.faults, cf.nfaults = cfaults, len(faults)
        keep.append(cfaults)
    return cf, keep


def chunk_count(file_size: int, chunk_size: int) -> int:
    return -(-file_size // chunk_size)


def _file_result(res, path: str) -> FileResult:
    return FileResult(path=path, backend=_BACKEND_NAME[res.backend], bytes=int(res.bytes),
                      elapsed=res.elapsed_ns / 1e9, sync=res.sync_ns / 1e9,
                      cpu_user=res.cpu_user_s, cpu_sys=res.cpu_sys_s)


def write_checkpoint_file(path: str, spans, file_size: int, *, chunk_size: int = 8 << 20,
                          queue_depth: int = 8, align: int = 4096, backend: str = "auto",
                          direct: bool = True, faults=(), progress: Progress | None = None
                          ) -> tuple[list[int], FileResult]:
    """Create `path` holding each (offset, buffer) span at its offset, zeros between, written
    in chunks with a CRC32C each and made durable. Returns the chunk CRCs and the timing."""
    crcs = ffi.new("uint32_t[]", chunk_count(file_size, chunk_size))
    cf, keep = _ckpt_file(path, spans, file_size, crcs, chunk_size=chunk_size,
                          queue_depth=queue_depth, align=align, backend=backend, direct=direct,
                          faults=faults, writable=False)
    ctl, res = ffi.new("struct qual_ctl *"), ffi.new("struct qual_ckpt_result *")
    _call(lambda: lib.qual_ckpt_write(cf, ctl, res), ctl, (cf, res, keep), progress, 0.5)
    _raise_result(res, path, "write")
    return list(crcs), _file_result(res, path)


def read_checkpoint_file(path: str, spans, file_size: int, crcs, *, chunk_size: int = 8 << 20,
                         queue_depth: int = 8, align: int = 4096, backend: str = "auto",
                         direct: bool = True, faults=(), progress: Progress | None = None
                         ) -> FileResult:
    """Read `path` back into the (offset, writable buffer) spans, checking every chunk's CRC;
    a mismatch raises DataMismatch naming the bytes."""
    ccrcs = ffi.new("uint32_t[]", list(crcs))
    cf, keep = _ckpt_file(path, spans, file_size, ccrcs, chunk_size=chunk_size,
                          queue_depth=queue_depth, align=align, backend=backend, direct=direct,
                          faults=faults, writable=True)
    ctl, res = ffi.new("struct qual_ctl *"), ffi.new("struct qual_ckpt_result *")
    _call(lambda: lib.qual_ckpt_read(cf, ctl, res), ctl, (cf, res, keep), progress, 0.5)
    _raise_result(res, path, "read")
    return _file_result(res, path)


# ------------------------------------------------------------------ GNN: sampling and the feature cache


def sample(indptr: np.ndarray, indices: np.ndarray, dst: np.ndarray, fanout: int,
           seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Up to `fanout` distinct in-neighbours of every node in dst over one relation's CSC:
    (neighbour ids, index in dst of the node each was drawn for)."""
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    cap = len(dst) * fanout
    out_src = np.empty(max(1, cap), dtype=np.int64)
    out_pos = np.empty(max(1, cap), dtype=np.int64)
    edges = ffi.new("uint64_t *")
    check(lib.qual_sample(ffi.from_buffer("int64_t[]", indptr), ffi.from_buffer("int64_t[]", indices),
                          len(indptr) - 1, ffi.from_buffer("int64_t[]", dst), len(dst), fanout,
                          seed & (2**64 - 1), ffi.from_buffer("int64_t[]", out_src),
                          ffi.from_buffer("int64_t[]", out_pos), edges), op="sample")
    n = int(edges[0])
    return out_src[:n], out_pos[:n]


@dataclass(frozen=True)
class CacheStats:
    """A feature cache's counters (see struct qual_fcache_stats)."""

    accesses: int
    hits: int
    misses: int
    cpu_hits: int
    reads: int
    read_bytes: int
    evictions: int
    pinned_evictions: int
    writes: int
    pinned_pages: int
    io_s: float

    @property
    def hit_rate(self) -> float:
        """Share of feature requests served without the SSD: cache and CPU buffer (GIDS
        Table 1's definition)."""
        served = self.accesses + self.cpu_hits
        return (self.hits + self.cpu_hits) / served if served else 0.0

    def as_dict(self) -> dict:
        return {**self.__dict__, "hit_rate": self.hit_rate}


class FeatureCache:
    """A BaM/GIDS-style software page cache over a feature store (struct qual_fcache)."""

    def __init__(self, path: str, *, rows: int, row_bytes: int, row_stride: int,
                 page_size: int = 4096, capacity_pages: int, queue_depth: int = 128,
                 max_coalesce: int = 32, backend: str = "auto", direct: bool = True):
        o = ffi.new("struct qual_fcache_opts *")
        cpath = ffi.new("char[]", os.fsencode(path))
        o.path, o.rows, o.row_bytes, o.row_stride = cpath, rows, row_bytes, row_stride
        o.page_size, o.capacity, o.queue_depth = page_size, capacity_pages, queue_depth
        o.max_coalesce, o.backend, o.direct = max_coalesce, _BACKEND_CODE[backend], int(direct)
        out = ffi.new("struct qual_fcache **")
        check(lib.qual_fcache_open(o, out), op="open", target=path)
        self._c = ffi.gc(out[0], lib.qual_fcache_close)
        self.path, self.row_bytes = path, row_bytes
        self._cpu_buffer = None

    def close(self) -> None:
        if self._c is not None:
            ffi.release(self._c)  # runs qual_fcache_close now, not at garbage collection
            self._c = None

    def set_cpu_buffer(self, rows: np.ndarray, buffer: np.ndarray) -> None:
        """Serve these rows from `buffer` (len(rows) x row_bytes, kept alive here)."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        check(lib.qual_fcache_set_cpu_buffer(self._c, ffi.from_buffer("int64_t[]", rows),
                                             len(rows), ffi.from_buffer(buffer, require_writable=True)),
              op="read", target=self.path)
        self._cpu_buffer = buffer

    def window(self, rows: np.ndarray, delta: int) -> None:
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        check(lib.qual_fcache_window(self._c, ffi.from_buffer("int64_t[]", rows), len(rows),
                                     delta), op="window", target=self.path)

    def gather(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Copy the rows into `out` (len(rows) x row_bytes, writable), reading what is missing."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        ctl = ffi.new("struct qual_ctl *")
        crows, cout = ffi.from_buffer("int64_t[]", rows), ffi.from_buffer(out, require_writable=True)
        _check_call(_call(lambda: lib.qual_fcache_gather(self._c, crows, len(rows), cout, ctl),
                          ctl, (crows, cout), None, 0.5), op="read", target=self.path)

    def stats(self, reset: bool = False) -> CacheStats:
        st = ffi.new("struct qual_fcache_stats *")
        check(lib.qual_fcache_stats(self._c, st, int(reset)))
        return CacheStats(accesses=st.accesses, hits=st.hits, misses=st.misses,
                          cpu_hits=st.cpu_hits, reads=st.reads, read_bytes=st.read_bytes,
                          evictions=st.evictions, pinned_evictions=st.pinned_evictions,
                          writes=st.writes,
                          pinned_pages=st.pinned_pages, io_s=st.io_ns / 1e9)


# ------------------------------------------------------------------ sample files


class SampleReader:
    """Whole-file reads for one data-loader thread (struct qual_reader): every byte of a file
    read in block_size pieces, queue_depth in flight, into the reader's own buffers. Faults
    match offsets within each file. `ctl` (shared by the readers of a run) cancels them all."""

    def __init__(self, *, block_size: int, queue_depth: int, align: int, direct: bool = True,
                 backend: str = "auto", faults: tuple[Fault, ...] = (), ctl=None):
        if backend not in BACKENDS:
            raise InvalidJob(errno_mod.EINVAL, f"backend {backend!r} is not one of "
                             f"{', '.join(BACKENDS)}")
        o = ffi.new("struct qual_reader_opts *")
        o.backend, o.direct, o.align = _BACKEND_CODE[backend], int(direct), align
        o.block_size, o.queue_depth = block_size, queue_depth
        self._faults = ffi.new("struct qual_fault[]", len(faults)) if faults else ffi.NULL
        if faults:
            _fill_faults(self._faults, faults)
        o.faults, o.nfaults = self._faults, len(faults)
        out = ffi.new("struct qual_reader **")
        check(lib.qual_reader_open(o, out), op="open")
        self._r = ffi.gc(out[0], lib.qual_reader_close)
        code = ffi.new("int *")
        check(lib.qual_reader_backend(self._r, code))
        self.backend = _BACKEND_NAME[code[0]]
        self.ctl = ctl if ctl is not None else new_ctl()
        self._bytes = ffi.new("uint64_t *")

    def read(self, path: str) -> int:
        """Read the whole file; returns its size in bytes."""
        check(lib.qual_reader_read(self._r, os.fsencode(path), self.ctl, self._bytes),
              op="read", target=path)
        return int(self._bytes[0])

    def close(self) -> None:
        if self._r is not None:
            ffi.release(self._r)
            self._r = None


# ------------------------------------------------------------------ verification blocks

BLOCK_KINDS = {1: "corrupted", 2: "foreign", 3: "misdirected", 4: "stale"}


@dataclass(frozen=True)
class BadBlock:
    """A verification block that did not read back as written (struct qual_bad_block)."""

    offset: int
    kind: str           # corrupted | foreign | misdirected | stale
    found_offset: int   # what its header says (corrupted: nothing to say, 0)
    found_seed: int
    found_seq: int

    def describe(self) -> str:
        what = {"corrupted": "its bytes fail their CRC32C (or carry no header)",
                "foreign": f"it belongs to another run (seed {self.found_seed})",
                "misdirected": f"it holds the block written for offset {self.found_offset}",
                "stale": f"it is from an older write (sequence {self.found_seq})"}[self.kind]
        return f"offset {self.offset}: {self.kind}: {what}"


@dataclass(frozen=True)
class VerifyResult:
    op: str
    backend: str
    blocks: int
    bytes: int
    elapsed: float       # seconds; a write's fdatasync included
    counts: dict         # kind -> blocks
    bad: tuple[BadBlock, ...]  # the first few, in the order found

    @property
    def bad_blocks(self) -> int:
        return sum(self.counts.values())

    @property
    def bw(self) -> float:
        return self.bytes / self.elapsed if self.elapsed else 0.0


def verify_blocks(path: str, *, op: str, block_size: int, queue_depth: int, offset: int,
                  size: int, seed: int, seq: int, random: bool = False, align: int = 4096,
                  direct: bool = True, expect: tuple[int, int] | None = None,
                  backend: str = "auto",
                  faults: tuple[Fault, ...] = (), max_report: int = 16,
                  progress: Progress | None = None) -> VerifyResult:
    """Write verification blocks over [offset, offset + size) with sequence `seq` (op "write",
    durable when it returns), or read them back and classify every block (op "read")."""
    if op not in OPS:
        raise InvalidJob(errno_mod.EINVAL, f"op {op!r} is not one of {', '.join(OPS)}")
    if backend not in BACKENDS:
        raise InvalidJob(errno_mod.EINVAL, f"backend {backend!r} is not one of "
                         f"{', '.join(BACKENDS)}")
    o = ffi.new("struct qual_verify_opts *")
    o.op, o.backend, o.direct = OPS.index(op), _BACKEND_CODE[backend], int(direct)
    o.expect.dev, o.expect.ino = expect or (0, 0)
    o.random, o.align, o.block_size, o.queue_depth = int(random), align, block_size, queue_depth
    o.offset, o.size, o.seed, o.seq = offset, size, seed, seq
    cfaults = ffi.new("struct qual_fault[]", len(faults)) if faults else ffi.NULL
    if faults:
        _fill_faults(cfaults, faults)
    o.faults, o.nfaults = cfaults, len(faults)
    ctl = ffi.new("struct qual_ctl *")
    res = ffi.new("struct qual_verify_result *")
    bad = ffi.new("struct qual_bad_block[]", max(1, max_report))
    cpath = os.fsencode(path)
    outcome = _call(lambda: lib.qual_verify_run(cpath, o, ctl, res, bad, max_report), ctl,
                    (o, cfaults, res, bad, cpath), progress, 0.5)
    _check_call(outcome, op=op, target=path)
    return VerifyResult(
        op=op, backend=_BACKEND_NAME[res.backend], blocks=int(res.blocks), bytes=int(res.bytes),
        elapsed=res.elapsed_ns / 1e9,
        counts={"corrupted": int(res.corrupted), "foreign": int(res.foreign),
                "misdirected": int(res.misdirected), "stale": int(res.stale)},
        bad=tuple(BadBlock(int(b.offset), BLOCK_KINDS[b.kind], int(b.found_offset),
                           int(b.found_seed), int(b.found_seq))
                  for b in bad[0:res.reported]))


def verify_block(block_size: int, offset: int, seed: int, seq: int) -> bytes:
    """One verification block as the engine writes it (to plant stale or misdirected data)."""
    buf = ffi.new("unsigned char[]", block_size)
    check(lib.qual_verify_fill(buf, block_size, offset, seed, seq))
    return bytes(ffi.buffer(buf, block_size))


def new_ctl():
    """A control block to share among engine calls: set .cancel = 1 to stop them."""
    return ffi.new("struct qual_ctl *")


# ------------------------------------------------------------------ machine and data helpers


def crc32c(data, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of a buffer, continuing from crc."""
    out = ffi.new("uint32_t *")
    view = ffi.from_buffer(data)
    check(lib.qual_crc32c(crc, view, len(view), out))
    return int(out[0])


def crc32c_hardware() -> bool:
    yes = ffi.new("int *")
    check(lib.qual_crc32c_hardware(yes))
    return bool(yes[0])



def io_uring_status() -> str | None:
    """None when io_uring can be used here, else the reason it cannot."""
    rc = lib.qual_io_uring_probe()
    return None if rc == 0 else ffi.string(lib.qual_last_error()).decode()


def dio_alignment(path: str) -> tuple[int, int] | None:
    """(memory, offset) alignment for O_DIRECT on path, or None when the kernel does not say."""
    mem, off = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    rc = lib.qual_dio_align(os.fsencode(path), mem, off)
    if rc == -errno_mod.EOPNOTSUPP:
        return None
    check(rc, op="statx", target=path)
    return int(mem[0]), int(off[0])


def pattern_fill(buf, seed: int, offset: int) -> None:
    """Write the verification pattern for target offset `offset` into a writable buffer."""
    view = ffi.from_buffer(buf, require_writable=True)
    check(lib.qual_pattern_fill(view, len(view), seed & (2**64 - 1), offset), op="pattern")


def pattern_check(buf, seed: int, offset: int) -> int | None:
    """None when buf holds the pattern for `offset`, else the offset of the first bad unit."""
    view = ffi.from_buffer(buf)
    bad = ffi.new("uint64_t *")
    rc = lib.qual_pattern_check(view, len(view), seed & (2**64 - 1), offset, bad)
    if rc == -errno_mod.EBADMSG:
        return int(bad[0])
    check(rc, op="pattern")
    return None


def fill_random(buf, seed: int) -> None:
    """Fill a writable buffer with incompressible bytes from the engine's PRNG."""
    view = ffi.from_buffer(buf, require_writable=True)
    check(lib.qual_fill_random(view, len(view), seed & (2**64 - 1)))

"""I/O jobs: what the engine runs (IoJob, its faults), what it did (IoResult), and run_job."""

from __future__ import annotations

import os
import errno as errno_mod
from dataclasses import dataclass, field, replace

from qual.engine._binding import (
    BACKEND_CODE, BACKEND_NAME, BACKENDS, JOB_OPS, MAX_BLOCK_SIZE, MAX_QUEUE_DEPTH, MAX_WORKERS,
    OP_CODE, OPS, PATTERN_CODE, PATTERNS, UNBOUNDED, Progress, fill_faults, long_call, new_ctl, ns,
    raise_result)
from qual.engine._binding import ffi, lib
from qual.errors import InvalidJob
from qual.engine.histogram import LatencyHistogram

PATTERN_UNIT = 512


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
    op: str  # read, write, or mixed (reads and writes: rwmixread per cent of them reads)
    pattern: str
    block_size: int
    size: int
    rwmixread: int = 50
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
        if self.op not in JOB_OPS:
            return f"op {self.op!r} is not one of {', '.join(JOB_OPS)}"
        if not 0 <= self.rwmixread <= 100:
            return f"read share {self.rwmixread} % is outside 0..100"
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
        if not 1 <= ns(self.command_timeout) < UNBOUNDED:
            return f"command timeout {self.command_timeout} s is outside 1 ns..584 years"
        if self.runtime is not None and not 1 <= ns(self.runtime) < UNBOUNDED:
            return f"runtime {self.runtime} s is outside 1 ns..{(UNBOUNDED - 1) / 1e9:.0f} s"
        return None

    @property
    def rw(self) -> str:
        """fio's name for the op and pattern (read, randread, write, randwrite, rw, randrw)."""
        return ("rand" if self.pattern == "random" else "") + ("rw" if self.op == "mixed" else self.op)

    @property
    def writes(self) -> bool:
        """Whether the job writes (a write or a mixed job): the guard must pass first."""
        return self.op != "read"


@dataclass(frozen=True)
class Direction:
    """One direction's share of a job: its I/Os, bytes and latency, rates over the job's time."""

    ops: int
    bytes: int
    elapsed: float
    latency: LatencyHistogram

    def to_dict(self) -> dict:
        per_s = 1 / self.elapsed if self.elapsed > 0 else 0.0
        return {"ops": self.ops, "bytes": self.bytes, "bw_bytes": self.bytes * per_s,
                "iops": self.ops * per_s, "lat_ns": self.latency.summary()}


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
    read: Direction
    write: Direction

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
            **({"rwmixread": self.job.rwmixread} if self.job.op == "mixed" else {}),
            "read": self.read.to_dict(),
            "write": self.write.to_dict(),
        }


def combined(results: list[IoResult]) -> IoResult:
    """Rounds of one job as one result: their operations, bytes, time, CPU and latencies
    together, each direction apart as well."""
    def merged(hists) -> LatencyHistogram:
        out = LatencyHistogram()
        for h in hists:
            out.merge(h)
        return out

    elapsed = sum(r.elapsed for r in results)

    def side(name: str) -> Direction:
        mine = [getattr(r, name) for r in results]
        return Direction(ops=sum(d.ops for d in mine), bytes=sum(d.bytes for d in mine),
                         elapsed=elapsed, latency=merged(d.latency for d in mine))

    return replace(results[0], bytes=sum(r.bytes for r in results),
                   ops=sum(r.ops for r in results), elapsed=elapsed,
                   cpu_user=sum(r.cpu_user for r in results),
                   cpu_sys=sum(r.cpu_sys for r in results),
                   latency=merged(r.latency for r in results), read=side("read"),
                   write=side("write"))


def run_job(job: IoJob, *, progress: Progress | None = None, interval: float = 0.5,
            ctl=None) -> IoResult:
    """Run a job to its bound. Any exception in the caller (Ctrl-C, a timeout) cancels it and
    re-raises once it has stopped. `ctl` (new_ctl()) lets the caller watch its counters."""
    cjob = ffi.new("struct qual_job *")
    keep = _fill_job(cjob, job)
    ctl = ctl if ctl is not None else new_ctl()
    res = ffi.new("struct qual_result *")
    long_call(lambda: lib.qual_job_run(cjob, ctl, res), ctl, (cjob, res, keep), progress, interval)
    raise_result(res, job.target, job.op if job.op in OPS else None)
    elapsed = res.elapsed_ns / 1e9
    side = {op: Direction(ops=int(res.dir[code].ops), bytes=int(res.dir[code].bytes),
                          elapsed=elapsed, latency=LatencyHistogram(res.dir[code].lat))
            for code, op in enumerate(OPS)}
    return IoResult(
        job=job,
        backend=BACKEND_NAME[res.backend],
        bytes=int(res.bytes),
        ops=int(res.ops),
        elapsed=res.elapsed_ns / 1e9,
        cpu_user=res.cpu_user_s,
        cpu_sys=res.cpu_sys_s,
        latency=LatencyHistogram(res.lat),
        read=side["read"],
        write=side["write"],
    )


def _fill_job(cjob, job: IoJob) -> list:
    """Copy an IoJob into a struct qual_job; returns the cdata that must outlive the call."""
    path = ffi.new("char[]", os.fsencode(job.target))
    cjob.path = path
    cjob.op = OP_CODE[job.op]
    cjob.rwmixread = job.rwmixread
    cjob.pattern = PATTERN_CODE[job.pattern]
    cjob.backend = BACKEND_CODE[job.backend]
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
    cjob.runtime_ns = UNBOUNDED if job.runtime is None else ns(job.runtime)
    cjob.command_timeout_ns = ns(job.command_timeout)
    cjob.seed = job.seed & (2**64 - 1)
    keep = [path]
    if job.faults:
        faults = ffi.new("struct qual_fault[]", len(job.faults))
        fill_faults(faults, job.faults)
        cjob.faults, cjob.nfaults = faults, len(job.faults)
        keep.append(faults)
    return keep

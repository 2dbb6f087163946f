"""Simulated accelerators, as DLIO runs them: each accelerator has its own data loader (read
threads and a prefetch window of batches) reading whole sample files, and per step it waits
for its batch, "computes" by sleeping the configured time, and meets the other accelerators
at a barrier (DLIO's stand-in for allreduce). Accelerator utilisation (AU) is DLIO's: compute
time of the steps after the first over the wall time after the first step."""

from __future__ import annotations

import collections
import errno
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qual import honesty
from qual.errors import Cancelled, QualError


@dataclass(frozen=True)
class Step:
    """One step of one accelerator, in perf_counter seconds."""

    start: float     # began waiting for its batch
    loaded: float    # had its batch
    computed: float  # finished computing
    end: float       # left the barrier


def utilisation(steps: list[Step]) -> float:
    """DLIO's AU of one accelerator over one epoch (statscounter: exclude_start_steps=1): the
    compute of every step but the first over the wall time from the first step's end to the
    last step's end. NaN with fewer than two steps."""
    if len(steps) < 2:
        return math.nan
    wall = steps[-1].end - steps[0].end
    compute = sum(s.computed - s.loaded for s in steps[1:])
    return compute / wall if wall > 0 else math.nan


@dataclass
class Epoch:
    """What all accelerators did in one epoch."""

    index: int
    steps: int                          # per accelerator (every one runs the same number)
    batch: int
    au: list[float]                     # per accelerator
    bytes: int                          # read from the files, all accelerators
    wall_s: float                       # first accelerator's start to last one's end
    device: dict | None = None          # the block device's counters over the epoch
    step_times: list[list[Step]] = field(default_factory=list, repr=False)

    @property
    def au_mean(self) -> float:
        return float(np.mean(self.au))

    @property
    def samples(self) -> int:
        return self.steps * self.batch * len(self.au)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s else 0.0

    @property
    def bw(self) -> float:
        return self.bytes / self.wall_s if self.wall_s else 0.0

    def as_dict(self) -> dict:
        return {"epoch": self.index, "steps": self.steps,
                "steps_per_accelerator": [len(s) for s in self.step_times],
                "au_mean": self.au_mean,
                "au_per_accelerator": self.au, "samples": self.samples,
                "samples_per_s": self.samples_per_s, "bytes": self.bytes, "bw_bytes": self.bw,
                "wall_s": self.wall_s, "device": self.device}


class _Loader:
    """One accelerator's data loader, shaped like torch's DataLoader: its read threads take the
    accelerator's files in order, and the files of at most `ahead` batches beyond the one in
    use are handed out (prefetch). Batch b is ready when every file holding its samples is."""

    def __init__(self, paths: list[str], *, batch: int, samples_per_file: int, threads: int,
                 ahead: int, open_reader: Callable, cancel: threading.Event):
        self.paths, self.batch, self.spf = paths, batch, samples_per_file
        self.ahead, self.open_reader, self.cancel = ahead, open_reader, cancel
        self.done = [False] * len(paths)
        self.ready = 0  # files 0 .. ready-1 are all read
        self.bytes = 0
        self.error: BaseException | None = None
        self._dispatched = 0
        self._cv = threading.Condition()
        self._queue: collections.deque[int] = collections.deque()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"qual-reader-{i}", daemon=True)
                         for i in range(threads)]

    def files_for(self, b: int) -> int:
        """Files that must be read before batch b can be served."""
        return min(len(self.paths), math.ceil((b + 1) * self.batch / self.spf))

    def start(self) -> None:
        self.release(-1)
        for t in self._threads:
            t.start()

    def release(self, b: int) -> None:
        """Batch b is in use: hand out the files of the batches up to b + ahead."""
        upto = self.files_for(b + self.ahead)
        with self._cv:
            self._queue.extend(range(self._dispatched, upto))
            self._dispatched = max(self._dispatched, upto)
            self._cv.notify_all()

    def wait(self, b: int) -> None:
        need = self.files_for(b)
        with self._cv:
            while self.error is None and self.ready < need:
                self._cv.wait(0.1)
                if self.cancel.is_set() and self.error is None:
                    raise Cancelled(errno.ECANCELED, "cancelled")
            if self.error is not None:
                raise self.error

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()

    def _work(self) -> None:
        reader = None
        try:
            reader = self.open_reader()
            while True:
                with self._cv:
                    while not self._queue and not self._closed and self.error is None:
                        self._cv.wait()
                    if self._closed or self.error is not None:
                        return
                    i = self._queue.popleft()
                n = reader.read(self.paths[i])
                with self._cv:
                    self.done[i] = True
                    while self.ready < len(self.done) and self.done[self.ready]:
                        self.ready += 1
                    self.bytes += n
                    self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the accelerator, which raises it
            with self._cv:
                if self.error is None:
                    self.error = e
                self._cv.notify_all()
        finally:
            if reader is not None:
                reader.close()


@dataclass(frozen=True)
class Plan:
    """One run's shape: accelerators, their loaders and compute."""

    accelerators: int
    batch: int
    samples_per_file: int
    read_threads: int
    prefetch: int            # batches handed out ahead of the one in use, per read thread
    computation_time: float  # seconds per step
    steps: int               # per accelerator per epoch


def run_epoch(plan: Plan, paths: list[str], order: np.ndarray, *, index: int,
              open_reader: Callable, stop: Callable = lambda: None, sample_device=None,
              sleep=time.sleep) -> Epoch:
    """One epoch: accelerator a takes the a-th contiguous share of the shuffled files (DLIO's
    sampler), every accelerator runs plan.steps steps, all meet at a barrier after each.
    open_reader() gives a read thread its reader; stop() cancels the readers' engine calls."""
    n = plan.accelerators
    files_each = math.ceil(plan.steps * plan.batch / plan.samples_per_file)
    if files_each * n > len(order):
        raise QualError(22, f"{n} accelerators x {plan.steps} steps need {files_each * n} "
                        f"files; the dataset has {len(order)}")
    cancel = threading.Event()
    loaders = [_Loader([paths[i] for i in order[a * files_each:(a + 1) * files_each]],
                       batch=plan.batch, samples_per_file=plan.samples_per_file,
                       threads=plan.read_threads, ahead=plan.read_threads * plan.prefetch,
                       open_reader=open_reader, cancel=cancel) for a in range(n)]
    barrier = threading.Barrier(n)
    start_gate = threading.Barrier(n + 1)
    times: list[list[Step]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def accelerator(a: int) -> None:
        loader = loaders[a]
        try:
            start_gate.wait()
            loader.start()
            for b in range(plan.steps):
                t0 = time.perf_counter()
                loader.wait(b)
                t1 = time.perf_counter()
                loader.release(b)
                if plan.computation_time:
                    sleep(plan.computation_time)
                t2 = time.perf_counter()
                barrier.wait()
                times[a].append(Step(t0, t1, t2, time.perf_counter()))
        except threading.BrokenBarrierError:
            pass  # another accelerator failed; its error is the one reported
        except BaseException as e:  # noqa: BLE001 - raised on the calling thread below
            errors.append(e)
            cancel.set()
            stop()
            barrier.abort()
        finally:
            loader.close()

    threads = [threading.Thread(target=accelerator, args=(a,), name=f"qual-accelerator-{a}",
                                daemon=True) for a in range(n)]
    for t in threads:
        t.start()
    before = sample_device() if sample_device else None
    try:
        start_gate.wait()
        for t in threads:
            while t.is_alive():
                t.join(0.1)
    except KeyboardInterrupt:
        cancel.set()
        stop()
        barrier.abort()
        for t in threads:
            t.join()
        raise
    after = sample_device() if sample_device else None
    if errors:
        raise errors[0]
    start = min(s[0].start for s in times)
    end = max(s[-1].end for s in times)
    return Epoch(index=index, steps=plan.steps, batch=plan.batch,
                 au=[utilisation(s) for s in times], bytes=sum(ld.bytes for ld in loaders),
                 wall_s=end - start,
                 device=honesty.between(before, after),
                 step_times=times)

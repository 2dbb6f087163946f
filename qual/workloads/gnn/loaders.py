"""The two feature loaders the GNN suite compares, yielding the same batches for the same seeds:

- GIDS-style (seeds 000/002): the native software page cache over the feature store, a window
  of batches sampled ahead whose pages stay pinned, a storage access accumulator that merges
  batches until the storage requests they would make reach its threshold, and a constant CPU
  buffer of the hottest rows. Each mechanism can be switched off.
- DGL-style mmap baseline: a memory map of the same store, fancy-indexed on the CPU, under a
  host-memory budget that is enforced (a memory cgroup where the machine allows, else the least
  recently gathered rows evicted before every step) and measured (the store's pages in the page
  cache after every step).
"""

from __future__ import annotations

import collections
import errno
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import torch

from qual import engine, watchdog
from qual.errors import QualError
from qual.workloads.gnn.graph import Graph, Sample, sample
from qual.workloads.gnn.igbh import FEATURE_DIM, NODE_TYPES
from qual.workloads.gnn.store import FeatureStore


def accumulator_threshold(bandwidth: float, ssd_latency: float, system_latency: float,
                          ssds: int, page_size: int, p: float = 0.95) -> int:
    """Node accesses to keep outstanding for fraction p of peak (GIDS
    set_required_storage_access): p * bw * 1024 / page * (l_ssd + l_system) * ssds / (1 - p),
    with bw in GB/s and latencies in microseconds. Defaults 5.8 GB/s, 11 + 20 us, 1 SSD,
    4 KiB give 854 (docs/ARCHITECTURE.md §9, GIDS)."""
    return int(p * bandwidth / 1e9 * 1024 / page_size * (ssd_latency + system_latency) * 1e6
               * ssds / (1 - p))


@dataclass
class Batch:
    index: int
    sample: Sample
    x: dict          # node type -> features of the sample's outermost nodes (a tensor)
    y: torch.Tensor  # labels of the seeds
    times: dict = field(default_factory=dict)  # stage -> seconds spent producing this batch
    untimed: float = 0.0  # seconds the measurement itself spent producing it (not the loader's)


class _Batches:
    """What both loaders share: seeds in batch order, the sampling seed of a batch, labels."""

    name = ""

    def __init__(self, store: FeatureStore, graph: Graph, labels: np.ndarray, *,
                 fanouts: list[int], batch_size: int, seed: int, device: str = "cpu"):
        self.store, self.graph, self.labels = store, graph, labels
        self.fanouts, self.batch_size, self.seed = fanouts, batch_size, seed
        self.device = torch.device(device)

    def draw(self, index: int, seeds: np.ndarray) -> Sample:
        return sample(self.graph, seeds, self.fanouts, self.seed * 7919 + index)

    def rows_of(self, s: Sample) -> np.ndarray:
        """The store rows of a sample's nodes, type by type."""
        return np.concatenate([s.nodes[t] + self.store.offsets[t] for t in NODE_TYPES])

    def split(self, s: Sample, feats: torch.Tensor) -> dict:
        out, at = {}, 0
        for t in NODE_TYPES:
            n = len(s.nodes[t])
            out[t] = feats[at:at + n]
            at += n
        return out

    def label(self, s: Sample) -> torch.Tensor:
        return torch.from_numpy(self.labels[s.seeds]).to(self.device)

    def close(self) -> None:
        pass


MAX_MERGE = 16  # batches one merged gather holds at most, so that its memory stays bounded


class GidsLoader(_Batches):
    name = "gids"

    def __init__(self, store: FeatureStore, graph: Graph, labels: np.ndarray, *,
                 cache_pages: int, window: int, threshold: int, cpu_rows: np.ndarray | None,
                 page_cache: bool = True, queue_depth: int = 128, max_coalesce: int = 32,
                 backend: str = "auto", **kw):
        super().__init__(store, graph, labels, **kw)
        self.cache = engine.FeatureCache(str(store.path), rows=store.rows,
                                         row_bytes=store.row_bytes, row_stride=store.row_stride,
                                         page_size=store.page_size, capacity_pages=cache_pages,
                                         queue_depth=queue_depth, max_coalesce=max_coalesce,
                                         backend=backend)
        self.cache_pages, self.page_cache = cache_pages, page_cache
        self.window, self.threshold = window, threshold
        self.gathers = self.merged = 0  # gathers issued; batches merged into another's gather
        self.cpu_rows = 0
        if cpu_rows is not None and len(cpu_rows):
            buf = torch.empty((len(cpu_rows), FEATURE_DIM), dtype=torch.float32,
                              pin_memory=self.device.type == "cuda")
            self.cache.set_cpu_buffer(cpu_rows, buf.numpy())
            self._cpu_buffer = buf
            self.cpu_rows = len(cpu_rows)

    def setup(self) -> dict:
        memory = self.cache_pages * self.store.page_size + self.cpu_rows * self.store.row_bytes
        return {"page_cache": self.page_cache, "cache_pages": self.cache_pages,
                "cpu_buffer_rows": self.cpu_rows, "memory_bytes": memory,  # cache + CPU buffer
                "window": self.window, "accumulator_threshold": self.threshold,
                "gathers": self.gathers, "merged_batches": self.merged}

    def close(self) -> None:
        self.cache.close()

    def batches(self, seeds: np.ndarray):
        ahead: collections.deque = collections.deque()  # sampled, rows pinned in the window
        try:
            yield from self._batches(seeds, ahead)
        finally:  # stopped early (or done): nothing sampled ahead stays pinned; after a
            # Ctrl-C the loader may be closed before this generator is, and then nothing is
            if self.window and not self.cache.closed:
                for _, _, rows in ahead:
                    self.cache.window(rows, -1)

    def _batches(self, seeds: np.ndarray, ahead: collections.deque):
        chunks = iter(enumerate(np.array_split(seeds, max(1, -(-len(seeds) // self.batch_size)))))

        def sample_next() -> bool:
            """Sample the next batch into the window (its pages pinned); False at the end."""
            nxt = next(chunks, None)
            if nxt is None:
                return False
            s = self.draw(*nxt)
            rows = self.rows_of(s)
            if self.window:
                self.cache.window(rows, +1)
            ahead.append((nxt[0], s, rows))
            return True

        more = True
        while True:
            t0 = time.perf_counter()
            while more and len(ahead) < max(1, self.window):
                more = sample_next()
            if not ahead:
                return
            group = [ahead.popleft()]
            if self.threshold:
                # the accumulator: merge batches until the storage requests they would make (pages
                # neither cached nor in the CPU buffer) reach the threshold
                pending = self.cache.probe(group[0][2])
                while pending < self.threshold and len(group) < MAX_MERGE and \
                        (ahead or (more and (more := sample_next()))):
                    group.append(ahead.popleft())
                    pending = self.cache.probe(np.concatenate([r for _, _, r in group]))
            sampled = time.perf_counter() - t0
            rows = np.concatenate([r for _, _, r in group])
            feats = torch.empty((len(rows), FEATURE_DIM), dtype=torch.float32,
                                pin_memory=self.device.type == "cuda")
            t1 = time.perf_counter()
            self.cache.gather(rows, feats.numpy())
            gathered = time.perf_counter() - t1
            self.gathers += 1
            self.merged += len(group) - 1
            if not self.page_cache:  # switched off: nothing stays for the next gather
                self.cache.drop()
            if self.window:
                for _, _, r in group:
                    self.cache.window(r, -1)
            feats, moved = self._transfer(feats)
            at = 0
            for k, (index, s, r) in enumerate(group):
                part = feats[at:at + len(r)]
                at += len(r)
                times = {"sample": sampled, "gather": gathered, "transfer": moved} if k == 0 \
                    else {"sample": 0.0, "gather": 0.0, "transfer": 0.0}
                yield Batch(index, s, self.split(s, part), self.label(s), times)


    def _transfer(self, feats: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Features to the device and the seconds the copy took: on CUDA an asynchronous copy
        from pinned memory, timed by CUDA events around it (its enqueue returns at once)."""
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            feats = feats.to(self.device)
            return feats, time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        feats = feats.to(self.device, non_blocking=True)
        end.record()
        end.synchronize()
        return feats, start.elapsed_time(end) / 1e3


class MmapLoader(_Batches):
    name = "mmap"

    def __init__(self, store: FeatureStore, graph: Graph, labels: np.ndarray, *,
                 budget: MemoryBudget, **kw):
        super().__init__(store, graph, labels, **kw)
        self.budget = budget

    def setup(self) -> dict:
        return self.budget.as_dict()

    def batches(self, seeds: np.ndarray):
        for index, chunk in enumerate(np.array_split(seeds, max(1, -(-len(seeds) // self.batch_size)))):
            t0 = time.perf_counter()
            s = self.draw(index, chunk)
            rows = self.rows_of(s)
            sampled = time.perf_counter() - t0
            u0 = time.perf_counter()
            self.budget.before_step()  # the measurement's work, not the loader's
            t1 = time.perf_counter()
            feats = torch.from_numpy(self.budget.gather(rows))
            gathered = time.perf_counter() - t1
            self.budget.after_step(rows)
            untimed = (t1 - u0) + (time.perf_counter() - t1 - gathered)
            t2 = time.perf_counter()
            feats = feats.to(self.device)
            moved = time.perf_counter() - t2
            yield Batch(index, s, self.split(s, feats), self.label(s),
                        {"sample": sampled, "gather": gathered, "transfer": moved}, untimed)

    def close(self) -> None:
        self.budget.close()


# ------------------------------------------------------------------ the mmap baseline's memory


ROOM_FLOOR = 64 << 20  # below this a memory cgroup cannot reclaim mapped pages fast enough


class MemoryBudget:
    """Host memory the mmap baseline may cache the store in, enforced and measured. Enforced by
    a memory cgroup where this process may create one and the budget is at least ROOM_FLOOR (the
    gathers run in a small server process whose cgroup holds its own needs plus the budget),
    else by evicting the least recently gathered rows beyond the budget before every step.
    Measured after every step: the store's pages in the page cache (mincore) may exceed the
    budget by that step's rows at most; `enforced` says whether they ever did."""

    def __init__(self, store: FeatureStore, budget_bytes: int, *, prefer_cgroup: bool = True):
        self.store, self.budget = store, budget_bytes
        self.mode = "evict"
        self.detail = ("the least recently gathered rows beyond the budget evicted before every "
                       "step")
        self.steps = self.over = self.max_resident = 0
        self._server = self._lru = None
        self._pages = None  # residency after the last step
        if prefer_cgroup:
            why = self._start_server()
            if why:
                self.detail += f" (no memory cgroup: {why})"
        if self._server is None:
            self._lru = _LruEviction(store, budget_bytes)

    @property
    def cgroup(self) -> Path | None:
        """The memory cgroup the gathers run in (cgroup mode), removed on close."""
        return self._server.cgroup if self._server is not None else None

    @property
    def enforced(self) -> bool:
        """Every step measured stayed within the budget plus its own rows."""
        return self.steps > 0 and self.over == 0

    def as_dict(self) -> dict:
        return {"mode": self.mode, "memory_bytes": self.budget, "detail": self.detail,
                "steps_measured": self.steps, "max_resident_bytes": self.max_resident,
                "steps_over_budget": self.over}

    def before_step(self) -> None:
        if self._lru is not None:  # from what the last step left resident (measured then)
            self._lru.evict(self._pages)

    def after_step(self, rows: np.ndarray) -> None:
        # the store's pages in the page cache now, whoever brought them in
        self._pages = engine.page_residency(str(self.store.path))
        resident = int(self._pages.sum()) * mmap.PAGESIZE
        self.steps += 1
        self.max_resident = max(self.max_resident, resident)
        if resident > self.budget + len(np.unique(rows)) * self.store.row_stride:
            self.over += 1

    def gather(self, rows: np.ndarray) -> np.ndarray:
        if self._server is None:
            return self._lru.gather(rows)
        return self._server.gather(rows)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._lru is not None:
            self._lru.close()
            self._lru = None

    def _start_server(self) -> str | None:
        if self.budget < ROOM_FLOOR:
            return (f"a cgroup needs at least {ROOM_FLOOR >> 20} MiB of room to reclaim mapped "
                    f"pages in time, the budget is {self.budget >> 20} MiB")
        group = _memory_cgroup()
        if group is None:
            return "this process has no memory cgroup it may create children in"
        try:
            self._server = _GatherServer(self.store, group, self.budget)
        except OSError as e:
            return f"{e.strerror or e}"
        self.mode = "cgroup"
        self.detail = (f"gathers run in a process whose memory cgroup {self._server.cgroup} is "
                       f"limited to {self._server.limit} bytes: its own {self._server.base} "
                       f"plus the budget")
        return None


class _LruEviction:
    """The budget without a cgroup: the store mapped here (random access, no readahead); before
    every step the rows the page cache holds beyond the budget are evicted, least recently
    gathered first: unmapped from this process, then dropped from the page cache."""

    def __init__(self, store: FeatureStore, budget: int):
        if store.row_stride % mmap.PAGESIZE:
            raise QualError(errno.EINVAL, f"rows of {store.row_stride} bytes are not whole "
                            f"{mmap.PAGESIZE}-byte pages", target=str(store.path))
        self.store, self.keep = store, budget // store.row_stride
        self.fd = os.open(store.path, os.O_RDONLY | os.O_CLOEXEC)
        self.map = mmap.mmap(self.fd, store.rows * store.row_stride, prot=mmap.PROT_READ)
        self.map.madvise(mmap.MADV_RANDOM)
        self.used = np.zeros(store.rows, dtype=np.int64)  # the step each row was last gathered
        self.clock = 0

    def gather(self, rows: np.ndarray) -> np.ndarray:
        self.clock += 1
        self.used[rows] = self.clock
        raw = np.frombuffer(self.map, dtype=np.uint8).reshape(self.store.rows, self.store.row_stride)
        return raw[rows, :self.store.row_bytes].view(np.float32)

    def evict(self, resident: np.ndarray | None) -> None:
        """Evict down to the budget, from the store's page residency (measured now if None)."""
        stride = self.store.row_stride
        if resident is None:
            resident = engine.page_residency(str(self.store.path))
        pages = resident[:self.store.rows * stride // mmap.PAGESIZE]
        held = np.flatnonzero(pages.reshape(self.store.rows, -1).any(axis=1))
        excess = len(held) - self.keep
        if excess <= 0:
            return
        victims = np.sort(held[np.argsort(self.used[held], kind="stable")[:excess]])
        for run in np.split(victims, np.flatnonzero(np.diff(victims) != 1) + 1):
            at, length = int(run[0]) * stride, len(run) * stride
            self.map.madvise(mmap.MADV_DONTNEED, at, length)
            os.posix_fadvise(self.fd, at, length, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def _memory_cgroup() -> tuple[str, Path] | None:
    """(version, folder) of this process's memory cgroup, if it may create a child there."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (folder / "memory.limit_in_bytes").exists() and os.access(folder, os.W_OK):
                return "v1", folder
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            folder = Path("/sys/fs/cgroup") / path.lstrip("/")
            ctl = folder / "cgroup.subtree_control"
            if ctl.exists() and "memory" in ctl.read_text().split() and os.access(folder, os.W_OK):
                return "v2", folder
    return None


class _GatherServer:
    """A child process in its own memory cgroup that fancy-indexes the memory-mapped store
    into shared memory: the page cache it fills is charged to that cgroup and capped by it."""

    def __init__(self, store: FeatureStore, group: tuple[str, Path], budget: int):
        version, parent = group
        self.cgroup = parent / f"qual-mmap-{os.getpid()}-{id(self)}"
        self.cgroup.mkdir()
        limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"
        usage_file = "memory.usage_in_bytes" if version == "v1" else "memory.current"
        self.rows_cap, self.rows = 0, store.rows
        self.shm_rows = self.shm_out = None
        procs = str(self.cgroup / "cgroup.procs")
        # its stderr is a file of its own, not the user's: a server stuck on storage that
        # stopped answering cannot exit, and would hold the user's pipe open (ARCHITECTURE §4)
        errors = tempfile.TemporaryFile()
        dies = watchdog.dies_with_me()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qual.workloads.gnn.mmap_server", str(store.path),
             str(store.rows), str(store.row_stride), str(store.row_bytes), str(FEATURE_DIM)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            preexec_fn=lambda: (dies(), Path(procs).write_text(str(os.getpid()))))
        if self.proc.stdout.readline().strip() != b"ready":
            self.close()
            errors.seek(0)
            said = errors.read().decode(errors="replace").strip().splitlines()
            raise OSError(errno.EIO, "the gather server did not start" +
                          (f": {said[-1]}" if said else ""))
        errors.close()
        store.drop_cache()  # cached pages are charged elsewhere: the server starts cold
        self.base = int((self.cgroup / usage_file).read_text())
        self.limit = self.base + budget
        (self.cgroup / limit_file).write_text(str(self.limit))

    def gather(self, rows: np.ndarray) -> np.ndarray:
        n = len(rows)
        if n and (rows.min() < 0 or rows.max() >= self.rows):
            raise QualError(errno.EINVAL, "rows outside the store", target=str(self.cgroup))
        if n > self.rows_cap:
            self._grow(n)
        np.ndarray((n,), dtype=np.int64, buffer=self.shm_rows.buf)[:] = rows
        self.proc.stdin.write(struct.pack("<q", n))
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != b"ok":
            raise QualError(errno.EIO, "the mmap gather server failed (killed for memory?)",
                            target=str(self.cgroup))
        out = np.ndarray((n, FEATURE_DIM), dtype=np.float32, buffer=self.shm_out.buf)
        return out.copy()

    def _grow(self, n: int) -> None:
        cap = max(n, 2 * self.rows_cap)
        for shm in (self.shm_rows, self.shm_out):
            if shm is not None:
                shm.close()
                shm.unlink()
        # created and first touched here, so their pages are charged to this process, not
        # to the server's budget
        self.shm_rows = shared_memory.SharedMemory(create=True, size=cap * 8)
        self.shm_out = shared_memory.SharedMemory(create=True, size=cap * FEATURE_DIM * 4)
        np.ndarray((cap * FEATURE_DIM,), dtype=np.float32, buffer=self.shm_out.buf).fill(0)
        self.proc.stdin.write(struct.pack("<q", -cap) + self.shm_rows.name.encode().ljust(64)
                              + self.shm_out.name.encode().ljust(64))
        self.proc.stdin.flush()
        self.rows_cap = cap

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for shm in (self.shm_rows, self.shm_out):
            if shm is not None:
                shm.close()
                shm.unlink()
        # the server's exit reaches the cgroup's accounting a moment after wait() returns
        for attempt in range(50):
            try:
                self.cgroup.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if attempt == 49:
                    raise QualError(e.errno or errno.EBUSY, f"the mmap baseline's memory cgroup "
                                    f"cannot be removed ({e.strerror}): rmdir it by hand",
                                    target=str(self.cgroup)) from e
                time.sleep(0.02)

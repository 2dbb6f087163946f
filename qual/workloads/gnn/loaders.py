"""The two feature loaders the GNN suite compares, yielding the same batches for the same seeds:

- GIDS-style (seeds 000/002): the native software page cache over the feature store, a window
  of batches sampled ahead whose pages stay pinned, a storage access accumulator that merges
  batches until enough reads are outstanding, and a constant CPU buffer of the hottest rows.
- DGL-style mmap baseline: np.memmap of the same store, fancy-indexed on the CPU, under a
  host-memory budget (a memory cgroup where the machine allows, else the store's pages
  evicted before every measured step).
"""

from __future__ import annotations

import collections
import errno
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import torch

from qual import engine
from qual.engine import QualError
from qual.workloads.gnn.graph import Graph, Sample, sample
from qual.workloads.gnn.igbh import FEATURE_DIM, NODE_TYPES
from qual.workloads.gnn.store import FeatureStore


def accumulator_threshold(bandwidth: float, ssd_latency: float, system_latency: float,
                          ssds: int, page_size: int, p: float = 0.95) -> int:
    """Node accesses to keep outstanding for fraction p of peak (GIDS
    set_required_storage_access): p * bw * 1024 / page * (l_ssd + l_system) * ssds / (1 - p),
    with bw in GB/s and latencies in microseconds. Defaults 5.8 GB/s, 11 + 20 us, 1 SSD,
    4 KiB give 854 (reference/gids-bam-igb.md §2.4)."""
    return int(p * bandwidth / 1e9 * 1024 / page_size * (ssd_latency + system_latency) * 1e6
               * ssds / (1 - p))


@dataclass
class Batch:
    index: int
    sample: Sample
    x: dict          # node type -> features of the sample's outermost nodes (a tensor)
    y: torch.Tensor  # labels of the seeds
    times: dict = field(default_factory=dict)  # stage -> seconds spent producing this batch


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


class GidsLoader(_Batches):
    name = "gids"

    def __init__(self, store: FeatureStore, graph: Graph, labels: np.ndarray, *,
                 cache_pages: int, window: int, threshold: int, cpu_rows: np.ndarray | None,
                 queue_depth: int = 128, max_coalesce: int = 32, backend: str = "auto", **kw):
        super().__init__(store, graph, labels, **kw)
        self.cache = engine.FeatureCache(str(store.path), rows=store.rows,
                                         row_bytes=store.row_bytes, row_stride=store.row_stride,
                                         page_size=store.page_size, capacity_pages=cache_pages,
                                         queue_depth=queue_depth, max_coalesce=max_coalesce,
                                         backend=backend)
        self.window, self.threshold = window, threshold
        self.cpu_rows = 0
        if cpu_rows is not None and len(cpu_rows):
            buf = torch.empty((len(cpu_rows), FEATURE_DIM), dtype=torch.float32,
                              pin_memory=self.device.type == "cuda")
            self.cache.set_cpu_buffer(cpu_rows, buf.numpy())
            self._cpu_buffer = buf
            self.cpu_rows = len(cpu_rows)

    def close(self) -> None:
        self.cache.close()

    def batches(self, seeds: np.ndarray):
        ahead: collections.deque = collections.deque()  # sampled, rows pinned in the window
        try:
            yield from self._batches(seeds, ahead)
        finally:  # stopped early (or done): nothing sampled ahead stays pinned
            if self.window:
                for _, _, rows in ahead:
                    self.cache.window(rows, -1)

    def _batches(self, seeds: np.ndarray, ahead: collections.deque):
        chunks = iter(enumerate(np.array_split(seeds, max(1, -(-len(seeds) // self.batch_size)))))
        cpu_per_batch = 0.0
        done = False
        while True:
            t0 = time.perf_counter()
            while not done and len(ahead) < max(1, self.window):
                nxt = next(chunks, None)
                if nxt is None:
                    done = True
                    break
                s = self.draw(*nxt)
                rows = self.rows_of(s)
                if self.window:
                    self.cache.window(rows, +1)
                ahead.append((nxt[0], s, rows))
            if not ahead:
                return
            # the accumulator: merge batches until the accesses that will reach storage cover
            # the outstanding-request threshold (raised by what the CPU buffer absorbs)
            group = [ahead.popleft()]
            pending = len(group[0][2]) - cpu_per_batch
            while pending < self.threshold and (ahead or not done):
                if not ahead:
                    nxt = next(chunks, None)
                    if nxt is None:
                        done = True
                        break
                    s = self.draw(*nxt)
                    rows = self.rows_of(s)
                    if self.window:
                        self.cache.window(rows, +1)
                    ahead.append((nxt[0], s, rows))
                group.append(ahead.popleft())
                pending += len(group[-1][2]) - cpu_per_batch
            sampled = time.perf_counter() - t0
            rows = np.concatenate([r for _, _, r in group])
            feats = torch.empty((len(rows), FEATURE_DIM), dtype=torch.float32,
                                pin_memory=self.device.type == "cuda")
            before = self.cache.stats().cpu_hits
            t1 = time.perf_counter()
            self.cache.gather(rows, feats.numpy())
            gathered = time.perf_counter() - t1
            cpu_per_batch = (self.cache.stats().cpu_hits - before) / len(group)
            if self.window:
                for _, _, r in group:
                    self.cache.window(r, -1)
            t2 = time.perf_counter()
            feats = feats.to(self.device, non_blocking=True)  # overlaps the next gather on CUDA
            moved = time.perf_counter() - t2
            at = 0
            for k, (index, s, r) in enumerate(group):
                part = feats[at:at + len(r)]
                at += len(r)
                times = {"sample": sampled, "gather": gathered, "transfer": moved} if k == 0 \
                    else {"sample": 0.0, "gather": 0.0, "transfer": 0.0}
                yield Batch(index, s, self.split(s, part), self.label(s), times)


class MmapLoader(_Batches):
    name = "mmap"

    def __init__(self, store: FeatureStore, graph: Graph, labels: np.ndarray, *,
                 budget: MemoryBudget, **kw):
        super().__init__(store, graph, labels, **kw)
        self.budget = budget

    def batches(self, seeds: np.ndarray, measured: bool = True):
        for index, chunk in enumerate(np.array_split(seeds, max(1, -(-len(seeds) // self.batch_size)))):
            t0 = time.perf_counter()
            s = self.draw(index, chunk)
            rows = self.rows_of(s)
            sampled = time.perf_counter() - t0
            self.budget.before_step()
            t1 = time.perf_counter()
            feats = torch.from_numpy(self.budget.gather(rows))
            gathered = time.perf_counter() - t1
            t2 = time.perf_counter()
            feats = feats.to(self.device)
            moved = time.perf_counter() - t2
            yield Batch(index, s, self.split(s, feats), self.label(s),
                        {"sample": sampled, "gather": gathered, "transfer": moved})

    def close(self) -> None:
        self.budget.close()


# ------------------------------------------------------------------ the mmap baseline's memory


class MemoryBudget:
    """Host memory the mmap baseline may cache the store in. In a memory cgroup (where this
    process may create one) the gathers run in a small server process whose cgroup holds its
    own needs plus the budget; elsewhere the store's pages are evicted before every step."""

    def __init__(self, store: FeatureStore, budget_bytes: int, *, prefer_cgroup: bool = True):
        self.store, self.budget = store, budget_bytes
        self.mode, self.detail = "evict", "store pages evicted before every measured step"
        self._mm = store.memmap()
        self._server = None
        if prefer_cgroup:
            why = self._start_server()
            if why:
                self.detail += f" (no memory cgroup: {why})"

    def as_dict(self) -> dict:
        return {"mode": self.mode, "budget_bytes": self.budget, "detail": self.detail}

    def before_step(self) -> None:
        if self.mode == "evict":
            self.store.drop_cache()

    def gather(self, rows: np.ndarray) -> np.ndarray:
        if self._server is None:
            return self._mm[rows]
        return self._server.gather(rows)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._mm = None  # unmap the store

    def _start_server(self) -> str | None:
        group = _memory_cgroup()
        if group is None:
            return "this process has no memory cgroup it may create children in"
        try:
            self._server = _GatherServer(self.store, group, self.budget)
        except OSError as e:
            return f"{e.strerror or e}"
        self.mode = "cgroup"
        room = self._server.room
        self.detail = (f"gathers run in a process whose memory cgroup {self._server.cgroup} is "
                       f"limited to {self._server.limit} bytes: its own {self._server.base} "
                       f"plus {room}" + (f" (the budget raised to the {ROOM_FLOOR >> 20} MiB "
                                        "floor)" if room > self.budget else " (the budget)"))
        return None


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


ROOM_FLOOR = 64 << 20


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
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qual.workloads.gnn.mmap_server", str(store.path),
             str(store.rows), str(store.row_stride), str(store.row_bytes), str(FEATURE_DIM)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            preexec_fn=lambda: Path(procs).write_text(str(os.getpid())))
        if self.proc.stdout.readline().strip() != b"ready":
            self.close()
            raise OSError(errno.EIO, "the gather server did not start")
        store.drop_cache()  # cached pages are charged elsewhere: the server starts cold
        self.base = int((self.cgroup / usage_file).read_text())
        # below a few tens of MiB of room the kernel cannot reclaim mapped pages fast enough
        # and kills the server instead: the budget is raised to that floor, and says so
        self.room = max(budget, ROOM_FLOOR)
        self.limit = self.base + self.room
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
        try:
            self.cgroup.rmdir()
        except OSError:
            pass

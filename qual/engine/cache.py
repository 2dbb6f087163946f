"""GNN feature loading: neighbour sampling and the BaM/GIDS-style software page cache."""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import numpy as np

from qual.engine._binding import BACKEND_CODE, EngineThread, check, check_outcome, long_call
from qual.engine._binding import ffi, lib

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
        o.max_coalesce, o.backend, o.direct = max_coalesce, BACKEND_CODE[backend], int(direct)
        out = ffi.new("struct qual_fcache **")
        check(lib.qual_fcache_open(o, out), op="open", target=path)
        self._c = ffi.gc(out[0], lib.qual_fcache_close)
        self.path, self.row_bytes = path, row_bytes
        self._cpu_buffer = None
        # every gather on one thread: the cache's ring is made once, for it
        self._thread = EngineThread("qual-gather")
        weakref.finalize(self, self._thread.close)

    @property
    def closed(self) -> bool:
        return self._c is None

    def close(self) -> None:
        if self._c is not None:
            ffi.release(self._c)  # runs qual_fcache_close now, not at garbage collection
            self._c = None
            self._thread.close()

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
        check_outcome(long_call(lambda: lib.qual_fcache_gather(self._c, crows, len(rows), cout, ctl),
                                ctl, (crows, cout), None, 0.5, self._thread),
                      op="read", target=self.path)

    def probe(self, rows: np.ndarray) -> int:
        """Storage requests a gather of these rows would make now (pages not cached and not in
        the CPU buffer, each counted once)."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        out = ffi.new("uint64_t *")
        check(lib.qual_fcache_probe(self._c, ffi.from_buffer("int64_t[]", rows), len(rows), out),
              op="probe", target=self.path)
        return int(out[0])

    def drop(self) -> None:
        """Empty the cache: the next gather reads every page it wants from the store."""
        check(lib.qual_fcache_drop(self._c), op="drop", target=self.path)

    def stats(self, reset: bool = False) -> CacheStats:
        st = ffi.new("struct qual_fcache_stats *")
        check(lib.qual_fcache_stats(self._c, st, int(reset)))
        return CacheStats(accesses=st.accesses, hits=st.hits, misses=st.misses,
                          cpu_hits=st.cpu_hits, reads=st.reads, read_bytes=st.read_bytes,
                          evictions=st.evictions, pinned_evictions=st.pinned_evictions,
                          writes=st.writes,
                          pinned_pages=st.pinned_pages, io_s=st.io_ns / 1e9)

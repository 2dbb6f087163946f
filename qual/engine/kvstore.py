"""A KV-cache store's I/O: whole entries written to and read from given offsets of one store (a
file qual made, or a block device that passed the guard), straight from and into the caller's
memory, each entry's latency kept (struct qual_kv, native/src/kv.c)."""

from __future__ import annotations

import errno as errno_mod
import os
from dataclasses import dataclass

import numpy as np

from qual.engine._binding import (BACKEND_CODE, BACKEND_NAME, BACKENDS, OP_CODE, check,
                                  fill_faults, new_ctl, ns)
from qual.engine._binding import ffi, lib
from qual.engine.job import Fault
from qual.errors import InvalidJob


@dataclass(frozen=True)
class KvBatch:
    """What one batch of entries took: bytes moved, every entry's latency and start (its first
    piece handed over, from the batch's start; seconds, in the order given), the batch's I/O
    time and, for writes, its fdatasync."""

    op: str
    backend: str
    bytes: int
    latencies: np.ndarray
    starts: np.ndarray
    io_s: float
    sync_s: float

    @property
    def elapsed(self) -> float:
        return self.io_s + self.sync_s


class KvStore:
    """One store opened for reading and writing (O_DIRECT unless direct=False), its queue kept
    between batches. Entries are (offset, buffer) pairs, or (offset, buffer, bytes) where the
    entry is longer than its buffer and the buffer repeats (a whole number of block_size);
    offsets, lengths and buffers must be aligned to `align` (engine.aligned_empty gives such
    buffers). unique=True: writes move the store's own random bytes, not the entries' buffers,
    each 4 KiB stamped with `stamp` (default: drawn from os.urandom) and a counter, so that no
    two 4 KiB blocks the store writes are alike."""

    def __init__(self, path: str, *, block_size: int = 1 << 20, queue_depth: int = 8,
                 align: int = 4096, direct: bool = True, backend: str = "auto",
                 command_timeout: float | None = None, faults: tuple[Fault, ...] = (),
                 unique: bool = False, stamp: int | None = None):
        if backend not in BACKENDS:
            raise InvalidJob(errno_mod.EINVAL, f"backend {backend!r} is not one of "
                             f"{', '.join(BACKENDS)}")
        self.path, self.align = path, align
        o = ffi.new("struct qual_kv_opts *")
        o.backend, o.direct, o.align = BACKEND_CODE[backend], int(direct), align
        o.block_size, o.queue_depth = block_size, queue_depth
        o.command_timeout_ns = ns(command_timeout) if command_timeout else 0
        self._faults = ffi.new("struct qual_fault[]", len(faults)) if faults else ffi.NULL
        if faults:
            fill_faults(self._faults, faults)
        o.faults, o.nfaults = self._faults, len(faults)
        o.unique = int(unique)
        o.stamp = int.from_bytes(os.urandom(8), "little") if stamp is None else stamp
        out = ffi.new("struct qual_kv **")
        check(lib.qual_kv_open(os.fsencode(path), o, out), op="open", target=path)
        self._kv = ffi.gc(out[0], lib.qual_kv_close)
        code = ffi.new("int *")
        check(lib.qual_kv_backend(self._kv, code))
        self.backend = BACKEND_NAME[code[0]]
        self.ctl = new_ctl()

    def write(self, entries) -> KvBatch:
        """Write every entry, then make them durable (one fdatasync)."""
        return self._run("write", entries)

    def read(self, entries) -> KvBatch:
        """Read every entry into its buffer."""
        return self._run("read", entries)

    def _run(self, op: str, entries) -> KvBatch:
        n = len(entries)
        cent = ffi.new("struct qual_kv_entry[]", max(1, n))
        views = []
        for c, (offset, buf, *length) in zip(cent, entries):
            view = ffi.from_buffer(buf, require_writable=op == "read")
            views.append(view)
            c.offset, c.buf, c.buf_len = offset, ffi.cast("void *", view), len(view)
            c.len = length[0] if length else len(view)
        lat = np.zeros(max(1, n), dtype=np.uint64)
        start = np.zeros(max(1, n), dtype=np.uint64)
        res = ffi.new("struct qual_kv_result *")
        check(lib.qual_kv_run(self._kv, OP_CODE[op], cent, n,
                              ffi.cast("uint64_t *", ffi.from_buffer(lat)),
                              ffi.cast("uint64_t *", ffi.from_buffer(start)), self.ctl, res),
              op=op, target=self.path)
        return KvBatch(op=op, backend=self.backend, bytes=int(res.bytes),
                       latencies=lat[:n] / 1e9, starts=start[:n] / 1e9, io_s=res.io_ns / 1e9,
                       sync_s=res.sync_ns / 1e9)

    def close(self) -> None:
        if self._kv is not None:
            ffi.release(self._kv)
            self._kv = None

    def __enter__(self) -> "KvStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Sample files: whole-file reads as a training data loader's read thread does them, or the
ranges of a columnar file that hold the columns it wants."""

from __future__ import annotations

import os
import errno as errno_mod

from qual.engine._binding import BACKEND_CODE, BACKEND_NAME, BACKENDS, check, fill_faults, new_ctl
from qual.engine._binding import ffi, lib
from qual.errors import InvalidJob
from qual.engine.job import Fault

class Ranges:
    """Parts of a file to read, as the reader takes them: (offset, bytes) pairs widened to the
    alignment (O_DIRECT reads whole logical blocks, as a direct reader of a parquet file must)
    and merged where they touch. `nbytes`: what they cover."""

    def __init__(self, ranges, align: int):
        merged: list[list[int]] = []
        for offset, nbytes in sorted(ranges):
            lo, hi = offset // align * align, -(-(offset + nbytes) // align) * align
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            elif hi > lo:
                merged.append([lo, hi])
        self.c = ffi.new("struct qual_range[]", max(1, len(merged)))
        for c, (lo, hi) in zip(self.c, merged):
            c.offset, c.nbytes = lo, hi - lo
        self._n = len(merged)
        self.nbytes = sum(hi - lo for lo, hi in merged)

    def __len__(self) -> int:
        return self._n


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
        o.backend, o.direct, o.align = BACKEND_CODE[backend], int(direct), align
        o.block_size, o.queue_depth = block_size, queue_depth
        self._faults = ffi.new("struct qual_fault[]", len(faults)) if faults else ffi.NULL
        if faults:
            fill_faults(self._faults, faults)
        o.faults, o.nfaults = self._faults, len(faults)
        out = ffi.new("struct qual_reader **")
        check(lib.qual_reader_open(o, out), op="open")
        self._r = ffi.gc(out[0], lib.qual_reader_close)
        code = ffi.new("int *")
        check(lib.qual_reader_backend(self._r, code))
        self.backend = BACKEND_NAME[code[0]]
        self.ctl = ctl if ctl is not None else new_ctl()
        self._bytes = ffi.new("uint64_t *")

    def read(self, path: str, ranges=None) -> int:
        """Read the whole file, or only `ranges` of it (a Ranges: a columnar file's chunks of
        the columns wanted); returns the bytes read."""
        if ranges is None:
            rc = lib.qual_reader_read(self._r, os.fsencode(path), self.ctl, self._bytes)
        else:
            rc = lib.qual_reader_read_ranges(self._r, os.fsencode(path), ranges.c, len(ranges),
                                             self.ctl, self._bytes)
        check(rc, op="read", target=path)
        return int(self._bytes[0])

    def close(self) -> None:
        if self._r is not None:
            ffi.release(self._r)
            self._r = None

"""Checkpoint files: tensor bytes in CRC-checked chunks, written durably and read back."""

from __future__ import annotations

import os
from dataclasses import dataclass

from qual.engine._binding import (
    BACKEND_CODE, BACKEND_NAME, Progress, fill_faults, long_call, raise_result)
from qual.engine._binding import ffi, lib

@dataclass(frozen=True)
class FileResult:
    """What writing or reading one checkpoint file took (a write includes fdatasync)."""

    path: str
    backend: str
    bytes: int
    zero_copy_bytes: int  # of which moved straight from (into) the tensors' memory
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
    cf.path, cf.backend, cf.direct, cf.align = cpath, BACKEND_CODE[backend], int(direct), align
    cf.chunk_size, cf.queue_depth, cf.file_size = chunk_size, queue_depth, file_size
    cf.spans, cf.nspans = cspans, len(spans)
    cf.crcs, cf.ncrcs = crcs, len(crcs)
    keep = [cpath, cspans, views, crcs]
    if faults:
        cfaults = ffi.new("struct qual_fault[]", len(faults))
        fill_faults(cfaults, faults)
        cf.faults, cf.nfaults = cfaults, len(faults)
        keep.append(cfaults)
    return cf, keep


def chunk_count(file_size: int, chunk_size: int) -> int:
    return -(-file_size // chunk_size)


def _file_result(res, path: str) -> FileResult:
    return FileResult(path=path, backend=BACKEND_NAME[res.backend], bytes=int(res.bytes),
                      zero_copy_bytes=int(res.zero_copy_bytes),
                      elapsed=res.elapsed_ns / 1e9, sync=res.sync_ns / 1e9,
                      cpu_user=res.cpu_user_s, cpu_sys=res.cpu_sys_s)


def write_checkpoint_file(path: str, spans, file_size: int, *, chunk_size: int = 8 << 20,
                          queue_depth: int = 8, align: int = 4096, backend: str = "auto",
                          direct: bool = True, faults=(), progress: Progress | None = None
                          ) -> tuple[list[int], FileResult]:
    """Create `path` holding each (offset, buffer) span at its offset, zeros between, written
    in chunks with a CRC32C each and made durable. Returns the chunk CRCs and the timing."""
    crcs = ffi.new("uint32_t[]", chunk_count(file_size, chunk_size))
    result = _run_file("write", path, spans, file_size, crcs, chunk_size=chunk_size,
                       queue_depth=queue_depth, align=align, backend=backend, direct=direct,
                       faults=faults, progress=progress)
    return list(crcs), result  # filled by the write


def read_checkpoint_file(path: str, spans, file_size: int, crcs, *, chunk_size: int = 8 << 20,
                         queue_depth: int = 8, align: int = 4096, backend: str = "auto",
                         direct: bool = True, faults=(), progress: Progress | None = None
                         ) -> FileResult:
    """Read `path` back into the (offset, writable buffer) spans, checking every chunk's CRC;
    a mismatch raises DataMismatch naming the bytes."""
    return _run_file("read", path, spans, file_size, ffi.new("uint32_t[]", list(crcs)),
                     chunk_size=chunk_size, queue_depth=queue_depth, align=align,
                     backend=backend, direct=direct, faults=faults, progress=progress)


def _run_file(op: str, path: str, spans, file_size: int, crcs, *, progress, **opts) -> FileResult:
    """One checkpoint file written (filling `crcs`) or read back (checking them), as one
    engine call."""
    cf, keep = _ckpt_file(path, spans, file_size, crcs, writable=op == "read", **opts)
    run = lib.qual_ckpt_write if op == "write" else lib.qual_ckpt_read
    ctl, res = ffi.new("struct qual_ctl *"), ffi.new("struct qual_ckpt_result *")
    long_call(lambda: run(cf, ctl, res), ctl, (cf, res, keep), progress, 0.5)
    raise_result(res, path, op)
    return _file_result(res, path)

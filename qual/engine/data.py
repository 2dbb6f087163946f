"""Data helpers and machine facts: CRC32C, the verification pattern, incompressible bytes,
io_uring's availability, the kernel's direct-I/O alignment and a file's page-cache residency."""

from __future__ import annotations

import errno as errno_mod
import mmap
import os

import numpy as np

from qual.engine._binding import check, ffi, lib


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


def aligned_empty(nbytes: int, align: int = 4096) -> np.ndarray:
    """nbytes of uninitialised memory starting on an `align` boundary, as a trainer's pinned
    buffers do: checkpoint chunks inside it move with no staging copy."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes]


def page_residency(path: str) -> np.ndarray:
    """Which of a file's pages (the system's page size) the page cache holds now, as bools."""
    pages = -(-os.stat(path).st_size // mmap.PAGESIZE)
    vec = np.zeros(pages, dtype=np.uint8)
    check(lib.qual_page_residency(os.fsencode(path), pages, ffi.from_buffer("uint8_t[]", vec)),
          op="mincore", target=path)
    return (vec & 1).astype(bool)


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

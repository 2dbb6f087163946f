"""Data integrity: verification blocks written, read back and classified."""

from __future__ import annotations

import errno as errno_mod
import os
from dataclasses import dataclass

from qual.engine._binding import (
    BACKEND_CODE, BACKEND_NAME, BACKENDS, OPS, Progress, check, check_outcome, fill_faults,
    long_call)
from qual.engine._binding import ffi, lib
from qual.errors import InvalidJob, errno_name
from qual.engine.job import Fault

BLOCK_KINDS = {1: "corrupted", 2: "foreign", 3: "misdirected", 4: "stale", 5: "unreadable"}


@dataclass(frozen=True)
class BadBlock:
    """A verification block that did not read back as written (struct qual_bad_block)."""

    offset: int
    kind: str           # corrupted | foreign | misdirected | stale | unreadable
    found_offset: int   # what its header says (corrupted, unreadable: nothing to say, 0)
    found_seed: int
    found_seq: int
    error: int = 0      # unreadable: the errno the drive answered the read with

    def describe(self) -> str:
        what = {"unreadable": f"the drive answered its read with {errno_name(self.error)} "
                              f"({os.strerror(self.error)})",
                "corrupted": "its bytes fail their CRC32C (or carry no header)",
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
                  progress: Progress | None = None, ctl=None) -> VerifyResult:
    """Write verification blocks over [offset, offset + size) with sequence `seq` (op "write",
    durable when it returns), or read them back and classify every block (op "read"). `ctl`
    (engine.new_ctl()): a control block another thread may cancel the pass through."""
    if op not in OPS:
        raise InvalidJob(errno_mod.EINVAL, f"op {op!r} is not one of {', '.join(OPS)}")
    if backend not in BACKENDS:
        raise InvalidJob(errno_mod.EINVAL, f"backend {backend!r} is not one of "
                         f"{', '.join(BACKENDS)}")
    o = ffi.new("struct qual_verify_opts *")
    o.op, o.backend, o.direct = OPS.index(op), BACKEND_CODE[backend], int(direct)
    o.expect.dev, o.expect.ino = expect or (0, 0)
    o.random, o.align, o.block_size, o.queue_depth = int(random), align, block_size, queue_depth
    o.offset, o.size, o.seed, o.seq = offset, size, seed, seq
    cfaults = ffi.new("struct qual_fault[]", len(faults)) if faults else ffi.NULL
    if faults:
        fill_faults(cfaults, faults)
    o.faults, o.nfaults = cfaults, len(faults)
    ctl = ctl if ctl is not None else ffi.new("struct qual_ctl *")
    res = ffi.new("struct qual_verify_result *")
    bad = ffi.new("struct qual_bad_block[]", max(1, max_report))
    cpath = os.fsencode(path)
    outcome = long_call(lambda: lib.qual_verify_run(cpath, o, ctl, res, bad, max_report), ctl,
                    (o, cfaults, res, bad, cpath), progress, 0.5)
    check_outcome(outcome, op=op, target=path)
    return VerifyResult(
        op=op, backend=BACKEND_NAME[res.backend], blocks=int(res.blocks), bytes=int(res.bytes),
        elapsed=res.elapsed_ns / 1e9,
        counts={"corrupted": int(res.corrupted), "foreign": int(res.foreign),
                "misdirected": int(res.misdirected), "stale": int(res.stale),
                "unreadable": int(res.unreadable)},
        bad=tuple(BadBlock(int(b.offset), BLOCK_KINDS[b.kind], int(b.found_offset),
                           int(b.found_seed), int(b.found_seq), -int(b.error))
                  for b in bad[0:res.reported]))


def verify_block(block_size: int, offset: int, seed: int, seq: int) -> bytes:
    """One verification block as the engine writes it (to plant stale or misdirected data)."""
    buf = ffi.new("unsigned char[]", block_size)
    check(lib.qual_verify_fill(buf, block_size, offset, seed, seq))
    return bytes(ffi.buffer(buf, block_size))

"""After a cut: every block of the region read back and judged against the verify state, and
the bytes around the region against what they held before the run.

A block is one atomic write unit (AWUPF, or NAWUPF where the namespace has its own), stamped
with its offset, this run's seed, the sequence of the chunk write that laid it and a CRC32C of
the rest (the engine's verification block). Each chunk has the sequence of its last flushed
write; the chunk whose write was in flight when the power went may hold that or the newer one.
So a block is:
- good: the flushed sequence (in the chunk in flight: found old, informational);
- found new: the in-flight sequence, never flushed (informational);
- torn: its bytes fail their checksum: a unit the drive promised to write whole is part one
  write and part another (or garbage);
- lost: a valid block of an older sequence, of another offset or run, or unreadable, where a
  completed flush covered the newer one.
A byte changed in the guard bands around the region is a block changed outside it."""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass, field

from qual import engine
from qual.errors import errno_name

KINDS = ("lost", "torn", "outside_changed", "unflushed_old", "unflushed_new")


@dataclass
class Check:
    """One verification's counts and the blocks it names (the first `report`, by LBA)."""

    counts: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bad: list[dict] = field(default_factory=list)
    blocks: int = 0

    def name(self, kind: str, lba: int, what: str) -> None:
        self.counts[kind] += 1
        self.bad.append({"kind": kind, "lba": lba, "what": what})

    def as_dict(self, report: int) -> dict:
        bad = sorted(self.bad, key=lambda b: b["lba"])
        return {"blocks": self.blocks, "counts": dict(self.counts), "bad": bad[:report]}


def band_digests(path: str, offset: int, size: int, block: int) -> list[str]:
    """A digest of each `block` bytes of [offset, offset + size), read with O_DIRECT."""
    if size == 0:
        return []
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
    try:
        got = os.preadv(fd, [buf], offset)
        if got != size:
            raise engine.DeviceIoError(5, f"short read of {size} bytes at {offset}: {got}",
                                       op="read", offset=offset, target=path)
        data = buf[:]
        return [hashlib.blake2b(data[i:i + block], digest_size=8).hexdigest()
                for i in range(0, size, block)]
    except OSError as e:
        raise engine.error_for(e.errno)(e.errno, e.strerror, op="read", offset=offset,
                                        target=path) from None
    finally:
        os.close(fd)
        buf.close()


def check_region(path: str, begin: dict, flushed: dict[int, int],
                 writing: tuple[int, int] | None, *, expect, backend: str,
                 queue_depth: int) -> Check:
    """Every block of the region, chunk by chunk (each chunk's flushed sequence is its own),
    and the guard bands."""
    out = Check()
    bs, lba_size, chunk = begin["block"], begin["lba_size"], begin["chunk"]
    for i in range(begin["chunks"]):
        offset = begin["offset"] + i * chunk
        flushed_seq = flushed[i]
        new = writing[1] if writing and writing[0] == i else None
        res = engine.verify_blocks(path, op="read", block_size=bs, queue_depth=queue_depth,
                                   offset=offset, size=chunk, seed=begin["seed"],
                                   seq=flushed_seq, align=lba_size, expect=expect,
                                   backend=backend, max_report=chunk // bs)
        out.blocks += res.blocks
        if new is not None:
            out.counts["unflushed_old"] += res.blocks - res.bad_blocks
        for b in res.bad:
            _judge(out, b, b.offset // lba_size, flushed_seq, new, bs)
    for name, (offset, digests) in begin["bands"].items():
        now = band_digests(path, offset, len(digests) * begin["band_block"],
                           begin["band_block"])
        for i, (was, is_) in enumerate(zip(digests, now)):
            if was != is_:
                at = offset + i * begin["band_block"]
                out.name("outside_changed", at // lba_size,
                         f"changed outside the region (the guard band {name} it): it no "
                         "longer holds what it held before the run's first write")
    return out


def _judge(out: Check, b: engine.BadBlock, lba: int, flushed_seq: int, new: int | None,
           bs: int) -> None:
    expected = f"expected sequence {flushed_seq}" + (f" or {new}" if new is not None else "")
    if b.kind == "stale" and new is not None and b.found_seq == new:
        out.counts["unflushed_new"] += 1
        return
    if b.kind == "corrupted":
        out.name("torn", lba, f"torn inside the atomic write unit ({bs} bytes): its bytes fail "
                 f"their checksum; {expected}")
        return
    read = {"stale": f"read sequence {b.found_seq}",
            "misdirected": f"read the block written for offset {b.found_offset}",
            "foreign": f"read a block of another run (seed {b.found_seed})",
            "unreadable": f"the drive answered its read with {errno_name(b.error)}"}[b.kind]
    covered = "a completed flush covered it" if new is None else \
        "its flushed content is gone"
    out.name("lost", lba, f"lost: {covered}: {expected}, {read}")

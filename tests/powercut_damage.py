"""Damage planted in a drive's backing file between a power cut and the drive's return, where
a drive that broke its promises would leave it (tests/test_powercut.py on a loop device's file,
tests/test_nvme_powercut.py on an emulated namespace's):

- lost: a block a completed flush covered put back to what the chunk's flush before held;
- torn: a block half what it held before that flush and half what the flush wrote;
- outside: a byte changed in the guard band after the region.

Each block is away from the chunk the cut caught in flight (whose blocks may rightly be old or
new), so the verifier must name it and nothing else. Run as a script by a cut command:
`powercut_damage.py STATE IMAGE KIND` writes the planted LBA on stdout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from qual.engine import verify_block
from testbed import overwrite


def flushes(state: Path) -> tuple[dict, dict[int, list[int]], int | None]:
    """The state's layout, every chunk's flushed sequences in order, and the chunk in flight."""
    events = [json.loads(line) for line in state.read_text().splitlines()]
    begin = events[1]
    done: dict[int, list[int]] = {}
    writing = None
    for e in events[2:]:
        if e["event"] == "writing":
            writing = e["chunk"]
        elif e["event"] == "flushed":
            done.setdefault(e["chunk"], []).append(e["seq"])
            writing = None if writing == e["chunk"] else writing
    return begin, done, writing


def plant(state: Path, image: Path, kind: str) -> int:
    """Damage of `kind` written into `image` (the drive's bytes from offset 0), durable; the
    LBA it is at."""
    begin, done, writing = flushes(state)
    bs, lba_size = begin["block"], begin["lba_size"]
    if kind == "outside":
        at = begin["offset"] + begin["size"] + bs  # the band's second block
        data = bytes([_read(image, at, 1)[0] ^ 0xFF])
    else:
        chunk = next(c for c, seqs in sorted(done.items()) if len(seqs) > 1 and c != writing)
        at = begin["offset"] + chunk * begin["chunk"] + 3 * bs  # the chunk's fourth block
        old, new = (verify_block(bs, at, begin["seed"], seq) for seq in done[chunk][-2:])
        data = old if kind == "lost" else old[:bs // 2] + new[bs // 2:]
    overwrite(image, at, data)
    return at // lba_size


def _read(image: Path, at: int, n: int) -> bytes:
    with open(image, "rb") as f:
        f.seek(at)
        return f.read(n)


if __name__ == "__main__":
    print(plant(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))

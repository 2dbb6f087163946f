"""The verify state of a power-cut run, on the host's own disk: one JSON line per event, each
written and fsynced before the run goes on (as the run journal is), so that what a completed
flush covered is known however the power goes, the host's included, and a later run
(`qual run --resume`) verifies the cut the host did not live through.

Events: `begin` (the drive, the layout, this run's stamp seed, the bytes around the region),
`writing` (chunk i with sequence s is about to be written), `flushed` (it was, and a flush
after it completed), `cut` (cycle k's power is being cut), `returned`, `verified` and `end`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from qual.errors import QualError
from qual.targets.scratch import fsync_dir

HEADER = "qual powercut state"


@dataclass
class Replay:
    """What the events say: the layout, each chunk's last flushed sequence, the chunk whose
    write had begun but not been flushed (chunk, sequence), the cycles verified, and the cycle
    whose cut was begun and not verified."""

    begin: dict
    flushed: dict[int, int] = field(default_factory=dict)
    writing: tuple[int, int] | None = None
    cycles: list[dict] = field(default_factory=list)  # each verified cycle's event
    pending_cut: dict | None = None
    returned: dict | None = None
    last_seq: int = 0
    last_chunk: int = -1  # the chunk whose write began last

    @property
    def next_chunk(self) -> int:
        """The chunk the writer goes on with: after the last one it began."""
        return (self.last_chunk + 1) % self.begin["chunks"]


class State:
    """The file; `log(event, **fields)` appends one event and makes it durable."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def start(self, begin: dict) -> None:
        """A new run's state: a file this run makes, or one qual made before (its first line
        says so) replaced; anything else there is refused, untouched."""
        if self.path.exists() and not self._made_by_qual():
            raise QualError(17, f"{self.path} exists and is not a qual powercut state: qual "
                            "replaces only a state it wrote (give another --state)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # appends only: the writer's thread and the run's log events on one descriptor
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND |
                     os.O_CLOEXEC, 0o644)
        self._fd = fd
        self._append({"event": HEADER})
        self.log("begin", **begin)
        fsync_dir(self.path.parent)

    def reopen(self) -> Replay:
        """The state a run left (a host cut's), replayed, and held open for more events."""
        replay = self.replay()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return replay

    def log(self, event: str, **fields) -> None:
        self._append({"event": event, **fields})

    def _append(self, doc: dict) -> None:
        line = (json.dumps(doc, sort_keys=True) + "\n").encode()
        os.write(self._fd, line)
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _made_by_qual(self) -> bool:
        try:
            with open(self.path) as f:
                first = f.readline()
        except OSError:
            return False
        try:
            return json.loads(first).get("event") == HEADER
        except ValueError:
            return False

    def exists(self) -> bool:
        return self.path.exists() and self._made_by_qual()

    def replay(self) -> Replay:
        """Every event in order; a last line cut short (the host died writing it) is dropped,
        since its event was never durable."""
        lines = self.path.read_text().splitlines()
        events = []
        for n, line in enumerate(lines):
            try:
                events.append(json.loads(line))
            except ValueError:
                if n == len(lines) - 1:
                    break
                raise QualError(22, f"{self.path}: line {n + 1} is not JSON") from None
        if not events or events[0].get("event") != HEADER or len(events) < 2 or \
                events[1].get("event") != "begin":
            raise QualError(22, f"{self.path} is not a qual powercut state")
        r = Replay(begin=events[1])
        for e in events[2:]:
            kind = e["event"]
            if kind == "writing":
                r.writing = (e["chunk"], e["seq"])
                r.last_chunk = e["chunk"]
                r.last_seq = max(r.last_seq, e["seq"])
            elif kind == "flushed":
                r.flushed[e["chunk"]] = e["seq"]
                if r.writing == (e["chunk"], e["seq"]):
                    r.writing = None
            elif kind == "cut":
                r.pending_cut, r.returned = e, None
            elif kind == "returned":
                r.returned = e
            elif kind == "verified":
                r.cycles.append({**e, "returned": r.returned})
                r.pending_cut = r.returned = None
        return r

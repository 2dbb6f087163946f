"""The run side of the workload protocol (the family itself is qual.family.Family): `run(target,
settings, *, seed, progress)` returns an `Outcome`, and the outcome gives the measurements, the
`--json` document, the charts and the lines a person reads; `Repeated` is a whole run done the
profile's `repeats` times. Also what every family shares: the I/O backend field, the margin a
fitted dataset leaves, argparse types for sizes, durations and counts."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from qual import units
from qual.engine import BACKENDS
from qual.exits import Exit
from qual.family import Field
from qual.record import Measurement, repeated


FIT_MARGIN = 0.95  # a dataset scaled to fit (--qual-fit) leaves this share of the room used


class Outcome:
    """What one run of a family produced, the one shape every family's `run` returns: its
    measurements (all of them, or one named `section`, where a suite records its parts in
    separate tests: a checkpoint run's passes, restore and torch baseline), the `--json`
    document, charts, the lines a person reads and the exit status. A family's outcome
    overrides `measurements` and `document`; the rest have defaults."""

    def measurements(self, section: str | None = None) -> list[Measurement]:
        raise NotImplementedError

    def document(self) -> dict:
        """The `qual <family> --json` document."""
        raise NotImplementedError

    def charts(self) -> dict[str, bytes]:
        """Charts as PNG bytes by title, attached to the report."""
        return {}

    def lines(self) -> list[str]:
        """What `qual <family>` prints for a person: every measurement with its unit."""
        return [f"{m.id} = {m.shown()}" for m in self.measurements()]

    def exit_status(self) -> int:
        """The CLI's exit status when nothing was judged: 0, or 1 when the run itself found a
        fault (a checkpoint that did not restore, a block that did not read back)."""
        return Exit.PASS


class ResultOutcome(Outcome, dict):
    """An outcome that is the run's own result document (a dict, as rank processes or
    loaders report it, kept whole for tests and records), with the protocol's views of it."""

    def __init__(self, result: dict, *, target):
        dict.__init__(self, result)
        self.target = target


class Repeated(Outcome):
    """A family's whole run repeated (docs/ARCHITECTURE.md §5): every repetition runs all of
    the family's cells (loaders, accelerator counts, checkpoint writes and reads) before the
    next starts, so repetitions interleave across them. Its measurements are each the median of
    the repetitions, with every repetition and the interval in their context; everything else
    (a result's keys, charts, the document) is the last repetition's."""

    def __init__(self, outcomes: list):
        if not outcomes:
            raise ValueError("no repetition ran")
        self.outcomes = list(outcomes)
        self.last = self.outcomes[-1]

    @classmethod
    def run(cls, run: Callable[[], Outcome], repeats: int, progress=None) -> "Repeated":
        outcomes = []
        for r in range(1, repeats + 1):
            if progress and repeats > 1:
                progress(f"repetition {r} of {repeats}")
            outcomes.append(run())
        return cls(outcomes)

    def measurements(self, section: str | None = None) -> list[Measurement]:
        """Every repetition's measurements (or one section of them), as one set of medians."""
        return repeated([o.measurements(section) if section else o.measurements()
                         for o in self.outcomes])

    def document(self) -> dict:
        return self.last.document()

    def charts(self) -> dict[str, bytes]:
        return self.last.charts()

    def exit_status(self) -> int:
        return max(o.exit_status() for o in self.outcomes)

    def __getitem__(self, key):
        return self.last[key]

    def get(self, key, default=None):
        return self.last.get(key, default)


def _argument(parse, text: str, **kw):
    try:
        return parse(text, **kw)
    except units.UnitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive(text: str) -> int:
    """argparse type: a count of at least 1."""
    return _argument(units.parse_count, text, name="value")


def size(text: str) -> int:
    """argparse type: a size with its unit (4k, 128K, 1M)."""
    return _argument(units.parse_size, text)


def duration(text: str) -> float:
    """argparse type: a duration with its unit (10s, 500ms)."""
    return _argument(units.parse_duration, text)


def backend_field() -> Field:
    """The I/O backend, named as fio names it, in every family."""
    return Field("backend", "choice", default="auto", choices=BACKENDS, flag="--ioengine",
                 aliases=("--backend", "--engine"),
                 help="I/O backend (fio's ioengine): io_uring, psync or auto (io_uring where "
                      "it works)")

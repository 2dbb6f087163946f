"""The workload protocol: a family's settings come from its profile table, `run(target,
settings, *, seed, progress)` returns an `Outcome`, and the outcome gives the measurements, the
`--json` document, the charts and the lines a person reads. The CLI, the suites, the run record
and the report know families only through this."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from qual import units
from qual.engine import BACKENDS
from qual.family import Field, Metric, Rates, Work
from qual.record import Measurement, repeated


FIT_MARGIN = 0.95  # a dataset scaled to fit (--qual-fit) leaves this share of the room used


class Progress(Protocol):
    """Where a long run says what it is doing; `done` (0..1) is its share of the whole run,
    from which the CLI shows an ETA."""

    def __call__(self, message: str, done: float | None = None) -> None: ...


class Settings(dict):
    """A family's table, parsed and completed from a profile or from flags: every value has
    its field's type (sizes and counts int, durations float seconds, lists of them); read a
    key as an attribute or an item."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


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
        return 0


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


@dataclass(frozen=True)
class Watcher:
    """A family that watches others (health) instead of running a workload of its own: the
    session starts `start(target, family)` when a suite of a family it `covers(table, family)`
    begins on a target (`table`: the watcher's profile table, or None where the profile has
    none), and adds one test, test_<watcher>, at the end of that suite, which records the
    watch. A watch has `reason` (None, or why nothing can be watched here: the test skips
    saying it), `measurements()`, `charts()` (title -> PNG) and `stop()`."""

    start: Callable[[object, str], object]
    covers: Callable[[dict | None, str], bool] = field(default=lambda table, family: True)


@dataclass(frozen=True)
class Flags:
    """What `qual <family>` does beyond running the table its generated flags make:
    `defaults(given)`: table values a quick run takes where neither a profile nor a flag says
    (a quick run's, not a qualification's); `keeps`: the run always keeps what it made (a
    checkpoint set, its retention its own), so the command has no --keep; `explain(table)`: a
    (document, lines) that `--plan` prints instead of running (the arithmetic, nothing
    written); `shared_target()`: other processes open the target too (torchrun ranks), so this
    one neither locks it nor speaks unless `run` returns an outcome."""

    defaults: Callable[[dict], dict] = field(default=lambda given: {})
    keeps: bool = False
    explain: Callable[[dict], tuple[dict, list[str]]] | None = None
    shared_target: Callable[[], bool] = field(default=lambda: False)


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


@dataclass(frozen=True)
class Family:
    """A workload family: its profile table (fields, checked by `check`, which returns (key,
    problem) pairs), its metrics, the measurement ids a table will produce (`cells`), and how
    it runs (`run`, `remove`: what it made on a target, nothing else). `suite` is its suite
    file when it is not one of qual's own suites; `command` its CLI subcommand (default: its
    name). `plan(table, test, param, rates)`: the Work one test of its suite does (`test` the
    suite's test function, `param` its parameter or None), for the plan made before any I/O;
    `filesystem`: its tests work on files, so on a raw namespace they run on a filesystem qual
    makes there (docs/ARCHITECTURE.md, "A raw namespace"). `fit(table, room, need)`: the table
    values that shrink what its tests need at once from `need` to at most `room` bytes ({}:
    it cannot), for --qual-fit. `reads_from(table)`: the path a run only reads when its settings
    name one (a checkpoint set read back from wherever it lies): the command works on that,
    not on --target, and takes no lock and leaves nothing there. `feasible(profile, criterion,
    link)`: why no drive of the profile's class can meet one of this family's criteria (`link`:
    the payload bytes/s of the class's host link, or None), for `qual profiles --check`; the
    link check every bandwidth floor gets is the core's (qual/feasibility.py)."""

    name: str
    description: str
    fields: tuple[Field, ...]
    metrics: dict[str, Metric]
    check: Callable[[dict], list[tuple[str, str]]] = field(default=lambda table: [])
    cells: Callable[[dict], list[str]] = field(default=lambda table: [])
    run: Callable[..., Outcome] | None = None
    remove: Callable | None = None
    suite: Path | None = None
    command: str | None = None
    flags: Flags | None = None
    plan: Callable[[dict, str, object, Rates], list[Work]] = field(
        default=lambda table, test, param, rates: [])
    filesystem: bool = False
    fit: Callable[[dict, int, int], dict] = field(default=lambda table, room, need: {})
    reads_from: Callable[[dict], str | None] = field(default=lambda table: None)
    feasible: Callable[[object, object, float | None], list[str]] = field(
        default=lambda profile, criterion, link: [])
    watch: Watcher | None = None

    @property
    def subcommand(self) -> str:
        return self.command or self.name


def backend_field() -> Field:
    """The I/O backend, named as fio names it, in every family."""
    return Field("backend", "choice", default="auto", choices=BACKENDS, flag="--ioengine",
                 aliases=("--backend", "--engine"),
                 help="I/O backend (fio's ioengine): io_uring, psync or auto (io_uring where "
                      "it works)")

"""The words a workload family declares itself in, and the family itself: its metrics (with the
parameters that select a measurement), the fields of its profile table, the work a plan charges
it, and `Family`, the protocol the core knows families by (docs/ARCHITECTURE.md, "Folders")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from qual.exits import Exit
from qual.measurement import Measurement, Metric


@dataclass(frozen=True)
class Field:
    """A key of a profile table (a family's, or the profile's own). kind: size, duration,
    count, ratio, number (> 0), bool, text (matching `pattern` where given), choice, sizes,
    counts, choices, texts (a list, repeats allowed), bandwidths (a table of block size =
    bandwidth), ratios (a table of name = ratio), table (with `fields`). `maximum` bounds a
    count, a number and a ratio (a ratio from 0)."""

    name: str
    kind: str
    default: object = None
    required: bool = False
    choices: tuple[str, ...] = ()
    minimum: int = 1  # counts and sizes; 0 lets a duration be zero
    maximum: int | None = None
    pattern: str | None = None  # text: a regular expression it must match (`help` says what)
    fields: tuple[Field, ...] = ()
    help: str = ""
    flag: str | None = None  # its command-line flag, where not --NAME (fio's name, say)
    aliases: tuple[str, ...] = ()  # other spellings users already type
    negations: tuple[str, ...] = ()  # bool: spellings of --no-NAME users already type
    words: tuple[tuple[str, object], ...] = ()  # flag words that stand for a value ("both")
    was: tuple[str, ...] = ()  # flag spellings removed: given, they are told the new one
    run_flag: str | None = None  # `qual run`'s option (--qual-NAME) that sets it for a run


def host_memory() -> int | None:
    """The host's available memory (MemAvailable, bytes), or None where /proc/meminfo does
    not say."""
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemAvailable:")), None)
    except OSError:
        return None


@dataclass(frozen=True)
class Rates:
    """What a plan assumes of the target and the host before anything is measured: the
    target's durable sequential write and read bandwidth (bytes/s), its 4 KiB random write
    IOPS, and how many times slower than qual's reference host (2 cores, KVM) this host
    computes; `room`, the bytes a family may fill (the target's capacity, or its filesystem's
    free space), None where unknown. A plan refines the rates from the last run on the same
    host (qual.plan)."""

    write_bw: float = 1.0e9
    read_bw: float = 1.5e9
    iops_4k: float = 50_000.0
    cpu: float = 1.0
    room: int | None = None

    def moved(self, op: str, bs: int, qd: int, seconds: float) -> int:
        """Bytes a time-bound job of `op` ("read", "write", "mixed") at block size `bs` and
        depth `qd` moves in `seconds`: the bandwidth, or the IOPS of small blocks at shallow
        depth (4 KiB IOPS, a quarter of them at depth 1)."""
        bw = self.read_bw if op == "read" else self.write_bw
        iops = self.iops_4k * min(1.0, (qd + 3) / 32)
        return int(seconds * min(bw, iops * bs))


@dataclass(frozen=True)
class Work:
    """Part of what one test of a family's suite does to the target: its estimated seconds,
    the bytes it writes and reads, and the room it needs on the target at once (`space`,
    described by `what` in a refusal; `memory`, the host memory it needs at once). Work with
    the same `key` is shared (a dataset, a module's workload run): it runs once, in the first
    selected test that needs it. `longest`: the most seconds it may take where that is known
    and more than `seconds` (a test in rounds until steady state: `seconds` at its window,
    `longest` at its round limit). `repeated`: the measuring, done again in each repetition
    (the profile's `repeats`) where other work (a region's preconditioning, a dataset) is done
    once: once per test where the suite repeats its tests (test ids ending -rN), `repeats`
    times in the one test that runs a suite's shared outcome."""

    key: str
    seconds: float
    bytes_written: int = 0
    bytes_read: int = 0
    space: int = 0
    what: str = ""
    longest: float | None = None
    repeated: bool = False
    memory: int = 0  # host memory it needs at once (a vector index's build or searchers)
    says: tuple[str, ...] = ()  # what the plan lists under its test (the command it will run)


@dataclass(frozen=True)
class Repetition:
    """Which of a run's `repeats` whole repetitions a family's run is (`index` of `count`,
    from 1), for a family that measures a figure once a run (`Family.measures_once`): in the
    last repetition where nothing later needs it (an accuracy its seed fixes, training's AU
    ceiling, of which only the last repetition's is judged), in the first where the later
    ones use what it made (a vector index, built once and searched in each). A run outside a
    repeated suite (a family command) is the only one, so both the first and the last."""

    index: int = 1
    count: int = 1

    @property
    def first(self) -> bool:
        return self.index == 1

    @property
    def last(self) -> bool:
        return self.index == self.count


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

    def texts(self) -> dict[str, str]:
        """Text reports by title (a PTS test's tables), attached to the report."""
        return {}

    def lines(self) -> list[str]:
        """What `qual <family>` prints for a person: every measurement with its unit."""
        return [f"{m.id} = {m.shown()}" for m in self.measurements()]

    def exit_status(self) -> int:
        """The CLI's exit status when nothing was judged: 0, or 1 when the run itself found a
        fault (a checkpoint that did not restore, a block that did not read back)."""
        return Exit.PASS


@dataclass(frozen=True)
class SuiteTest:
    """A test a family declares: the plugin makes it in the family's suite (`test_<name>`,
    after the suite's own functions). Most record one `section` of the family's shared run
    (the suite's `outcome`: the whole run, `repeats` times over; None: all of it) and attach
    those of the outcome's charts named in `charts` that the run drew; one with `run` is a run
    of its own instead (for each value its table gives, with `each`), and one with `summary`
    charts what its family measured before it. `skip(table)` says why it does not run with a
    profile's table (None: it runs)."""

    name: str
    feature: str  # its Allure feature
    description: str
    section: str | None = None
    charts: tuple[str, ...] | None = ()  # None: every chart the outcome drew
    skip: Callable[[dict], str | None] | None = None
    # a test that is a run of its own (`run(target, table, value, seed=, progress=)`: its
    # Outcome, recorded whole, its texts attached, its lines printed), not a section of the
    # shared run: for each value `each(table)` gives (a PTS test, an integrity order, a matrix
    # cell; `label(value)` its id), or once (value None); `repeated`: measured `repeats`
    # times, interleaved (ids ending -rN); `destructive(value)`: it writes
    run: Callable[..., Outcome] | None = None
    each: Callable[[dict], list] | None = None
    label: Callable[[object], str] = str
    repeated: bool = False
    destructive: Callable[[object], bool] = field(default=lambda value: False)
    # its run keeps a state of its own on the host's disk, to outlive the host (a power cut's
    # verify state): run also gets `state=` (a path beside the drive's run record) and
    # `resume=` (the run is a --qual-resume)
    keeps_state: bool = False
    # a test over every final measurement of its family this process made (a chart of the
    # whole matrix): `summary(measurements as dicts)` its charts, or why there are none
    summary: Callable[[list[dict]], dict[str, bytes] | str] | None = None

    @property
    def id(self) -> str:
        return f"test_{self.name}"


def in_section(found: list[Measurement], sections: dict[str, tuple[str, ...]],
               section: str | None) -> list[Measurement]:
    """A run's measurements, or those of one section (`sections`: each section's metrics)."""
    return found if section is None else [m for m in found if m.metric in sections[section]]


def declares(tests: tuple[SuiteTest, ...], test: str) -> bool:
    """Whether the suite's test `test` (its function's name) is one of these declared tests."""
    return any(t.id == test for t in tests)


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
    link check every bandwidth floor gets is the core's (qual/feasibility.py). Its command's
    flags are made from `fields` (qual/flags.py); `flags` says what the command does beyond
    them. `watch`: a family that watches the others' suites (health) instead of running.
    `tests`: the tests it declares for its suite, each one section of its shared run
    (SuiteTest); the suite file itself then holds only what no declaration can say.
    `measures_once`: its run takes `repetition=` (Repetition) and measures some figure in one
    repetition of a repeated suite only (docs/ARCHITECTURE.md, "Repetitions and the gate").
    `restarts_drive`: its run takes the drive away and brings it back (a power cut), so the
    drive's and the kernel's counters start again and no watcher compares before with after."""

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
    tests: tuple[SuiteTest, ...] = ()
    measures_once: bool = False
    restarts_drive: bool = False  # its run takes the drive away and back (a power cut)

    @property
    def subcommand(self) -> str:
        return self.command or self.name

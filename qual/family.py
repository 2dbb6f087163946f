"""The words a workload family declares itself in: its metrics (with the parameters that
select a measurement) and the fields of its profile table."""

from __future__ import annotations

from dataclasses import dataclass

from qual import units


@dataclass(frozen=True)
class Param:
    """A parameter that selects a measurement (e.g. bs, qd); `kind` is size, count, number or
    name (a word, e.g. a loader)."""

    name: str
    kind: str

    def parse(self, value: object) -> int | float:
        if self.kind == "size":
            return units.parse_size(value, name=self.name)
        if self.kind == "count":
            return units.parse_count(value, name=self.name)
        if self.kind == "name":
            if not isinstance(value, str) or not value.isidentifier():
                raise units.UnitError(f"{self.name} {value!r} is not a name")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise units.UnitError(f"{self.name} {value!r} is not a number")
        return value

    def show(self, value: int | float) -> str:
        if self.kind == "size":
            return format_block(int(value))
        return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Metric:
    """A measured quantity: its dimension (units.DIMENSIONS), which way is better, its params."""

    name: str
    dimension: str
    better: str  # "higher" or "lower"
    params: tuple[Param, ...]
    description: str


@dataclass(frozen=True)
class Field:
    """A key of a family's profile table. kind: size, duration, count, ratio, number (> 0),
    bool, text, choice, sizes, counts, choices, table (with `fields`)."""

    name: str
    kind: str
    default: object = None
    required: bool = False
    choices: tuple[str, ...] = ()
    minimum: int = 1  # counts and sizes; 0 lets a duration be zero
    maximum: int | None = None
    fields: tuple[Field, ...] = ()
    help: str = ""
    flag: str | None = None  # its command-line flag, where not --NAME (fio's name, say)
    aliases: tuple[str, ...] = ()  # other spellings users already type
    negations: tuple[str, ...] = ()  # bool: spellings of --no-NAME users already type
    words: tuple[tuple[str, object], ...] = ()  # flag words that stand for a value ("both")


def format_block(size: int) -> str:
    """A block size as fio and gdsio write it: 4K, 128K, 1M (bytes when not a whole KiB)."""
    for shift, suffix in ((30, "G"), (20, "M"), (10, "K")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{suffix}"
    return str(size)


def measurement_id(metric: Metric, params: dict[str, object]) -> str:
    """`metric[p=v,...]` with the parameters in the metric's declared order."""
    shown = ",".join(f"{p.name}={p.show(params[p.name])}" for p in metric.params
                     if p.name in params)
    return f"{metric.name}[{shown}]" if shown else metric.name


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
    described by `what` in a refusal). Work with the same `key` is shared (a dataset, a
    module's workload run): it runs once, in the first selected test that needs it. `longest`:
    the most seconds it may take where that is known and more than `seconds` (a test in rounds
    until steady state: `seconds` at its window, `longest` at its round limit). `repeated`: the
    measuring, done again in each repetition (the profile's `repeats`) where other work (a
    region's preconditioning, a dataset) is done once: once per test where the suite repeats
    its tests (test ids ending -rN), `repeats` times in the one test that runs a suite's
    shared outcome."""

    key: str
    seconds: float
    bytes_written: int = 0
    bytes_read: int = 0
    space: int = 0
    what: str = ""
    longest: float | None = None
    repeated: bool = False

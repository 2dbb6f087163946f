"""The measurement model, one home for it: a `Metric` a family declares and the id that selects
one of its measurements, a `Measurement` (a value in base units with its typed judged fields,
its repetitions and its context), a profile's `Criterion` and the `Verdict` it gives, the
baseline gate's `Regression`, and the `Judgement` of a set of measurements. It imports nothing
of qual's but units, stats and errors; the family protocol, profiles, the judge, records and
the families build on it (docs/ARCHITECTURE.md §1)."""

from __future__ import annotations

import errno
import math
from dataclasses import asdict, dataclass, field

from qual import stats, units
from qual.errors import ImplausibleMeasurement
from qual.stats import median


@dataclass(frozen=True)
class Param:
    """A parameter that selects a measurement (e.g. bs, qd); `kind` is size, count, number,
    percentile (above 0, at most 100) or name (a word, e.g. a loader)."""

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
        if self.kind == "percentile" and not 0 < value <= 100:
            raise units.UnitError(f"{self.name} {value!r} is not a percentile: give one above 0 "
                                  "and at most 100 (99, 99.9, 100 for the maximum)")
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


BASE_UNIT = {"size": "B", "bandwidth": "B/s", "time": "s", "rate": "IOPS",
             "samples": "samples/s", "tokens": "tokens/s", "queries": "queries/s",
             "temperature": "C", "ratio": "x", "count": "count"}

# what the judge reads of a measurement besides its value: typed fields, written into the
# record's `context` as before (so that records and baselines keep one schema)
JUDGED = ("caveats", "ceiling", "unverifiable", "unresolved")
SPREAD = ("interval", "interval_confidence", "repetitions")
# what a family's context says that the core reads, typed by `measure` (the family writes them
# as honesty's checks return them; the record keeps them in `context`): the I/O backend that
# moved the bytes, whether the device's own counters proved them (honesty.COUNTED) or why not,
# and what a person must see first (`attention`: each block a power cut lost, say)
SAID = ("backend", "device_truth", "attention")


@dataclass
class Measurement:
    """One measured value in base units, with what produced it and its raw samples; what the
    judge reads besides the value is typed (docs/ARCHITECTURE.md §5, "Thresholds, verdicts,
    records"): `caveats` said beside any verdict on it, `interval` the value's confidence
    interval drawn from `spread_from` values (repetitions, validation batches; 0: it claims
    none, 1: one value, its spread unknown), `ceiling` the most the measuring setup itself can
    show (a criterion above it cannot judge the drive), `unverifiable` why no profile may judge
    it at all, `unresolved` why its samples cannot support it (a p99.99 of 4,000 completions),
    `backend` the I/O backend that moved its bytes, `device_truth` whether the device's own
    counters proved them, `attention` what the report's first page must list of it. `context` holds everything else, for people and the report: the core
    reads no key of it but the recorder's own `repetition`."""

    id: str
    family: str
    metric: str
    params: dict
    value: float
    unit: str
    dimension: str
    better: str
    context: dict = field(default_factory=dict)
    samples: object = None  # latency bins {ns: count}, or a list of values
    resolved: bool = True  # False: too few samples to support the value (e.g. a p99.99)
    comparable: bool = True  # False: too unstable to gate against a baseline (a maximum is
    #                          one sample; a tail percentile needs 10x the samples that resolve it)
    caveats: list[str] = field(default_factory=list)
    interval: list[float] | None = None
    interval_confidence: float = 0.95
    spread_from: int = 0
    repetitions: list[float] | None = None  # every repetition's value, where it was repeated
    ceiling: float | None = None
    unverifiable: str | None = None
    unresolved: str | None = None  # why the samples cannot support the value (resolved False)
    backend: str | None = None
    device_truth: str | None = None
    attention: list | None = None  # (word, sentence) pairs the report's first page lists
    # the criterion a family holds every drive to where the profile states none for this
    # measurement (a drive's own statement that it is failing is never informational); its
    # verdict carries it into the record, so the measurement's dict leaves it out
    standing: Criterion | None = None

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("standing")
        if isinstance(self.samples, dict):
            out["samples"] = {str(k): v for k, v in self.samples.items()}
        typed = {k: out.pop(k) for k in (*JUDGED, *SPREAD, *SAID, "spread_from")}
        context = out["context"]
        context.update({k: typed[k] for k in (*JUDGED, *SAID) if typed[k]})
        if self.spread_from:
            context.update({k: typed[k] for k in SPREAD if typed[k] is not None or
                            k == "interval"})
        return out

    @property
    def final(self) -> bool:
        """Not an earlier repetition of a repeated figure (the last one holds them all)."""
        return is_final(self.context)

    def shown(self, unit: str | None = None) -> str:
        return units.format_quantity(self.value, unit, dimension=self.dimension)

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        """A measurement a record or journal kept (as_dict), for what reads it back in a run:
        the judge of a later repetition, the charts, the record's backends. Its judged fields
        stay in `context`."""
        context = dict(d.get("context", {}))
        return cls(id=d["id"], family=d["family"], metric=d["metric"], params=d["params"],
                   value=d["value"], unit=d["unit"], dimension=d["dimension"],
                   better=d["better"], context=context, **_said(context),
                   samples={int(k): v for k, v in d["samples"].items()}
                   if isinstance(d.get("samples"), dict) else d.get("samples"),
                   resolved=d.get("resolved", True),
                   comparable=d.get("comparable", True))


def is_final(context: dict) -> bool:
    """Whether a measurement with this context (live, or as a record keeps it) is not an
    earlier repetition of a repeated figure."""
    r = context.get("repetition")
    return r is None or r[0] == r[1]


def _said(context: dict) -> dict:
    """The SAID keys of a context, taken out of it as typed fields."""
    return {k: context.pop(k) for k in SAID if k in context}


def measure(family: str, metric: Metric, params: dict, value: float, *,
            context: dict | None = None, samples: object = None, unresolved: str | None = None,
            comparable: bool = True, caveats: list[str] | tuple[str, ...] = (),
            interval: list[float] | None = None, spread_from: int = 0,
            interval_confidence: float = 0.95, ceiling: float | None = None,
            unverifiable: str | None = None, standing: Standing | None = None) -> Measurement:
    """A family's measurement: `context` is what the family says of it (its SAID keys become
    typed fields); `standing`, the bound it is held to where the profile states none."""
    context = dict(context or {})
    mid = measurement_id(metric, params)
    unit = BASE_UNIT[metric.dimension]
    criterion = None if standing is None else Criterion(
        family=family, metric=metric.name, params=tuple((p.name, params[p.name])
                                                         for p in metric.params),
        min=standing.limit if standing.bound == "min" else None,
        max=standing.limit if standing.bound == "max" else None, unit=unit,
        source=standing.source, severity=standing.severity, tolerance=None,
        origin=STANDING_ORIGIN, id=mid)
    return Measurement(id=mid, family=family, metric=metric.name,
                       params=dict(params), value=float(value),
                       unit=BASE_UNIT[metric.dimension], dimension=metric.dimension,
                       better=metric.better, context=context, **_said(context), samples=samples,
                       resolved=unresolved is None,
                       comparable=unresolved is None and comparable, unresolved=unresolved,
                       caveats=list(caveats), interval=list(interval) if interval else None,
                       spread_from=spread_from if interval is None else max(spread_from, 2),
                       interval_confidence=interval_confidence, ceiling=ceiling,
                       unverifiable=unverifiable, standing=criterion)


STANDING_ORIGIN = "qual: standing criterion"  # a verdict's [file: source] then reads [qual: …]


@dataclass(frozen=True)
class Standing:
    """A bound a family holds every drive to in every profile, unless the profile states its
    own criterion for the measurement: `bound` "min" or "max", its `limit` in the metric's base
    unit, and `source`, why (the verdict's line names it)."""

    bound: str
    limit: float
    source: str
    severity: str = "blocker"


def with_repetitions(m: Measurement, values: list[float],
                     own: list | None = None) -> Measurement:
    """m as the figure of its repetitions `values` (docs/ARCHITECTURE.md §5): the median, with
    every repetition and the median's order-statistics interval in its context. A figure with
    an interval of its own in each repetition (an accuracy's, over its validation batches)
    keeps the widest: from the lowest repetition's low to the highest one's high."""
    ci = stats.median_interval(values)
    interval = [ci.low, ci.high] if len(values) > 1 else None
    confidence = ci.confidence
    if own and all(own) and len(values) > 1:
        interval = [min(i[0] for i in own), max(i[1] for i in own)]
        confidence = m.interval_confidence
    m.context["single"] = values[-1]
    m.repetitions, m.interval, m.interval_confidence = list(values), interval, confidence
    m.spread_from = len(values)
    m.value = ci.value
    return m


def repeated(runs: list[list[Measurement]]) -> list[Measurement]:
    """The measurements of several whole repetitions of a family's run as one set: each the
    median of its repetitions (the last repetition's context, plus them all); one measured in
    a single repetition (once a run: Family.measures_once) as it was measured, its own
    interval kept."""
    if len(runs) == 1:
        return runs[0]
    by_id: dict[str, list[Measurement]] = {}
    for run in runs:
        for m in run:
            by_id.setdefault(m.id, []).append(m)
    return [with_repetitions(ms[-1], [m.value for m in ms], [m.interval for m in ms])
            if len(ms) > 1 else ms[0] for ms in by_id.values()]


@dataclass(frozen=True)
class Regression:
    """A measurement against the same measurement of a baseline, judged by the noise-aware gate
    (qual.stats): `value` and `baseline` are the medians of their repetitions, `change` the
    estimated change (positive = better in the metric's direction) with its interval [`low`,
    `high`], `answer` the gate's: regressed, improved, within or inconclusive (then `needed`
    repetitions a side would likely decide). A metric not `gated` (informational, unless
    `qual compare --all`) is shown and never fails."""

    id: str
    value: float
    baseline: float
    change: float
    tolerance: float
    dimension: str
    baseline_label: str
    low: float | None = None
    high: float | None = None
    answer: str | None = None
    needed: int | None = None
    repetitions: tuple[int, int] = (1, 1)  # new, baseline
    gated: bool = True

    def __post_init__(self):
        if self.answer is None:  # a single value a side: the interval is the change itself
            word = "regressed" if self.change < -self.tolerance else \
                "improved" if self.change > self.tolerance else "within"
            object.__setattr__(self, "answer", word)
            object.__setattr__(self, "low", self.change)
            object.__setattr__(self, "high", self.change)

    @property
    def passed(self) -> bool:
        return not (self.gated and self.answer == "regressed")

    @property
    def improved(self) -> bool:
        """Better beyond the tolerance: flagged so a baseline never drifts silently."""
        return self.gated and self.answer == "improved"

    @property
    def inconclusive(self) -> bool:
        return self.gated and self.answer == "inconclusive"

    def line(self) -> str:
        """One sentence that says what the gate's table row says: with one repetition a side the
        change is the ratio of the two values; with more it is the gate's Hodges-Lehmann
        estimate over every pair of repetitions, which the two medians need not show."""
        word = "better" if self.change >= 0 else "worse"
        now = units.format_quantity(self.value, dimension=self.dimension)
        then = units.format_quantity(self.baseline, dimension=self.dimension)
        n, m = self.repetitions
        more = f"; about {self.needed} repetitions a side would decide" \
            if self.answer == "inconclusive" and self.needed else ""
        said = f"[baseline: {self.baseline_label}]"
        if n * m == 1:
            return (f"{self.id} = {now} is {abs(self.change) * 100:.1f} % {word} than baseline "
                    f"{then} (tolerance {self.tolerance * 100:g} %){more} {said}")
        return (f"{self.id}: new median {now}, baseline median {then}; the gate's change is "
                f"{abs(self.change) * 100:.1f} % {word} than baseline (Hodges-Lehmann estimate "
                f"over every pair of the {n} new and {m} baseline repetitions, 95 % interval "
                f"{self.low * 100:+.1f} % .. {self.high * 100:+.1f} %, tolerance "
                f"{self.tolerance * 100:g} %){more} {said}")

    def as_dict(self) -> dict:
        return {"id": self.id, "value": self.value, "baseline": self.baseline,
                "change": self.change, "low": self.low, "high": self.high,
                "tolerance": self.tolerance, "answer": self.answer, "gated": self.gated,
                "needed": self.needed, "repetitions": list(self.repetitions),
                "passed": self.passed, "improved": self.improved,
                "inconclusive": self.inconclusive, "line": self.line()}


def repetitions_of(m: dict) -> list[float]:
    """A recorded measurement's repetitions (one when it was measured once)."""
    return [float(v) for v in m.get("context", {}).get("repetitions") or [m["value"]]]


def gate_values(mid: str, new: list[float], base: list[float], *, better: str, tolerance: float,
                dimension: str, label: str, gated: bool = True) -> Regression | None:
    """The gate's answer for one metric's repetitions (None: no ratio to take)."""
    if min(new + base) <= 0:
        change = change_between(median(new), median(base), better)
        return None if change is None else Regression(
            mid, median(new), median(base), change, tolerance, dimension, label,
            repetitions=(len(new), len(base)), gated=gated)
    a = stats.gate(new, base, better, tolerance)
    return Regression(mid, median(new), median(base), a.change.value, tolerance, dimension,
                      label, a.change.low, a.change.high, a.verdict, a.needed,
                      (len(new), len(base)), gated)


def change_between(value: float, baseline: float, better: str) -> float | None:
    """The change from baseline to value as a fraction, positive when better in the metric's
    direction; None when the baseline is 0 (no ratio to take)."""
    if baseline == 0:
        return None
    change = (value - baseline) / abs(baseline)
    return -change if better == "lower" else change


@dataclass(frozen=True)
class Criterion:
    family: str
    metric: str
    params: tuple[tuple[str, object], ...]
    min: float | None
    max: float | None
    unit: str
    source: str
    severity: str
    tolerance: float | None
    origin: str  # file:key where it was written
    id: str

    @property
    def param_dict(self) -> dict:
        return dict(self.params)

    @property
    def file(self) -> str:
        return self.origin.split(":", 1)[0]

    def judge(self, value: float) -> list[Verdict]:
        verdicts = []
        if self.min is not None:
            margin = (value - self.min) / abs(self.min) if self.min else _unscaled(value)
            verdicts.append(Verdict(self, value, value >= self.min, "min", self.min, margin))
        if self.max is not None:
            margin = (self.max - value) / abs(self.max) if self.max else _unscaled(-value)
            verdicts.append(Verdict(self, value, value <= self.max, "max", self.max, margin))
        return verdicts


def _unscaled(inside: float) -> float:
    """The margin against a bound of zero, which has no scale: none on it, else infinite."""
    return 0.0 if inside == 0 else math.copysign(math.inf, inside)


@dataclass(frozen=True)
class Verdict:
    criterion: Criterion
    value: float
    passed: bool
    bound: str  # "min" or "max"
    limit: float
    margin: float  # fraction of the limit by which the value is inside (+) or outside (-)
    caveats: tuple[str, ...] = ()  # what the measurement says limits its meaning
    inconclusive: bool = False  # failed on the median, but its interval holds the bound and
    #                             the profile's `straddle` says that decides nothing

    def line(self) -> str:
        """`seq_read_bw[bs=1M,qd=128] = 5.81 GiB/s < min 6.0 GiB/s (-3.2 %) [file: source]`"""
        c = self.criterion
        if self.bound == "min":
            op = ">=" if self.passed else "<"
        else:
            op = "<=" if self.passed else ">"
        margin = f"{self.margin * 100:+.1f} %" if math.isfinite(self.margin) else "n/a"
        caveats = "".join(f"; CAVEAT: {x}" for x in self.caveats)
        word = "INCONCLUSIVE: " if self.inconclusive else ""
        return (f"{word}{c.id} = {units.format_quantity(self.value, c.unit)} {op} {self.bound} "
                f"{units.format_quantity(self.limit, c.unit)} ({margin}) [{c.file}: {c.source}]"
                f"{caveats}")

    def as_dict(self) -> dict:
        c = self.criterion
        return {"id": c.id, "metric": c.metric, "value": self.value, "bound": self.bound,
                "limit": self.limit, "unit": c.unit, "margin": self.margin,
                "passed": self.passed, "inconclusive": self.inconclusive,
                "severity": c.severity, "source": c.source,
                "origin": c.origin, "caveats": list(self.caveats), "line": self.line()}


@dataclass
class Judgement:
    """Every verdict and regression of a set of measurements, and what could not be judged."""

    verdicts: list[Verdict] = field(default_factory=list)
    regressions: list[Regression] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)  # asked for, but unjudgeable
    unverified: list[str] = field(default_factory=list)  # measured, but not proven the device's
    severities: list[str] = field(default_factory=list)  # of every criterion that applied

    @property
    def failing(self) -> list[str]:
        return [v.line() for v in self.verdicts if not v.passed and not v.inconclusive] + \
               [r.line() for r in self.regressions if not r.passed]

    @property
    def checks(self) -> int:
        return len(self.verdicts) + len(self.regressions)

    def lines(self) -> list[str]:
        return [v.line() for v in self.verdicts] + [r.line() for r in self.regressions] + \
            [f"UNVERIFIED: {u}" for u in self.unverified]

    def as_dict(self) -> dict:
        return {"verdicts": [v.as_dict() for v in self.verdicts],
                "regressions": [r.as_dict() for r in self.regressions],
                "unverified": list(self.unverified)}

    def raise_unresolved(self, target: str | None) -> None:
        """A criterion the run could not resolve is an error of the run, not a verdict."""
        if self.unresolved:
            raise ImplausibleMeasurement(errno.EBADE, "; ".join(self.unresolved), target=target)

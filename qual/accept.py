"""Acceptance on a population (docs/store.md, "Acceptance"): a drive model at one firmware is
accepted over its drives, each drive's latest run of a profile as the store holds it. Per
figure the profile judges: the drives' median, its spread (median absolute deviation, and the
coefficient of variation the profile bounds) and each drive's robust z-score
(0.6745 (x - median) / MAD). The answer is ACCEPT (every drive passed, enough drives, every
spread within bounds, no outlier), REJECT (a drive failed, an outlier though it passed, a
spread too wide: each named) or INCOMPLETE (too few drives, or a drive's run that decided
nothing)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from qual import units
from qual.exits import Exit
from qual.measurement import BASE_UNIT
from qual.report import table_lines
from qual.stats import median
from qual.thresholds import Profile

FAILED = ("FAIL", "ERROR")  # a run that says the drive did not pass
Z_SCALE = 0.6745  # makes the MAD of normal data a standard deviation (Iglewicz and Hoaglin)
DIMENSION = {unit: dim for dim, unit in BASE_UNIT.items()}


@dataclass(frozen=True)
class DriveRun:
    """A drive's latest run of the profile: what the store says of it."""

    serial: str
    run_id: str
    started: str
    rig: str
    verdict: str


@dataclass
class Figure:
    """One judged figure over the drives: their values, median, MAD, coefficient of variation,
    each drive's robust z-score, and the outliers."""

    id: str
    unit: str
    values: dict[str, float]
    max_spread: float
    median: float = 0.0
    mad: float = 0.0
    cv: float = 0.0
    z: dict[str, float] = field(default_factory=dict)
    outliers: list[str] = field(default_factory=list)

    def shown(self, value: float) -> str:
        return units.format_quantity(value, dimension=DIMENSION.get(self.unit))


@dataclass
class Acceptance:
    model: str
    firmware: str
    profile: str
    min_drives: int
    answer: str
    drives: list[DriveRun]
    figures: list[Figure]
    reasons: list[str]

    def exit_status(self) -> Exit:
        return {"ACCEPT": Exit.PASS, "REJECT": Exit.FAIL}.get(self.answer, Exit.INCOMPLETE)

    def as_dict(self) -> dict:
        out = asdict(self)
        for f in out["figures"]:  # JSON has no infinity: a z beyond any bound is null
            f["z"] = {k: (v if math.isfinite(v) else None) for k, v in f["z"].items()}
        return out


def robust_z(x: float, mid: float, mad: float) -> float:
    if mad == 0:
        return 0.0 if x == mid else math.copysign(math.inf, x - mid)
    return Z_SCALE * (x - mid) / mad


def figure_of(mid: str, unit: str, values: dict[str, float], profile: Profile) -> Figure:
    rules = profile.population
    f = Figure(mid, unit, values, rules.spread_for(mid))
    xs = list(values.values())
    f.median = median(xs)
    f.mad = median([abs(x - f.median) for x in xs])
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    f.cv = sd / abs(mean) if mean else 0.0
    f.z = {s: robust_z(x, f.median, f.mad) for s, x in values.items()}
    f.outliers = [s for s, x in values.items() if abs(f.z[s]) > rules.outlier_z and
                  abs(x - f.median) > rules.min_deviation * abs(f.median)]
    return f


def accept(db, model: str, firmware: str, profile: Profile) -> Acceptance:
    """The population's answer from the store `db` (qual.store.db.Store)."""
    rules = profile.population
    drives = [DriveRun(**d) for d in db.latest_runs(model, firmware, profile.name)]
    judged = sorted({c.id for c in profile.criteria})
    measured = db.values([d.run_id for d in drives], judged)
    reasons: list[str] = []
    failed = [d for d in drives if d.verdict in FAILED]
    undecided = [d for d in drives if d.verdict not in FAILED and d.verdict != "PASS"]
    reasons += [f"drive {d.serial} failed: its run {d.run_id} on {d.rig} is {d.verdict}"
                for d in failed]
    figures = []
    for mid in judged:
        values = {d.serial: measured[d.run_id][mid][0] for d in drives
                  if mid in measured.get(d.run_id, {})}
        if not values:
            continue
        unit = next(measured[d.run_id][mid][1] for d in drives if d.serial in values)
        f = figure_of(mid, unit, values, profile)
        figures.append(f)
        missing = [d.serial for d in drives if d.serial not in values]
        if missing:
            reasons.append(f"{mid}: not measured on drive(s) {', '.join(missing)}")
    enough = len(drives) >= rules.min_drives
    spread_wide, outlying = [], []
    if enough:
        for f in figures:
            for s in f.outliers:
                outlying.append(
                    f"drive {s} is an outlier on {f.id}: {f.shown(f.values[s])} against the "
                    f"drives' median {f.shown(f.median)} (robust z {f.z[s]:+.1f}, beyond "
                    f"{rules.outlier_z:g})")
            if f.cv > f.max_spread:
                spread_wide.append(f"{f.id}: spread {f.cv * 100:.1f} % over {len(f.values)} "
                                   f"drives, beyond its max_spread {f.max_spread * 100:g} %")
    reasons += outlying + spread_wide
    if failed or outlying or spread_wide:
        answer = "REJECT"
    elif not enough or undecided or any(r.startswith(tuple(judged)) for r in reasons):
        answer = "INCOMPLETE"
        if not enough:
            reasons.append(f"{len(drives)} drive(s) of model {model} firmware {firmware} ran "
                           f"profile {profile.name}; the profile asks for at least "
                           f"{rules.min_drives} ([population] min_drives)")
        reasons += [f"drive {d.serial}: its run {d.run_id} is {d.verdict}: it decided nothing, "
                    "run it again" for d in undecided]
    else:
        answer = "ACCEPT"
    return Acceptance(model, firmware, profile.name, rules.min_drives, answer, drives, figures,
                      reasons)


def lines(a: Acceptance) -> list[str]:
    """What `qual accept` prints: the drives, each figure's spread, the reasons, the answer."""
    out = [f"qual accept: model {a.model}, firmware {a.firmware or '(none reported)'}, "
           f"profile {a.profile}: "
           f"{len(a.drives)} drive(s) (at least {a.min_drives})"]
    worst = {d.serial: max(((abs(f.z[d.serial]), f.id) for f in a.figures if d.serial in f.z),
                           default=(0.0, "")) for d in a.drives}
    out += table_lines([(d.serial, d.verdict, d.started, d.rig, d.run_id,
                         f"{worst[d.serial][0]:.1f} {worst[d.serial][1]}".strip())
                        for d in a.drives],
                       header=("drive", "run verdict", "started (UTC)", "rig", "run",
                               "largest |z| on"))
    out.append("")
    out += table_lines([(f.id, f.shown(f.median), f.shown(f.mad), f"{f.cv * 100:.1f} %",
                         f"{f.max_spread * 100:g} %", ", ".join(f.outliers) or "-")
                        for f in a.figures],
                       header=("figure", "median", "MAD", "spread (CV)", "max_spread",
                               "outliers"))
    out += [f"{a.answer}: {r}" for r in a.reasons]
    out.append(f"verdict: {a.answer}")
    return out

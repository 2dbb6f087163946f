"""Profiles: load a threshold file (following `extends`), validate it, and judge measurements.

A profile (docs/ARCHITECTURE.md §5) is a TOML file with a `[profile]` table, one table per
workload family holding that family's parameters, and `[[<family>.criteria]]` entries, each
naming a metric, the parameters that select the measurement, a bound (`min` and/or `max`) with
its `unit`, a `source` and a `severity`. Every problem is reported as `file:key: what is wrong`,
all at once, before any I/O.
"""

from __future__ import annotations

import hashlib
import re
import math
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from qual import shipped, units
from qual.family import Family, Field, Settings
from qual.measurement import Criterion, measurement_id
from qual.record import DEFAULT_TOLERANCE
from qual.settings import complete, parse_fields, parse_value, unknown_key

STRADDLE = ("caveat", "inconclusive")  # a failing median whose interval holds the bound
FILESYSTEMS = ("ext4", "xfs")  # what qual makes on a raw namespace for the file families
LINK = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s\s+x(\d+)\s*$")  # "32 GT/s x4": the class's host link
DEVICE_TRUTH = ("required", "optional")  # optional: judged without it, with a caveat
CRITERION_KEYS = ("metric", "params", "min", "max", "unit", "source", "severity", "tolerance")
SEVERITIES = ("blocker", "critical", "normal", "minor", "trivial")
DEFAULT_GATE = "normal"  # a failed blocker, critical or normal criterion fails the gate
# a tolerance, a spread: a share of the figure, 0 to 1000 %
TOLERANCE = Field("tolerance", "ratio", maximum=10, help="a regression beyond this share of "
                  "the baseline fails the gate")

REPEATS = Field("repeats", "count", maximum=100, help="repetitions of every judged figure")

# the profile's own keys, its [profile] table (docs/profiles.md)
PROFILE_FIELDS = (
    Field("name", "text", help="the profile's name (default: its file's)"),
    Field("description", "text", help="the drive class it is for"),
    Field("extends", "text", help="the profile it inherits from: a shipped name or a path"),
    TOLERANCE,
    Field("gate", "choice", choices=SEVERITIES,
          help="the least severity whose failed criterion fails the gate"),
    Field("device_truth", "choice", choices=DEVICE_TRUTH,
          help="optional: a claim on the device judged without its counters, with a caveat"),
    Field("link", "text", pattern=LINK.pattern, help='a PCIe link like "32 GT/s x4"'),
    Field("peak_read_bw", "bandwidths", help="block size = bandwidth, the class's published "
                                             "peaks"),
    Field("filesystem", "choice", choices=FILESYSTEMS,
          help="the filesystem qual makes on a raw namespace for the file families"),
    Field("filesystem_options", "texts", help='mkfs options, e.g. ["-E", "lazy_itable_init=0"]'),
    Field("fit", "bool", help="a region or dataset larger than the target is scaled down"),
    REPEATS,
    Field("straddle", "choice", choices=STRADDLE,
          help="a failing median whose interval holds the bound: its verdict"),
)

# the profile's [population] table: how `qual accept` judges a drive model (docs/store.md)
POPULATION_FIELDS = (
    Field("min_drives", "count", maximum=10000, help="drives of the model, at least"),
    Field("max_spread", "ratio", maximum=10, help="each figure's spread over the drives, at most"),
    Field("outlier_z", "number", maximum=100, help="a robust z-score bound (e.g. 3.5)"),
    Field("min_deviation", "ratio", maximum=10,
          help="an outlier differs from the median by more than this share"),
    Field("spreads", "ratios", maximum=10, help='measurement id = ratio, e.g. '
                                                '{ "seq_read_bw[bs=1M,qd=16]" = "5 %" }'),
)


class ProfileError(Exception):
    """Everything wrong with a profile, one `file:key: problem` line each."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = problems
        super().__init__("\n".join(f"{f}:{k}: {p}" for f, k, p in problems))


def profiles_dir() -> Path:
    """Where the shipped profiles live."""
    return shipped("thresholds")


def list_profiles(families: dict[str, Family]) -> list[tuple[str, str, Path]]:
    """(name, description, path) of every shipped profile, by name."""
    out = []
    for path in sorted(profiles_dir().glob("*.toml")):
        try:
            desc = load_profile(path, families).description
        except ProfileError as e:
            desc = f"INVALID: {e.problems[0][2]}"
        out.append((path.stem, desc, path))
    return out


def resolve_profile(spec: str | Path, relative_to: Path | None = None) -> Path:
    """A profile name (ci, gen5-tlc) or a path to a .toml file."""
    text = str(spec)
    candidates = []
    if relative_to is not None:
        candidates.append(relative_to / text)
        candidates.append(relative_to / f"{text}.toml")
    candidates.append(Path(text))
    if not text.endswith(".toml") and "/" not in text:
        candidates.append(profiles_dir() / f"{text}.toml")
    for c in candidates:
        if c.is_file():
            return c.resolve()
    known = ", ".join(p.stem for p in sorted(profiles_dir().glob("*.toml")))
    raise ProfileError([(text, "profile", f"no such profile file or name (shipped: {known})")])


# ------------------------------------------------------------------ criteria and verdicts


# ------------------------------------------------------------------ the profile


@dataclass(frozen=True)
class Population:
    """A profile's [population] table: how `qual accept` judges a drive model over its drives
    (docs/store.md): at least `min_drives` drives; each judged figure's coefficient of
    variation over them at most `max_spread` (or its own, `spreads[id]`); a drive whose robust
    z-score on a figure is beyond `outlier_z` and which differs from the drives' median by more
    than `min_deviation` is an outlier (the second condition keeps a tight population's tiny
    MAD from calling noise an outlier)."""

    min_drives: int = 3
    max_spread: float = 0.10
    outlier_z: float = 3.5
    min_deviation: float = 0.05
    spreads: dict = field(default_factory=dict)

    def spread_for(self, measurement: str) -> float:
        return self.spreads.get(measurement, self.max_spread)




@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    tolerance: float
    files: tuple[Path, ...]  # the file and every file it extends, child first
    digest: str
    tables: dict  # family name -> parsed table
    criteria: tuple[Criterion, ...]
    gate: str = DEFAULT_GATE  # the least severity whose failed criterion fails the gate
    device_truth: str = "required"  # a claim on the device is judged only with its counters
    link: str | None = None  # the drive class's host link, "32 GT/s x4"
    peak_read_bw: dict = field(default_factory=dict)  # block size -> the class's published peak
    filesystem: str = "ext4"  # made on a raw namespace for the file families
    filesystem_options: tuple[str, ...] | None = None  # mkfs options; None: qual's defaults
    fit: bool = False  # a region or dataset larger than the target is scaled down, with a CAVEAT
    repeats: int = 1  # repetitions of every judged figure (interleaved), judged by their median
    straddle: str = "caveat"  # a failing median whose interval holds the bound: FAIL with a
    #                           CAVEAT, or (a pipeline gate on a shared host) INCONCLUSIVE
    population: Population = field(default_factory=Population)  # qual accept's rules

    @property
    def gated_severities(self) -> tuple[str, ...]:
        return SEVERITIES[:SEVERITIES.index(self.gate) + 1]

    def table(self, family: str) -> dict | None:
        return self.tables.get(family)

    def criteria_for(self, measurement: str) -> list[Criterion]:
        return [c for c in self.criteria if c.id == measurement]

    def as_dict(self) -> dict:
        return {"name": self.name, "path": str(self.path), "digest": self.digest,
                "description": self.description, "tolerance": self.tolerance,
                "gate": self.gate, "device_truth": self.device_truth,
                "filesystem": self.filesystem, "filesystem_options": self.filesystem_options,
                "fit": self.fit, "repeats": self.repeats, "straddle": self.straddle,
                "files": [str(f) for f in self.files],
                "tolerances": {c.id: c.tolerance for c in self.criteria
                               if c.tolerance is not None}}


def load_profile(spec: str | Path, families: dict[str, Family]) -> Profile:
    """Load, inherit and validate a profile against the registered families (name -> Family);
    raises ProfileError listing every problem."""
    path = resolve_profile(spec)
    problems: list[tuple[str, str, str]] = []
    chain = _load_chain(path, families, problems, [])
    if problems:
        raise ProfileError(problems)
    top = chain[0]
    label = top["label"]
    info = {}
    tables: dict[str, dict] = {}
    criteria: dict[tuple, Criterion] = {}
    population: dict = {}
    for doc in reversed(chain):  # parent first, child overrides
        info.update(doc["profile"])
        population.update(doc["population"])
        for family, table in doc["tables"].items():
            tables[family] = _merge(tables.get(family, {}), table)
        for c in doc["criteria"]:
            criteria[c.id] = c  # a child's criterion replaces its parent's for the same id
    for family_name, table in tables.items():
        family = families[family_name]
        complete(family.fields, table, label, family_name, problems)
        if not problems:
            for key, problem in family.check(table):
                problems.append((label, f"{family_name}.{key}", problem))
    if "description" not in info:
        problems.append((label, "profile.description", "missing: say what drive class this is for"))
    for c in criteria.values():
        if c.family not in tables:
            problems.append((c.file, c.origin.split(":", 1)[1],
                             f"[{c.family}] table is missing, so nothing measures {c.id}"))
        elif not problems and c.id not in families[c.family].cells(tables[c.family]):
            inherited = f" (inherited by {label})" if c.file != label else ""
            problems.append((c.file, c.origin.split(":", 1)[1],
                             f"{c.id} is not measured with the [{c.family}] parameters of "
                             f"{label}{inherited}: check its block sizes, depths, patterns"))
    judged = {c.id for c in criteria.values()}
    for mid in population.get("spreads", {}):
        if mid not in judged:
            problems.append((label, f"population.spreads.{mid}", f"{mid} is not a figure this "
                                                                 "profile judges"))
    if problems:
        raise ProfileError(problems)
    digest = hashlib.sha256(b"".join(d["raw"] for d in chain)).hexdigest()[:16]
    return Profile(name=info.get("name", path.stem), path=path, description=info["description"],
                   tolerance=info.get("tolerance", DEFAULT_TOLERANCE),
                   files=tuple(d["path"] for d in chain), digest=digest,
                   tables={k: Settings(v) for k, v in tables.items()},
                   criteria=tuple(criteria.values()), gate=info.get("gate", DEFAULT_GATE),
                   device_truth=info.get("device_truth", "required"), link=info.get("link"),
                   peak_read_bw=info.get("peak_read_bw", {}),
                   filesystem=info.get("filesystem", "ext4"),
                   filesystem_options=info.get("filesystem_options"),
                   fit=info.get("fit", False), repeats=info.get("repeats", 1),
                   straddle=info.get("straddle", "caveat"), population=Population(**population))


def family_table(fam: Family, given: dict, *, base: dict | None = None,
                 label: str = "flags") -> Settings:
    """A workload family's settings from plain values (command-line flags, tests) over a
    profile's already parsed table (base, if any), checked and completed with defaults as a
    profile's would be; ProfileError lists every problem."""
    return field_table(fam.fields, given, prefix=fam.name, base=base, label=label,
                       check=fam.check)


def field_table(fields: tuple[Field, ...], given: dict, *, prefix: str,
                base: dict | None = None, label: str = "flags", check=None) -> Settings:
    """Settings of `fields` from plain values over a parsed table (base), completed with the
    fields' defaults and checked (`check(table)`: (key, problem) pairs); ProfileError lists
    every problem."""
    problems: list[tuple[str, str, str]] = []
    table = _merge(base or {}, parse_fields(fields, given, label, prefix, problems))
    complete(fields, table, label, prefix, problems)
    if not problems and check is not None:
        problems += [(label, f"{prefix}.{k}", p) for k, p in check(table)]
    if problems:
        raise ProfileError(problems)
    return Settings(table)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _load_chain(path: Path, families: dict[str, Family], problems, seen: list[Path]) -> list[dict]:
    """This file's parsed document followed by those of the files it extends."""
    label = path.name
    if path in seen:
        cycle = " -> ".join(p.name for p in [*seen, path])
        problems.append((label, "profile.extends", f"extends itself through {cycle}"))
        return []
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode())
    except UnicodeDecodeError as e:  # said by its line, as a person finds it in an editor
        line = raw[:e.start].count(b"\n") + 1
        problems.append((label, "toml", f"line {line}: a byte that is not UTF-8 "
                                        f"({raw[e.start:e.start + 1]!r}); save the file as UTF-8"))
        return []
    except tomllib.TOMLDecodeError as e:
        problems.append((label, "toml", str(e)))
        return []
    doc = {"path": path, "label": label, "raw": raw, "profile": {}, "tables": {}, "criteria": [],
           "population": {}}
    _parse_document(data, families, doc, problems)
    chain = [doc]
    parent = doc["profile"].pop("extends", None)
    if parent is not None:
        try:
            parent_path = resolve_profile(parent, relative_to=path.parent)
        except ProfileError:
            problems.append((label, "profile.extends", f"no profile {parent!r} next to {label} "
                                                       "or among the shipped ones"))
        else:
            chain += _load_chain(parent_path, families, problems, [*seen, path])
    return chain


def _parse_document(data: dict, families: dict[str, Family], doc: dict, problems) -> None:
    label = doc["label"]
    for key, value in data.items():
        if key == "profile":
            doc["profile"] = _parse_own_table(key, PROFILE_FIELDS, value, label, problems)
        elif key == "population":
            doc["population"] = _parse_own_table(key, POPULATION_FIELDS, value, label, problems)
        elif key in families:
            if not isinstance(value, dict):
                problems.append((label, key, "must be a table"))
                continue
            family = families[key]
            table = dict(value)
            raw_criteria = table.pop("criteria", [])
            doc["tables"][key] = parse_fields(family.fields, table, label, key, problems)
            if not isinstance(raw_criteria, list):
                problems.append((label, f"{key}.criteria", "must be an array of tables ([[...]])"))
                continue
            seen = {}
            for i, raw in enumerate(raw_criteria):
                where = f"{key}.criteria[{i}]"
                c = _parse_criterion(family, raw, label, where, problems)
                if c and c.id in seen:
                    problems.append((label, where, f"{c.id} is already judged by {seen[c.id]}; "
                                     "put both bounds in one criterion"))
                elif c:
                    seen[c.id] = where
                    doc["criteria"].append(c)
        else:
            known = ", ".join(["profile", "population", *families])
            problems.append((label, key, f"unknown table (known: {known})"))
    if "profile" not in data:
        problems.append((label, "profile", "missing [profile] table"))


def _own_value(f: Field, value, label, where, problems):
    try:
        return parse_value(f, value, label, where, problems)
    except units.UnitError as e:
        problems.append((label, where, str(e)))
        return None


def _parse_own_table(name: str, fields: tuple[Field, ...], value, label, problems) -> dict:
    """[profile] or [population]: a table whose keys are `fields`."""
    if not isinstance(value, dict):
        problems.append((label, name, "must be a table"))
        return {}
    return parse_fields(fields, value, label, name, problems, beside=())


def _parse_criterion(family: Family, raw, label, where, problems) -> Criterion | None:
    if not isinstance(raw, dict):
        problems.append((label, where, "must be a table"))
        return None
    before = len(problems)
    for key in raw:
        if key not in CRITERION_KEYS:
            problems.append((label, f"{where}.{key}", unknown_key(key, CRITERION_KEYS)))
    metric = family.metrics.get(raw.get("metric"))
    if metric is None:
        problems.append((label, f"{where}.metric", f"{raw.get('metric')!r} is not a metric of "
                         f"[{family.name}] (known: {', '.join(family.metrics)})"))
        return None
    params = {}
    raw_params = raw.get("params", {})
    if not isinstance(raw_params, dict):
        problems.append((label, f"{where}.params", "must be a table, e.g. { bs = \"1M\", qd = 128 }"))
        raw_params = {}
    declared = {p.name: p for p in metric.params}
    for name, value in raw_params.items():
        if name not in declared:
            problems.append((label, f"{where}.params.{name}", unknown_key(name, list(declared))))
            continue
        try:
            params[name] = declared[name].parse(value)
        except units.UnitError as e:
            problems.append((label, f"{where}.params.{name}", str(e)))
    for name in declared:
        if name not in raw_params:
            problems.append((label, f"{where}.params.{name}", f"missing: {metric.name} is "
                             f"selected by {', '.join(declared)}"))
    unit = raw.get("unit")
    if not isinstance(unit, str):
        problems.append((label, f"{where}.unit", f"missing: {metric.name} is a {metric.dimension}"))
    else:
        try:
            units.parse_unit(unit, metric.dimension)
        except units.UnitError as e:
            problems.append((label, f"{where}.unit", str(e)))
    bounds = {}
    for side in ("min", "max"):
        if side in raw:
            v = raw[side]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                problems.append((label, f"{where}.{side}", f"{v!r} must be a number (the unit "
                                 "goes in `unit`)"))
            elif v < 0:
                problems.append((label, f"{where}.{side}", f"{v} is negative"))
            else:
                bounds[side] = v
    if "min" not in raw and "max" not in raw:
        problems.append((label, where, "needs a bound: min, max or both"))
    if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
        problems.append((label, where, f"min {bounds['min']} is above max {bounds['max']}"))
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        problems.append((label, f"{where}.source", "missing: cite the figure this bound comes from"))
    severity = raw.get("severity", "normal")
    if severity not in SEVERITIES:
        problems.append((label, f"{where}.severity", f"{severity!r} is not one of {', '.join(SEVERITIES)}"))
    tolerance = _own_value(TOLERANCE, raw["tolerance"], label, f"{where}.tolerance",
                           problems) if "tolerance" in raw else None
    if len(problems) > before:
        return None
    factor = units.parse_unit(unit).factor
    return Criterion(
        family=family.name, metric=metric.name,
        params=tuple((p.name, params[p.name]) for p in metric.params),
        min=bounds["min"] * factor if "min" in bounds else None,
        max=bounds["max"] * factor if "max" in bounds else None,
        unit=unit, source=source.strip(), severity=severity, tolerance=tolerance,
        origin=f"{label}:{where}", id=measurement_id(metric, params))

"""Measurements and the run record (qual-run.json), and gating a run against a baseline record."""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from qual import units
from qual.family import Metric, measurement_id

SCHEMA = "qual-run/1"
RECORD_NAME = "qual-run.json"
BASE_UNIT = {"size": "B", "bandwidth": "B/s", "time": "s", "rate": "IOPS",
             "samples": "samples/s", "ratio": "x", "count": "count"}


@dataclass
class Measurement:
    """One measured value in base units, with what produced it and its raw samples."""

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

    def as_dict(self) -> dict:
        out = asdict(self)
        if isinstance(self.samples, dict):
            out["samples"] = {str(k): v for k, v in self.samples.items()}
        return out

    def shown(self, unit: str | None = None) -> str:
        return units.format_quantity(self.value, unit, dimension=self.dimension)


def measure(family: str, metric: Metric, params: dict, value: float, *,
            context: dict | None = None, samples: object = None, resolved: bool = True,
            comparable: bool = True) -> Measurement:
    return Measurement(id=measurement_id(metric, params), family=family, metric=metric.name,
                       params=dict(params), value=float(value),
                       unit=BASE_UNIT[metric.dimension], dimension=metric.dimension,
                       better=metric.better, context=dict(context or {}), samples=samples,
                       resolved=resolved, comparable=resolved and comparable)


# ------------------------------------------------------------------ baseline gating


@dataclass(frozen=True)
class Regression:
    """A measurement against the same measurement of a baseline run."""

    id: str
    value: float
    baseline: float
    change: float  # fraction; positive = better in the metric's direction
    tolerance: float
    dimension: str
    baseline_label: str

    @property
    def passed(self) -> bool:
        return self.change >= -self.tolerance

    @property
    def improved(self) -> bool:
        """Better by more than the tolerance: flagged so a baseline never drifts silently."""
        return self.change > self.tolerance

    def line(self) -> str:
        word = "better" if self.change >= 0 else "worse"
        now = units.format_quantity(self.value, dimension=self.dimension)
        then = units.format_quantity(self.baseline, dimension=self.dimension)
        return (f"{self.id} = {now} is {abs(self.change) * 100:.1f} % {word} than baseline "
                f"{then} (tolerance {self.tolerance * 100:g} %) [baseline: {self.baseline_label}]")

    def as_dict(self) -> dict:
        return {"id": self.id, "value": self.value, "baseline": self.baseline,
                "change": self.change, "tolerance": self.tolerance, "passed": self.passed,
                "improved": self.improved, "line": self.line()}


class Baseline:
    """A previous run record to gate against (firmware CI)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: cannot read a baseline run record: {e}") from None
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a qual run record (schema {data.get('schema')!r})")
        self.data = data
        self.values = {m["id"]: m for t in data.get("tests", []) for m in t["measurements"]
                       if m.get("comparable", True)}
        ident = data.get("target", {}).get("identity", {})
        fw = ident.get("firmware")
        self.label = f"{self.path.name}" + (f" fw {fw}" if fw else "")

    def compare(self, m: Measurement, tolerance: float) -> Regression | None:
        old = self.values.get(m.id)
        if old is None or not m.comparable or old["value"] == 0:
            return None
        change = (m.value - old["value"]) / abs(old["value"])
        if m.better == "lower":
            change = -change
        return Regression(m.id, m.value, old["value"], change, tolerance, m.dimension, self.label)


# ------------------------------------------------------------------ the run record


def host_info() -> dict:
    info = {"hostname": socket.gethostname(), "kernel": platform.release(),
            "machine": platform.machine(), "python": platform.python_version(),
            "cpus": os.cpu_count()}
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                info["os"] = line.split("=", 1)[1].strip('"')
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return info


def qual_version() -> str:
    try:
        return metadata.version("qual")
    except metadata.PackageNotFoundError:
        return "unknown"


def write_record(path: Path, record: dict) -> None:
    """Write atomically: a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False, default=str))
    os.replace(tmp, path)


def new_record(*, target: dict, profile: dict, engine: dict) -> dict:
    return {
        "schema": SCHEMA,
        "qual_version": qual_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "finished": None,
        "host": host_info(),
        "target": target,
        "profile": profile,
        "engine": engine,
        "tests": [],
        "summary": {},
    }


def summarize(tests: list[dict], profile) -> dict:
    """Counts and the run's verdict: FAIL (a check failed), ERROR (a test could not measure),
    INCOMPLETE (a criterion of the profile was not judged), else PASS."""
    verdicts = [v for t in tests for v in t.get("verdicts", [])]
    regressions = [r for t in tests for r in t.get("regressions", [])]
    measurements = [m for t in tests for m in t.get("measurements", [])]
    judged = {v["id"] for v in verdicts}
    not_judged = [c.id for c in profile.criteria if c.id not in judged]
    failed = sum(not v["passed"] for v in verdicts) + sum(not r["passed"] for r in regressions)
    broken = sum(t["outcome"] == "broken" for t in tests)
    failed_tests = sum(t["outcome"] == "failed" for t in tests)
    if failed or failed_tests:
        verdict = "FAIL"
    elif broken:
        verdict = "ERROR"
    elif not_judged:
        verdict = "INCOMPLETE"
    else:
        verdict = "PASS"
    return {
        "verdict": verdict,
        "tests": len(tests),
        "tests_failed": failed_tests,
        "tests_broken": broken,
        "tests_skipped": sum(t["outcome"] == "skipped" for t in tests),
        "measurements": len(measurements),
        "informational": sum(m["id"] not in judged for m in measurements),
        "checks_passed": sum(v["passed"] for v in verdicts) + sum(r["passed"] for r in regressions),
        "checks_failed": failed,
        "improved": [r["id"] for r in regressions if r["improved"]],
        "not_judged": not_judged,
        "caveats": sorted({c for v in verdicts for c in v.get("caveats", ())}),
    }

"""The run record (qual-run.json): writing it, reading it back, and gating a run against a
baseline record (the measurements, verdicts and regressions in it: qual.measurement)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from qual.measurement import Measurement, Regression, gate_values, is_final, repetitions_of

SCHEMA = "qual-run/1"
DEFAULT_TOLERANCE = 0.05  # a profile's regression tolerance when it names none
RECORD_NAME = "qual-run.json"
LAST_RECORD = ".last-" + RECORD_NAME  # the previous run's record, kept by `qual run` for the plan


# ------------------------------------------------------------------ baseline gating


def record_paths(given: list[str]) -> list[Path]:
    """Run records named one by one, or folders of them (every qual-run.json below)."""
    out = []
    for g in map(Path, given):
        found = sorted(g.rglob(RECORD_NAME)) if g.is_dir() else [g]
        if not found:
            raise ValueError(f"{g}: no {RECORD_NAME} in this folder")
        out += found
    return out


def read_record(path: str | Path) -> dict:
    """A run record from disk; ValueError saying what is wrong with it (`path: reason`)."""
    try:
        text = Path(path).read_text()
        data = json.loads(text)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a qual run record (not UTF-8 text: {e.reason} at byte "
                         f"{e.start})") from None
    except json.JSONDecodeError as e:
        cut = e.pos >= len(text.rstrip()) and text.lstrip().startswith("{")
        raise ValueError(f"{path}: " + ("not a whole qual run record (it ends at line "
                                         f"{e.lineno}: cut short)" if cut else
                                         f"not a qual run record (not JSON: {e.msg} at line "
                                         f"{e.lineno} column {e.colno})")) from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read a qual run record: {e}") from None
    try:
        check_schema(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return data


REQUIRED = {"started": str, "target": dict, "profile": dict, "tests": list, "summary": dict}


def check_schema(data) -> None:
    """ValueError saying why `data` is not a run record this qual reads: another document, or
    a record of a newer schema (a newer qual wrote it)."""
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, str) or not schema.startswith("qual-run/"):
        raise ValueError(f"not a qual run record (schema {schema!r})")
    if schema != SCHEMA:
        version = schema.removeprefix("qual-run/")
        newer = version.isdigit() and int(version) > int(SCHEMA.removeprefix("qual-run/"))
        raise ValueError(f"a record of schema {schema}" + (
            f", newer than this qual's ({SCHEMA}): read it with a newer qual" if newer else
            f", which this qual ({SCHEMA}) does not read"))


def check_record(data) -> None:
    """check_schema, and every part a finished run's record has (what the store keys on)."""
    check_schema(data)
    for key, kind in REQUIRED.items():
        if not isinstance(data.get(key), kind):
            raise ValueError(f"not a whole qual run record ({key!r} is missing or not a "
                             f"{kind.__name__})")
    if not isinstance(data["summary"].get("verdict"), str):
        raise ValueError("not a whole qual run record (its summary has no verdict)")


def run_id_of(record: dict) -> str:
    """A record's key: its `run_id`, or for a record older than run ids, the digest of its
    content (so importing it twice stores it once)."""
    if record.get("run_id"):
        return str(record["run_id"])
    body = json.dumps(record, sort_keys=True, default=str).encode()
    return "sha256:" + hashlib.sha256(body).hexdigest()[:56]


def comparable_measurements(record: dict) -> dict[str, dict]:
    """The measurements of a record that may be gated against, by id (of a repeated figure,
    the last repetition's: it holds every repetition)."""
    return {m["id"]: m for t in record.get("tests", []) for m in t["measurements"]
            if m.get("comparable", True) and is_final(m.get("context", {}))}


def drive_model(record: dict) -> str | None:
    return (record.get("target", {}).get("identity") or {}).get("model")


def mismatches(old: dict, *, model: str | None, profile: str) -> list[str]:
    """Why a baseline record is not the same drive model and profile as a new run."""
    out = []
    old_model, old_profile = drive_model(old), old.get("profile", {}).get("name")
    if old_model != model:
        out.append(f"drive model {old_model or 'unknown'!s} (baseline) is not {model or 'unknown'!s}")
    if old_profile != profile:
        out.append(f"profile {old_profile} (baseline) is not {profile}")
    return out


class Baseline:
    """Previous run records to gate against (firmware CI): one, or several runs of the old
    firmware whose repetitions pool into the baseline's distribution. `path` says where they
    came from (the first record file, or the store and its selector), `label` names them in
    the gate's lines."""

    def __init__(self, records: list[dict], path: str, name: str):
        if not records:
            raise ValueError(f"{path}: no run to gate against")
        self.path, self.records = path, records
        self.data = self.records[0]
        self.values = pooled(self.records)
        fw = (self.data.get("target", {}).get("identity") or {}).get("firmware")
        self.label = name + (f" fw {fw}" if fw else "") + \
            (f" and {len(records) - 1} more run(s)" if len(records) > 1 else "")

    @classmethod
    def from_paths(cls, path: str | Path | list) -> Baseline:
        """The records at a path, or several (files, or folders of them)."""
        paths = record_paths([str(p) for p in (path if isinstance(path, list) else [path])])
        return cls([read_record(p) for p in paths], str(paths[0]), paths[0].name)

    def compare(self, m: Measurement, tolerance: float) -> Regression | None:
        old = self.values.get(m.id)
        if old is None or not m.comparable:
            return None
        return gate_values(m.id, m.repetitions or [m.value], old["repetitions"],
                           better=m.better,
                           tolerance=tolerance, dimension=m.dimension, label=self.label)


def pooled(records: list[dict]) -> dict[str, dict]:
    """The comparable measurements of several records by id, each with every record's
    repetitions pooled under `repetitions`."""
    out: dict[str, dict] = {}
    for record in records:
        for mid, m in comparable_measurements(record).items():
            entry = out.setdefault(mid, {**m, "repetitions": []})
            entry["repetitions"] += repetitions_of(m)
    return out


def judged_ids(record: dict) -> set[str]:
    """The measurements a record's profile judges (a verdict) or gives a tolerance."""
    return {v["id"] for t in record.get("tests", ()) for v in t.get("verdicts", ())} | \
        set(record.get("profile", {}).get("tolerances", {}))


def compare_records(old: dict | list[dict], new: dict | list[dict], *, old_label: str,
                    default_tolerance: float | None = None, gate_all: bool = True
                    ) -> tuple[list[Regression], list[str], list[str]]:
    """Every comparable measurement of `new` (one record or several runs, pooled) against
    `old` (likewise): the gate's answers, the ids only the baseline has, and the ids only the
    new run has. Tolerances are the new run's profile's, per criterion, else its default (or
    `default_tolerance` when given). Without `gate_all`, only what the profile judges or gives
    a tolerance is gated; the rest is shown."""
    olds = old if isinstance(old, list) else [old]
    news = new if isinstance(new, list) else [new]
    before, after = pooled(olds), pooled(news)
    prof = news[0].get("profile", {})
    default = default_tolerance if default_tolerance is not None else \
        prof.get("tolerance", DEFAULT_TOLERANCE)
    per_criterion = prof.get("tolerances", {})
    judged = set().union(*(judged_ids(r) for r in news))
    rows = []
    for mid, m in after.items():
        o = before.get(mid)
        if o is None:
            continue
        r = gate_values(mid, m["repetitions"], o["repetitions"], better=m["better"],
                        tolerance=per_criterion.get(mid, default), dimension=m["dimension"],
                        label=old_label, gated=gate_all or mid in judged)
        if r is not None:
            rows.append(r)
    return rows, sorted(set(before) - set(after)), sorted(set(after) - set(before))


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


def rig_label() -> str:
    """The rig a run is on: $QUAL_RIG, else the host's name."""
    return os.environ.get("QUAL_RIG") or socket.gethostname()


def qual_version() -> str:
    try:
        return metadata.version("qual")
    except metadata.PackageNotFoundError:
        return "unknown"


def write_record(path: Path, record: dict) -> None:
    """Write atomically and durably: a reader never sees half a record, and once this returns
    a power loss keeps it (the file and its folder's entry synced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(record, indent=2, sort_keys=False, default=str))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


@dataclass
class RunRecord:
    """One drive's run as qual-run.json keeps it (schema qual-run/1): the drive, the host, the
    profile, the engine, every test and the summary with the run's verdict; `stalled`,
    `device_gone` and `interrupted` say how a run that did not finish ended. Typed until it is written
    (`as_dict`); what reads a record back (the report, the gate, `qual compare`) reads the
    JSON, from this run or an older one."""

    target: dict
    profile: dict
    engine: dict
    tests: list[TestResult]
    summary: dict
    started: str
    finished: str | None = None
    seed: int | None = None
    baseline: str | None = None
    plan: dict | None = None
    stalled: dict | None = None
    interrupted: str | None = None
    resumed: list[dict] | None = None  # each resumption: when, and how many tests it kept
    device_gone: dict | None = None  # the test after which the device was gone, and how
    run_id: str | None = None  # this drive's run, once: the store's key (qual.store)
    rig: str | None = None  # the rig it ran on: $QUAL_RIG, else the host's name
    schema: str = SCHEMA
    qual_version: str = field(default_factory=lambda: qual_version())
    host: dict = field(default_factory=lambda: host_info())

    def as_dict(self) -> dict:
        out = {"schema": self.schema, "qual_version": self.qual_version,
               "started": self.started, "finished": self.finished, "host": self.host,
               "target": self.target, "profile": self.profile, "engine": self.engine,
               "seed": self.seed, "baseline": self.baseline,
               "tests": [t.as_dict() for t in self.tests], "plan": self.plan,
               "summary": self.summary}
        out.update({k: v for k, v in (("run_id", self.run_id), ("rig", self.rig),
                                      ("stalled", self.stalled),
                                      ("device_gone", self.device_gone),
                                      ("interrupted", self.interrupted),
                                      ("resumed", self.resumed)) if v is not None})
        return out


@dataclass
class TestResult:
    """One test of a run as the record keeps it: its outcome (passed, failed, broken,
    skipped), time and message, what it measured and the verdicts on it (JSON-ready dicts:
    they come across pytest's report, and xdist's boundary, as the recorder's payload), where
    it ran (the device, or qual's filesystem on it) and the drive's error where the drive
    failed an I/O. `drive` is the record it belongs to, not a key of it."""

    __test__ = False  # a record's type, not a test class for pytest to collect

    nodeid: str
    drive: str
    outcome: str = "passed"
    duration_s: float = 0.0
    message: str | None = None
    measurements: list[dict] = field(default_factory=list)
    verdicts: list[dict] = field(default_factory=list)
    regressions: list[dict] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    where: str | None = None
    device_error: dict | None = None

    def judged(self, payload: dict) -> None:
        """The recorder's payload of this test: measurements, verdicts, regressions,
        unverified."""
        for key in ("measurements", "verdicts", "regressions", "unverified"):
            setattr(self, key, list(payload.get(key, [])))

    def as_dict(self) -> dict:
        """The record's entry (the JSON boundary): every field but the drive, the optional
        ones only where set."""
        out = asdict(self)
        del out["drive"]
        for key in ("where", "device_error"):
            if out[key] is None:
                del out[key]
        return out


def not_selected(tests: list[TestResult], profile, plan: dict | None) -> set[str]:
    """The criteria a -k/-m subset left out: of a family some of whose tests it deselected
    (the plan's `left_out`), measured by no test of the run, where no selected test of the
    family broke (that one might have judged it: then it is not judged). A selected test that
    skipped (not applicable here: an NVMe log off NVMe, a GPU path without one) judges
    nothing of its family's other criteria."""
    families = set((plan or {}).get("left_out", ()))
    family_of = {t["id"]: t["family"] for t in (plan or {}).get("tests", ())}
    measured = {m["id"] for t in tests for m in t.measurements}
    unsure = {family_of.get(t.nodeid) for t in tests if t.outcome == "broken"}
    return {c.id for c in profile.criteria if c.family in families - unsure
            and c.id not in measured}


def summarize(tests: list[TestResult], profile, plan: dict | None = None) -> dict:
    """Counts and the run's verdict: FAIL (a check failed), ERROR (a test could not measure),
    INCOMPLETE (a criterion of the profile was not judged: not measured, or UNVERIFIED for
    want of device truth), INCONCLUSIVE (a criterion failed on its median but its interval holds
    the bound, where the profile says that decides nothing; or a baseline comparison the noise
    cannot decide), else PASS. A criterion a -k/-m subset left out (`not_selected`, from the
    run's `plan`) is listed as such and does not make the run INCOMPLETE."""
    verdicts = [v for t in tests for v in t.verdicts]
    regressions = [r for t in tests for r in t.regressions]
    measurements = [m for t in tests for m in t.measurements if is_final(m.get("context", {}))]
    judged = {v["id"] for v in verdicts}
    unjudged = [c.id for c in profile.criteria if c.id not in judged]
    left_out = not_selected(tests, profile, plan)
    not_judged = [c for c in unjudged if c not in left_out]
    unsure = [v["line"] for v in verdicts if v.get("inconclusive")] + \
        [r["line"] for r in regressions if r.get("inconclusive")]
    failed = sum(not v["passed"] and not v.get("inconclusive") for v in verdicts) + \
        sum(not r["passed"] for r in regressions)
    broken = sum(t.outcome == "broken" for t in tests)
    failed_tests = sum(t.outcome == "failed" for t in tests)
    if failed or failed_tests:
        verdict = "FAIL"
    elif broken:
        verdict = "ERROR"
    elif not_judged:
        verdict = "INCOMPLETE"
    elif unsure:
        verdict = "INCONCLUSIVE"
    else:
        verdict = "PASS"
    return {
        "verdict": verdict,
        "tests": len(tests),
        "tests_failed": failed_tests,
        "tests_broken": broken,
        "tests_skipped": sum(t.outcome == "skipped" for t in tests),
        "measurements": len(measurements),
        "informational": sum(m["id"] not in judged for m in measurements),
        "checks_passed": sum(v["passed"] for v in verdicts) + sum(r["passed"] for r in regressions),
        "checks_failed": failed,
        "improved": [r["id"] for r in regressions if r["improved"]],
        "inconclusive": unsure,
        "not_judged": not_judged,
        "not_selected": [c for c in unjudged if c in left_out],
        "caveats": sorted({c for v in verdicts for c in v.get("caveats", ())}),
        "unverified": [u for t in tests for u in t.unverified],
        "device_errors": [{"test": t.nodeid, **t.device_error} for t in tests
                          if t.device_error],
    }

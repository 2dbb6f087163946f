"""The pytest plugin: qual's options, fixtures and markers; verdicts after every test; the run
record and Allure metadata at the end of the session, written once, by the xdist controller.

A test records measurements through the `record` fixture and never asserts: once its body
returns, the plugin judges every measurement against the profile (and the baseline), records
them all, and fails the test once, with the first failing verdict on the first line. An engine
error raised by the body is left alone, so Allure shows it as broken, not failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import sys
import time
from pathlib import Path

import allure
import pytest

from qual import engine, report, thresholds, units
from qual.engine import QualError
from qual.honesty import ImplausibleMeasurement
from qual.record import (RECORD_NAME, Baseline, Measurement, drive_model, new_record, summarize,
                         write_record)
from qual.target import DEFAULT_TARGET, Target
from qual.workloads import FAMILIES, health

SESSION_KEY = pytest.StashKey["QualSession"]()
RECORDER_KEY = pytest.StashKey["Recorder"]()
# keys of report.user_properties: how a worker's results reach the controller under xdist
PAYLOAD, STATUS, QUAL_TEST, TARGET_INFO, DRIVE = ("qual", "qual_status", "qual_test",
                                                  "qual_target", "qual_drive")
QUAL_FIXTURES = {"target", "record"}
DRIVE_GROUP = "drive:"  # xdist group of every test that touches one drive


def pytest_addoption(parser):
    g = parser.getgroup("qual", "qual: NVMe SSD qualification")
    g.addoption("--qual-target", action="append", default=None, metavar="PATH",
                help="file, directory or block device to qualify (default: a scratch file "
                     f"{DEFAULT_TARGET}); several: each drive is qualified in turn, one run "
                     "record per drive")
    g.addoption("--qual-profile", default="ci", metavar="NAME|FILE",
                help="threshold profile: a shipped name (see `qual profiles`) or a .toml path "
                     "(default: ci)")
    g.addoption("--qual-results", default="qual-results", metavar="DIR",
                help="where the run record qual-run.json goes (default: qual-results)")
    g.addoption("--qual-baseline", action="append", default=None, metavar="FILE",
                help="a previous qual-run.json: a regression beyond the profile's tolerance "
                     "fails (one per --qual-target, in the same order)")
    g.addoption("--qual-baseline-any", action="store_true",
                help="gate against a baseline of another drive model or profile")
    g.addoption("--qual-allow-destructive", action="store_true",
                help="allow writes to a block device (the safety guard still applies)")
    g.addoption("--qual-confirm-serial", action="append", default=None, metavar="SERIAL",
                help="the serial of the block device you mean to overwrite (once per device)")
    g.addoption("--qual-keep-scratch", action="store_true",
                help="keep qual's scratch file after the run (the next run reuses it)")
    g.addoption("--qual-seed", type=int, default=1, metavar="N",
                help="seed of random offsets and write data (default 1, so runs are comparable)")


def pytest_configure(config):
    config.addinivalue_line("markers", "destructive: writes to the target; on a block device "
                                       "only when the safety guard allows it")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped where there is none")
    for name, family in FAMILIES.items():
        config.addinivalue_line("markers", f"{name}: {family.description}")
    session = QualSession(config)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "qual-session")


def qual_session(config) -> QualSession:
    return config.stash[SESSION_KEY]


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def profile(request) -> thresholds.Profile:
    """The loaded, validated threshold profile."""
    return qual_session(request.config).profile


def pytest_generate_tests(metafunc):
    """Several --qual-target: every test that touches a drive runs once per drive."""
    specs = qual_session(metafunc.config).target_specs
    if "target" in metafunc.fixturenames and len(specs) > 1:
        metafunc.parametrize("target", specs, indirect=True, scope="session",
                             ids=[f"drive{i}" for i in range(len(specs))])


@pytest.fixture(scope="session")
def target(request):
    """The target under qualification; qual's scratch file is removed at the end."""
    session = qual_session(request.config)
    t = session.open_target(getattr(request, "param", session.target_specs[0]))
    t.lock()
    yield t
    if not request.config.option.qual_keep_scratch:
        t.cleanup()
    t.unlock()


@pytest.fixture(scope="module")
def drive_health(request, target):
    """The drive's SMART health log when the suite starts; its test_drive_health, run last,
    reads it again and records what changed."""
    families = [m.name for m in request.node.iter_markers() if m.name in FAMILIES]
    return HealthWatch(health.Watch(target, families[0] if families else request.module.__name__))


class HealthWatch:
    def __init__(self, watch: health.Watch):
        self.watch = watch

    def measurements(self) -> list[Measurement]:
        if self.watch.reason:
            pytest.skip(f"no SMART health log: {self.watch.reason}")
        return self.watch.measurements()


@pytest.fixture(scope="session")
def progress(request):
    """A callable that shows one line of a long workload's progress on the terminal (not
    with -q); under xdist each line names its worker."""
    return qual_session(request.config).progress


@pytest.fixture(scope="module")
def table(request, profile) -> dict:
    """The profile's table for the suite's workload family (its marker), or a skip."""
    families = [m.name for m in request.node.iter_markers() if m.name in FAMILIES]
    if not families:
        raise pytest.UsageError(f"{request.node.name} is marked with no workload family")
    found = profile.table(families[0])
    if found is None:
        pytest.skip(f"profile {profile.name} has no [{families[0]}] table")
    return found


@pytest.fixture
def record(request) -> Recorder:
    """Where a test puts its measurements; the plugin judges them when the test returns."""
    rec = Recorder(request.node, qual_session(request.config))
    request.node.stash[RECORDER_KEY] = rec
    return rec


@pytest.fixture
def session_measurements(request, target) -> list[Measurement]:
    """Every measurement of this drive recorded so far by this process (for chart tests)."""
    return qual_session(request.config).measurements.setdefault(target.spec, [])


# ------------------------------------------------------------------ per test


class Recorder:
    def __init__(self, item, session: QualSession):
        self.item = item
        self.session = session
        self.measurements: list[Measurement] = []

    @property
    def seed(self) -> int:
        return self.session.config.option.qual_seed

    @property
    def spec(self) -> str:
        return self.session.spec_of(self.item)

    def add(self, measurements: list[Measurement]) -> None:
        self.measurements.extend(measurements)
        self.session.measurements.setdefault(self.spec, []).extend(measurements)

    def attach(self, name: str, body, kind: str = "png") -> None:
        types = {"png": allure.attachment_type.PNG, "json": allure.attachment_type.JSON,
                 "text": allure.attachment_type.TEXT}
        allure.attach(body, name=name, attachment_type=types[kind])

    def finish(self) -> None:
        """Judge, record and label everything, then fail once if any check failed."""
        __tracebackhide__ = True
        profile, baseline = self.session.profile, self.session.baselines.get(self.spec)
        verdicts, regressions, unresolved, severities = [], [], [], []
        for m in self.measurements:
            criteria = profile.criteria_for(m.id)
            severities += [c.severity for c in criteria]
            if criteria and not m.resolved:
                unresolved.append(f"{m.id} needs at least {m.context.get('samples_needed')} "
                                  f"samples but the run completed {m.context.get('ops')}: "
                                  "lengthen the run")
                continue
            ceiling = m.context.get("ceiling")  # the most the measuring setup itself can show
            for c in criteria:
                if ceiling is not None and c.min is not None and c.min > ceiling:
                    unresolved.append(
                        f"{c.id}: the profile asks for at least {units.format_quantity(c.min, c.unit)}"
                        f" but the simulation reaches only {units.format_quantity(ceiling, c.unit)} "
                        f"with no storage at all, so it cannot judge the drive [{c.file}]")
                    continue
                caveats = tuple(m.context.get("caveats", ()))
                verdicts.extend(dataclasses.replace(v, caveats=caveats) for v in c.judge(m.value))
            if baseline:
                tolerance = next((c.tolerance for c in criteria if c.tolerance is not None),
                                 profile.tolerance)
                r = baseline.compare(m, tolerance)
                if r:
                    regressions.append(r)
        payload = {"measurements": [m.as_dict() for m in self.measurements],
                   "verdicts": [v.as_dict() for v in verdicts],
                   "regressions": [r.as_dict() for r in regressions]}
        self.item.user_properties.append((PAYLOAD, payload))

        for metric in sorted({m.metric for m in self.measurements}):
            allure.dynamic.story(metric)
        order = thresholds.SEVERITIES
        allure.dynamic.severity(min(severities, key=order.index) if severities else "minor")
        self.attach("measurements.json", json.dumps(payload, indent=1, default=str), "json")

        for line in [v.line() for v in verdicts] + [r.line() for r in regressions]:
            print(line)
        if unresolved:
            raise ImplausibleMeasurement(errno.EBADE, "; ".join(unresolved),
                                         target=self.measurements[0].context.get("target"))
        failing = [v.line() for v in verdicts if not v.passed] + \
                  [r.line() for r in regressions if not r.passed]
        if failing:
            checks = len(verdicts) + len(regressions)
            pytest.fail("\n".join(failing + [f"({len(failing)} of {checks} checks failed)"]),
                        pytrace=False)


def _label(rec: Recorder) -> None:
    """The workload family, the drive and the profile on the Allure result, before the test's
    body runs (so a test that skips carries them too)."""
    families = [m.name for m in rec.item.iter_markers() if m.name in FAMILIES]
    if families:
        allure.dynamic.epic(families[0])
    drive = rec.session.drive_label(rec.spec)
    allure.dynamic.title(f"{rec.item.name} on {drive}")
    allure.dynamic.parameter("drive", drive)
    allure.dynamic.parameter("profile", rec.session.profile.name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    __tracebackhide__ = True
    rec = item.stash.get(RECORDER_KEY, None)
    if rec is not None:
        _label(rec)
    result = yield
    if rec is not None:
        rec.finish()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if QUAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        session = qual_session(item.config)
        spec = session.spec_of(item)
        extra = [(QUAL_TEST, True), (DRIVE, spec)]
        if rep.failed:
            exc = call.excinfo
            judged = rep.when == "call" and exc is not None and \
                (exc.errisinstance(AssertionError) or exc.errisinstance(pytest.fail.Exception))
            extra.append((STATUS, "failed" if judged else "broken"))
        info = session.target_info(spec)
        if info:
            extra.append((TARGET_INFO, info))
        rep.user_properties = [*rep.user_properties, *extra]  # a copy: item's list is shared
    return rep


# ------------------------------------------------------------------ the session


class QualSession:
    """Loaded before any I/O: the profile, the baselines and the targets' names; on the
    controller it gathers every qual test's report into one run record per drive."""

    def __init__(self, config):
        self.config = config
        opt = config.option
        self.controller = not hasattr(config, "workerinput")
        try:
            self.profile = thresholds.load_profile(opt.qual_profile)
        except thresholds.ProfileError as e:
            raise pytest.UsageError(f"--qual-profile {opt.qual_profile}: invalid profile:\n{e}") from None
        specs = opt.qual_target or [DEFAULT_TARGET]
        if len(set(specs)) != len(specs):
            raise pytest.UsageError("--qual-target: a drive is named twice")
        for spec in specs:
            given = Path(spec)
            if spec != DEFAULT_TARGET and not given.exists() and not given.parent.is_dir():
                raise pytest.UsageError(f"--qual-target {spec}: no such file, directory or "
                                        f"device, and {given.parent} is not a directory to "
                                        "create it in")
        self.target_specs: list[str] = specs
        self.baselines: dict[str, Baseline] = {}
        paths = opt.qual_baseline or []
        if paths and len(paths) != len(specs):
            raise pytest.UsageError(f"--qual-baseline: give one per --qual-target ({len(specs)}),"
                                    f" in the same order; got {len(paths)}")
        for spec, path in zip(specs, paths):
            try:
                self.baselines[spec] = Baseline(path)
            except ValueError as e:
                raise pytest.UsageError(f"--qual-baseline: {e}") from None
            theirs = self.baselines[spec].data.get("profile", {}).get("name")
            if theirs != self.profile.name and not opt.qual_baseline_any:
                raise pytest.UsageError(f"--qual-baseline {path}: it is a run of profile "
                                        f"{theirs}, not {self.profile.name} (--qual-baseline-any "
                                        "to gate against it anyway)")
        if self.controller and getattr(opt, "numprocesses", None):
            if opt.dist == "load":
                opt.dist = "loadgroup"  # one drive is measured by one worker at a time
            elif opt.dist not in ("loadgroup", "no"):
                raise pytest.UsageError(f"--dist {opt.dist} could measure one drive from two "
                                        "workers at once; qual needs --dist loadgroup")
        if not self.controller:
            # workers re-parse the original command line, which may lack --dist loadgroup;
            # the controller always schedules by group, so the workers must name the groups
            opt.loadgroup = True
        self.worker = getattr(config, "workerinput", {}).get("workerid")
        self.results_dir = Path(opt.qual_results)
        self._targets: dict[str, Target] = {}
        self._sent: set[str] = set()
        self.measurements: dict[str, list[Measurement]] = {}
        self.tests: dict[str, dict] = {}
        self.targets_reported: dict[str, dict] = {}
        self.records: dict[str, tuple[Path, dict]] = {}
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    def open_target(self, spec: str) -> Target:
        if spec not in self._targets:
            opt = self.config.option
            t = Target(spec if opt.qual_target else None,  # None: the default, made on demand
                       allow_destructive=opt.qual_allow_destructive,
                       confirm_serial=opt.qual_confirm_serial)
            baseline = self.baselines.get(spec)
            if baseline and not opt.qual_baseline_any:
                theirs = drive_model(baseline.data)
                if theirs != t.identity.model:
                    raise QualError(errno.EINVAL, f"--qual-baseline {baseline.path} is a run of "
                                    f"drive model {theirs}, not {t.identity.model} "
                                    "(--qual-baseline-any to gate against it anyway)",
                                    target=spec)
            t.progress = self.progress
            self._targets[spec] = t
        return self._targets[spec]

    def spec_of(self, item) -> str:
        """The drive a test runs on: its `target` parameter, else the only target."""
        callspec = getattr(item, "callspec", None)
        return callspec.params["target"] if callspec and "target" in callspec.params \
            else self.target_specs[0]

    def target_info(self, spec: str) -> dict | None:
        """A target's identity, sent to the controller once per process and drive."""
        t = self._targets.get(spec)
        if t is None or spec in self._sent:
            return None
        self._sent.add(spec)
        return {"spec": t.spec, "kind": t.kind, "path": str(t.path),
                "identity": t.identity.as_dict()}

    def drive_label(self, spec: str) -> str:
        t = self._targets.get(spec)
        label = t.identity.label() if t else spec
        return f"{label} at {spec}" if len(self.target_specs) > 1 else label

    def progress(self, message: str) -> None:
        if self.config.option.verbose < 0:
            return
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            if self.worker is None and tr is not None:
                tr.write_line(f"  {message}")
            else:  # a worker's stderr is the controller's: whole lines stay readable
                print(f"[{self.worker}] {message}", file=sys.__stderr__, flush=True)

    # ---- hooks (registered as a plugin object)

    def pytest_itemcollected(self, item):
        # marked as each item is collected, so the mark is there before any
        # pytest_collection_modifyitems (xdist's turns it into the group name)
        if QUAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(name=f"{DRIVE_GROUP}{self.spec_of(item)}"))

    def pytest_runtest_logreport(self, report):
        if not self.controller:
            return
        props = dict(report.user_properties)
        if not props.get(QUAL_TEST):
            return
        if TARGET_INFO in props:
            self.targets_reported.setdefault(props[TARGET_INFO]["spec"], props[TARGET_INFO])
        nodeid = report.nodeid.split(f"@{DRIVE_GROUP}")[0]  # xdist appends the group
        entry = self.tests.setdefault(nodeid, {
            "nodeid": nodeid, "drive": props.get(DRIVE, self.target_specs[0]),
            "outcome": "passed", "duration_s": 0.0, "message": None,
            "measurements": [], "verdicts": [], "regressions": []})
        entry["duration_s"] += report.duration
        if PAYLOAD in props and report.when == "call":
            entry.update(props[PAYLOAD])
        if report.failed and entry["outcome"] != "failed":
            entry["outcome"] = props.get(STATUS, "broken")
            entry["message"] = _short_message(report)
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
            entry["message"] = _short_message(report)

    def build_record(self, spec: str) -> dict:
        target = self.targets_reported.get(spec) or {"spec": spec}
        tests = [{k: v for k, v in t.items() if k != "drive"} for t in self.tests.values()
                 if t["drive"] == spec]
        backends = sorted({m["context"]["backend"] for t in tests for m in t["measurements"]
                           if "backend" in m["context"]})
        record = new_record(target=target, profile=self.profile.as_dict(),
                            engine={"io_uring": engine.io_uring_status() or "available",
                                    "backends_used": backends})
        record["started"] = self.started
        record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record["seed"] = self.config.option.qual_seed
        baseline = self.baselines.get(spec)
        record["baseline"] = str(baseline.path) if baseline else None
        record["tests"] = tests
        record["summary"] = summarize(tests, self.profile)
        return record

    def record_path(self, spec: str) -> Path:
        """results/qual-run.json; with several drives, results/<drive>/qual-run.json."""
        if len(self.target_specs) == 1:
            return self.results_dir / RECORD_NAME
        slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in spec.strip("/"))
        return self.results_dir / (slug or "drive") / RECORD_NAME

    def pytest_sessionfinish(self, session):
        if not self.controller or not self.tests:
            return
        alluredir = getattr(self.config.option, "allure_report_dir", None)
        for spec in self.target_specs:
            if not any(t["drive"] == spec for t in self.tests.values()):
                continue
            record = self.build_record(spec)
            path = self.record_path(spec)
            write_record(path, record)
            self.records[spec] = (path, record)
            if alluredir:
                report.write_summary_result(Path(alluredir), record, self.profile,
                                            drive=self.drive_label_of(record, spec))
        if alluredir and self.records:
            report.write_allure_metadata(Path(alluredir), [r for _, r in self.records.values()])

    def drive_label_of(self, record: dict, spec: str) -> str:
        ident = record["target"].get("identity")
        label = report.identity_label(ident) if ident else spec
        return f"{label} at {spec}" if len(self.target_specs) > 1 else label

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        for spec, (path, record) in self.records.items():
            tr.section(f"qual: {self.profile.name} on {self.drive_label_of(record, spec)}")
            for line in report.summary_lines(record):
                tr.write_line(line)
            s = record["summary"]
            tr.write_line(f"{s['measurements']} measurements ({s['informational']} informational), "
                          f"{s['checks_passed']} checks passed, {s['checks_failed']} failed, "
                          f"{s['tests_broken']} tests broken")
            for missing in s["not_judged"]:
                tr.write_line(f"not judged: {missing}")
            for caveat in s.get("caveats", ()):
                tr.write_line(f"CAVEAT: {caveat}", yellow=True)
            tr.write_line(f"verdict: {s['verdict']}    run record: {path}",
                          bold=True, red=s["verdict"] != "PASS", green=s["verdict"] == "PASS")


def _short_message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.removeprefix("Failed: ")  # pytest.fail's own prefix
    if isinstance(report.longrepr, tuple):  # skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[0] if report.longrepr else ""

"""The pytest plugin: qual's options, fixtures and markers; verdicts after every test; the run
record and Allure metadata at the end of the session, written once, by the xdist controller.

A test records measurements through the `record` fixture and never asserts: once its body
returns, the plugin judges every measurement against the profile (and the baseline), records
them all, and fails the test once, with the first failing verdict on the first line. An engine
error raised by the body is left alone, so Allure shows it as broken, not failed.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import time
from pathlib import Path

import allure
import pytest

from qual import engine, report, thresholds, units
from qual.honesty import ImplausibleMeasurement
from qual.record import RECORD_NAME, Baseline, Measurement, new_record, summarize, write_record
from qual.target import DEFAULT_TARGET, Target
from qual.workloads import FAMILIES

SESSION_KEY = pytest.StashKey["QualSession"]()
RECORDER_KEY = pytest.StashKey["Recorder"]()
# keys of report.user_properties: how a worker's results reach the controller under xdist
PAYLOAD, STATUS, QUAL_TEST, TARGET_INFO = "qual", "qual_status", "qual_test", "qual_target"
QUAL_FIXTURES = {"target", "record"}
DRIVE_GROUP = "drive:"  # xdist group of every test that touches one drive


def pytest_addoption(parser):
    g = parser.getgroup("qual", "qual: NVMe SSD qualification")
    g.addoption("--qual-target", action="append", default=None, metavar="PATH",
                help="file, directory or block device to qualify "
                     f"(default: a scratch file {DEFAULT_TARGET})")
    g.addoption("--qual-profile", default="ci", metavar="NAME|FILE",
                help="threshold profile: a shipped name (see `qual profiles`) or a .toml path "
                     "(default: ci)")
    g.addoption("--qual-results", default="qual-results", metavar="DIR",
                help="where the run record qual-run.json goes (default: qual-results)")
    g.addoption("--qual-baseline", default=None, metavar="FILE",
                help="a previous qual-run.json: a regression beyond the profile's tolerance fails")
    g.addoption("--qual-allow-destructive", action="store_true",
                help="allow writes to a block device (the safety guard still applies)")
    g.addoption("--qual-confirm-serial", default=None, metavar="SERIAL",
                help="the serial of the block device you mean to overwrite")
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


@pytest.fixture(scope="session")
def target(request):
    """The target under qualification; qual's scratch file is removed at the end."""
    session = qual_session(request.config)
    t = session.open_target()
    t.lock()
    yield t
    if not request.config.option.qual_keep_scratch:
        t.cleanup()
    t.unlock()


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
def session_measurements(request) -> list[Measurement]:
    """Every measurement recorded so far by this process (for chart tests)."""
    return qual_session(request.config).measurements


# ------------------------------------------------------------------ per test


class Recorder:
    def __init__(self, item, session: QualSession):
        self.item = item
        self.session = session
        self.measurements: list[Measurement] = []

    @property
    def seed(self) -> int:
        return self.session.config.option.qual_seed

    def add(self, measurements: list[Measurement]) -> None:
        self.measurements.extend(measurements)
        self.session.measurements.extend(measurements)

    def attach(self, name: str, body, kind: str = "png") -> None:
        types = {"png": allure.attachment_type.PNG, "json": allure.attachment_type.JSON,
                 "text": allure.attachment_type.TEXT}
        allure.attach(body, name=name, attachment_type=types[kind])

    def finish(self) -> None:
        """Judge, record and label everything, then fail once if any check failed."""
        __tracebackhide__ = True
        profile, baseline = self.session.profile, self.session.baseline
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

        families = [m.name for m in self.item.iter_markers() if m.name in FAMILIES]
        if families:
            allure.dynamic.epic(families[0])
        for metric in sorted({m.metric for m in self.measurements}):
            allure.dynamic.story(metric)
        order = thresholds.SEVERITIES
        allure.dynamic.severity(min(severities, key=order.index) if severities else "minor")
        drive = self.session.drive_label()
        allure.dynamic.title(f"{self.item.name} on {drive}")
        allure.dynamic.parameter("drive", drive)
        allure.dynamic.parameter("profile", profile.name)
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    __tracebackhide__ = True
    result = yield
    rec = item.stash.get(RECORDER_KEY, None)
    if rec is not None:
        rec.finish()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if QUAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        extra = [(QUAL_TEST, True)]
        if rep.failed:
            exc = call.excinfo
            judged = rep.when == "call" and exc is not None and \
                (exc.errisinstance(AssertionError) or exc.errisinstance(pytest.fail.Exception))
            extra.append((STATUS, "failed" if judged else "broken"))
        info = qual_session(item.config).target_info()
        if info:
            extra.append((TARGET_INFO, info))
        rep.user_properties = [*rep.user_properties, *extra]  # a copy: item's list is shared
    return rep


# ------------------------------------------------------------------ the session


class QualSession:
    """Loaded before any I/O: the profile, the baseline and the target's name; on the
    controller it gathers every qual test's report into the run record."""

    def __init__(self, config):
        self.config = config
        opt = config.option
        self.controller = not hasattr(config, "workerinput")
        try:
            self.profile = thresholds.load_profile(opt.qual_profile)
        except thresholds.ProfileError as e:
            raise pytest.UsageError(f"--qual-profile {opt.qual_profile}: invalid profile:\n{e}") from None
        self.baseline = None
        if opt.qual_baseline:
            try:
                self.baseline = Baseline(opt.qual_baseline)
            except ValueError as e:
                raise pytest.UsageError(f"--qual-baseline: {e}") from None
        specs = opt.qual_target or [None]
        if len(specs) > 1:
            raise pytest.UsageError("--qual-target: give one target per run")
        self.target_spec = specs[0]
        if self.target_spec is not None:
            given = Path(self.target_spec)
            if not given.exists() and not given.parent.is_dir():
                raise pytest.UsageError(f"--qual-target {self.target_spec}: no such file, "
                                        f"directory or device, and {given.parent} is not a "
                                        "directory to create it in")
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
        self.results_dir = Path(opt.qual_results)
        self._target: Target | None = None
        self._target_sent = False
        self.measurements: list[Measurement] = []
        self.tests: dict[str, dict] = {}
        self.target_reported: dict | None = None
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    def open_target(self) -> Target:
        if self._target is None:
            opt = self.config.option
            self._target = Target(self.target_spec, allow_destructive=opt.qual_allow_destructive,
                                  confirm_serial=opt.qual_confirm_serial)
        return self._target

    def target_info(self) -> dict | None:
        """The target's identity, sent to the controller once per process."""
        if self._target is None or self._target_sent:
            return None
        self._target_sent = True
        t = self._target
        return {"spec": t.spec, "kind": t.kind, "path": str(t.path),
                "identity": t.identity.as_dict()}

    def drive_label(self) -> str:
        return self._target.identity.label() if self._target else (self.target_spec or DEFAULT_TARGET)

    # ---- hooks (registered as a plugin object)

    def pytest_itemcollected(self, item):
        # marked as each item is collected, so the mark is there before any
        # pytest_collection_modifyitems (xdist's turns it into the group name)
        if QUAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(name=f"{DRIVE_GROUP}{self.target_spec or DEFAULT_TARGET}"))

    def pytest_runtest_logreport(self, report):
        if not self.controller:
            return
        props = dict(report.user_properties)
        if not props.get(QUAL_TEST):
            return
        if TARGET_INFO in props and self.target_reported is None:
            self.target_reported = props[TARGET_INFO]
        nodeid = report.nodeid.split(f"@{DRIVE_GROUP}")[0]  # xdist appends the group
        entry = self.tests.setdefault(nodeid, {
            "nodeid": nodeid, "outcome": "passed", "duration_s": 0.0, "message": None,
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

    def build_record(self) -> dict:
        target = self.target_reported or {"spec": self.target_spec or DEFAULT_TARGET}
        tests = list(self.tests.values())
        backends = sorted({m["context"]["backend"] for t in tests for m in t["measurements"]
                           if "backend" in m["context"]})
        record = new_record(target=target, profile=self.profile.as_dict(),
                            engine={"io_uring": engine.io_uring_status() or "available",
                                    "backends_used": backends})
        record["started"] = self.started
        record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record["seed"] = self.config.option.qual_seed
        record["baseline"] = str(self.baseline.path) if self.baseline else None
        record["tests"] = tests
        record["summary"] = summarize(tests, self.profile)
        return record

    def pytest_sessionfinish(self, session):
        if not self.controller or not self.tests:
            return
        record = self.build_record()
        self.record_path = self.results_dir / RECORD_NAME
        write_record(self.record_path, record)
        alluredir = getattr(self.config.option, "allure_report_dir", None)
        if alluredir:
            report.write_allure_metadata(Path(alluredir), record)
        self.record = record

    def pytest_terminal_summary(self, terminalreporter):
        record = getattr(self, "record", None)
        if record is None:
            return
        tr = terminalreporter
        tr.section(f"qual: {self.profile.name} on {report.environment(record).get('drive.model', record['target']['spec'])}")
        rows = report.verdict_rows(record["tests"])
        for line in report.table_lines(rows) if rows else ["(no criterion was judged)"]:
            tr.write_line(line)
        s = record["summary"]
        tr.write_line(f"{s['measurements']} measurements ({s['informational']} informational), "
                      f"{s['checks_passed']} checks passed, {s['checks_failed']} failed, "
                      f"{s['tests_broken']} tests broken")
        for missing in s["not_judged"]:
            tr.write_line(f"not judged: {missing}")
        for caveat in s.get("caveats", ()):
            tr.write_line(f"CAVEAT: {caveat}", yellow=True)
        tr.write_line(f"verdict: {s['verdict']}    run record: {self.record_path}",
                      bold=True, red=s["verdict"] != "PASS", green=s["verdict"] == "PASS")


def _short_message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.removeprefix("Failed: ")  # pytest.fail's own prefix
    if isinstance(report.longrepr, tuple):  # skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[0] if report.longrepr else ""

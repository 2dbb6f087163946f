"""The pytest hooks of qual's plugin: its options, fixtures and markers, the recorder around
every test's body, and the labels on every report. The session (qual.plugin.session) holds the
state; the recorder (qual.plugin.recorder) judges.

A test records measurements through the `record` fixture and never asserts: once its body
returns, the plugin judges every measurement against the profile (and the baseline), records
them all, and fails the test once, with the first failing verdict on the first line. An error
the drive returned (EIO, a short transfer, wrong data: DeviceIoError) is a qualification result:
the test fails naming the operation, the offset and the errno, and the record counts it. Any
other error raised by the body (a stall included) is left alone, so Allure shows it as broken,
not failed.
"""

from __future__ import annotations

import time

import allure
import pytest

from qual import report, thresholds
from qual.errors import DataMismatch, DeviceIoError, NotApplicable, Stalled, errno_name
from qual.plugin.recorder import Recorder
from qual.plugin.session import (DEPARTED, DEVICE_ERROR, DRIVE, QUAL_FIXTURES, QUAL_TEST,
                                 SESSION_KEY, STATUS, TARGET_INFO, WHERE, QualSession,
                                 qual_session, short_message)
from qual.measurement import Measurement
from qual.flags import claimed
from qual.settings import argument
from qual.targets import DEFAULT_TARGET, drive_status
from qual.workloads import registry
from qual.workloads.base import Repeated

RECORDER_KEY = pytest.StashKey["Recorder"]()
DEVICE_ERROR_KEY = pytest.StashKey[dict]()


def _family_of(node) -> str | None:
    """The workload family a suite is marked with."""
    return qual_session(node.config).family_of(node)


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
    g.addoption("--qual-store", default=None, metavar="URL|PATH|off",
                help="the results store each drive's record also goes to as the run ends: an "
                     "SQLite file or postgresql://USER@HOST:PORT/DB (default: $QUAL_STORE, "
                     "else ~/.local/share/qual/qual-store.sqlite); off: none")
    g.addoption("--qual-baseline", action="append", default=None, metavar="FILE|DIR|SELECTOR",
                help="a previous qual-run.json, a folder of runs of the old firmware, or the "
                     "store's runs a selector picks ('model=X firmware=1.2', 'serial=S', "
                     "'last=N'; docs/store.md), their repetitions pooled: a regression beyond "
                     "the profile's tolerance fails (one per --qual-target, in the same order)")
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
    g.addoption("--qual-repeats", type=argument(thresholds.REPEATS), default=None, metavar="N",
                help="measure every judged figure N times, interleaved, and judge the median "
                     "with its interval (default: the profile's `repeats`)")
    g.addoption("--qual-fit", action="store_true",
                help="scale a region or dataset larger than the target down to fit it (every "
                     "scaled figure carries a CAVEAT), instead of refusing the run")
    g.addoption("--qual-resume", action="store_true",
                help="continue the run whose journal is in --qual-results (killed, stopped): "
                     "the tests it finished are kept, the rest run; refused for another "
                     "profile, drive serial or firmware, or qual version")
    for family in registry().values():  # a family's setting a rig gives per run
        for f in family.fields:
            if f.run_flag:
                g.addoption(f.run_flag, default=None, metavar=f.kind.upper(),
                            help=f"{f.help} (over the profile's {family.name}.{f.name})")
    g.addoption("--qual-plan", default=None, metavar="FILE",
                help="make the run's plan (tests, bytes, estimated seconds, refusals), write it "
                     "to FILE as JSON (- for stdout) and run nothing")


def pytest_configure(config):
    config.addinivalue_line("markers", "destructive: writes to the target; on a block device "
                                       "only when the safety guard allows it")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped where there is none")
    session = QualSession(config)
    for name, family in session.families.items():
        config.addinivalue_line("markers", f"{name}: {family.description}")
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "qual-session")


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def profile(request) -> thresholds.Profile:
    """The loaded, validated threshold profile."""
    return qual_session(request.config).profile


def pytest_generate_tests(metafunc):
    """A family's declared test that runs for each value of its table gets its values; with
    several --qual-target, every test that touches a drive runs once per drive."""
    declared = getattr(metafunc.function, "qual_declared", None)
    if declared is not None and declared.run is not None:
        _parametrize_each(metafunc, declared)
    specs = qual_session(metafunc.config).target_specs
    if "target" in metafunc.fixturenames and len(specs) > 1:
        metafunc.parametrize("target", specs, indirect=True, scope="module",
                             ids=[f"drive{i}" for i in range(len(specs))])


@pytest.fixture(scope="module")
def target(request):
    """The target under qualification, held (locked) from its first test to the end of the
    session, when qual's scratch file and filesystem go. On a raw namespace, a file family's
    suite gets a folder on the filesystem qual makes on the device (docs/ARCHITECTURE.md, "A
    raw namespace")."""
    session = qual_session(request.config)
    spec = getattr(request, "param", session.target_specs[0])
    family = session.families.get(_family_of(request.node) or "")
    if family and family.filesystem and session.profile.table(family.name) is None:
        pytest.skip(f"profile {session.profile.name} has no [{family.name}] table")  # no mkfs
    return session.held_target(spec, filesystem=bool(family and family.filesystem))


WATCHES = "family_watches"


def pytest_collectstart(collector):
    """A suite gets the tests its family declares (Family.tests), after the suite's own
    functions; and where a watcher family covers it (health), the watcher's test,
    test_<watcher>, last, the watches starting with the suite (the `family_watches`
    fixture): no suite names a watcher, and a family added through QUAL_FAMILIES is made and
    watched like qual's own."""
    if not isinstance(collector, pytest.Module):
        return
    try:
        module = collector.obj  # imported here; an import error is reported by collect()
    except Exception:  # noqa: BLE001
        return
    session = qual_session(collector.config)
    family = session.families.get(session.family_of(collector) or "")
    for declared in (family.tests if family else ()):
        if not hasattr(module, declared.id):  # a suite may write one of its own
            kind = _each_test if declared.run else _summary_test if declared.summary \
                else _declared_test
            made = kind(declared, module.__name__)
            made.qual_declared = declared  # for pytest_generate_tests: its values
            setattr(module, declared.id, made)
    watchers = session.watchers_of(session.family_of(collector))
    for watcher in watchers:
        setattr(module, f"test_{watcher.name}", _watch_test(watcher, module.__name__))
    if watchers:
        collector.add_marker(pytest.mark.usefixtures(WATCHES))


def _declared_test(declared, module: str):
    """The test a family declares (qual.family.SuiteTest): one section of the suite's shared
    run recorded, the named charts attached."""
    def test(request, table, record):
        why = declared.skip(table) if declared.skip else None
        if why:
            pytest.skip(why)
        # the shared run only now: a test that skips does not start it
        outcome = request.getfixturevalue("outcome")
        record.outcome(outcome, section=declared.section, charts=declared.charts)
    return _as_declared(test, declared, module)


def _each_test(declared, module: str):
    """The test a family declares for each value of its table (SuiteTest.each): a run of its
    own, recorded whole, its lines printed, its charts and texts attached."""
    def test(request, qual_value, repetition, table, target, record, progress):
        why = declared.skip(table) if declared.skip else None
        if why:
            pytest.skip(why)
        record.repeat(repetition)
        kept = {}
        if declared.keeps_state:
            kept = {"resume": request.config.option.qual_resume, "state": qual_session(
                request.config).record_path(target.spec).with_name(f"{declared.name}.state")}
        try:
            outcome = declared.run(target, table, qual_value, seed=record.seed,
                                   progress=progress, **kept)
        except NotApplicable as e:  # nothing of it applies to this drive: said, not failed
            pytest.skip(f"not applicable: {e.message}")
        for line in outcome.lines():
            print(line)
        record.outcome(outcome, charts=declared.charts)
    return _as_declared(test, declared, module)


def _summary_test(declared, module: str):
    """The test a family declares over what it measured before it in this process
    (SuiteTest.summary): its charts, or a skip saying why there are none."""
    def test(session_measurements, record):
        family = qual_session(record.item.config).family_of(record.item)
        if not record.drawing:
            pytest.skip("no Allure results asked for (--alluredir): no charts drawn")
        mine = [m.as_dict() for m in session_measurements if m.family == family and m.final]
        drawn = declared.summary(mine)
        if isinstance(drawn, str):
            pytest.skip(drawn)
        for title, png in drawn.items():
            record.attach(title, png)
    return _as_declared(test, declared, module)


def _as_declared(test, declared, module: str):
    return _named(test, declared.id, module, declared.description, declared.feature)


def _named(test, name: str, module: str, doc: str, feature: str):
    """A test the plugin made, as pytest and Allure see it: its name, module, docstring and
    feature."""
    test.__name__ = test.__qualname__ = name
    test.__module__ = module
    test.__doc__ = doc
    return allure.feature(feature)(test)


def _parametrize_each(metafunc, declared) -> None:
    """A declared test's values under this profile, one test each (ids from its labels), each
    repeated `repeats` times and interleaved where it is `repeated`; a value that writes is
    marked destructive. One that runs once is parametrized by its repetitions alone (ids
    r1 … rN)."""
    session = qual_session(metafunc.config)
    if declared.each is None:
        if declared.repeated and session.repeats > 1:
            params, ids = session.repetitions(["once"])
            metafunc.parametrize("repetition", [rep for rep, _ in params],
                                 ids=[i.removeprefix("once-") for i in ids])
        return
    table = session.profile.table(session.family_of(metafunc.definition))
    values = {declared.label(v): v for v in (declared.each(table) if table else [])}

    def marks(label):
        return [pytest.mark.destructive] if declared.destructive(values[label]) else []
    if declared.repeated:
        params, ids = session.repetitions(list(values))
        metafunc.parametrize(["qual_value", "repetition"], [
            pytest.param(values[label], rep, id=i, marks=marks(label))
            for (rep, label), i in zip(params, ids)])
    else:
        metafunc.parametrize("qual_value", [pytest.param(v, id=label, marks=marks(label))
                                            for label, v in values.items()])


def _watch_test(watcher, module: str):
    def test(family_watches, record):
        watch = family_watches[watcher.name]
        if watch.reason:
            pytest.skip(watch.reason)
        record.add(watch.measurements())
        for title, png in (watch.charts() if record.drawing else {}).items():
            record.attach(title, png)
    return _named(test, f"test_{watcher.name}", module,
                  f"{watcher.description}: what it saw while this suite ran.",
                  watcher.description)


@pytest.fixture(scope="module")
def family_watches(request, target) -> dict:
    """Every watcher's watch over this suite's family on this target, from the suite's first
    test to its end (read by test_<watcher>, stopped when the suite ends, read or not)."""
    session = qual_session(request.config)
    family = _family_of(request.node)
    watches = {w.name: w.watch.start(target, family) for w in session.watchers_of(family)}
    yield watches
    for watch in watches.values():
        watch.stop()


@pytest.fixture(scope="module")
def outcome(request, table, target, progress, repeats):
    """A suite's shared outcome: its family's whole run `repeats` times over (each figure the
    median: workloads.base.Repeated), read by the suite's tests; what the family made is
    removed when the suite ends, unless --qual-keep-scratch. A family whose own field takes
    the seed (training's file order, new every run) is not given --qual-seed."""
    family = qual_session(request.config).families[_family_of(request.node)]
    if family.filesystem and target.directory is None:
        pytest.skip(f"the {family.name} family works on files: qualify a directory on the drive")
    seeded = {} if "--seed" in claimed(family.fields) else \
        {"seed": request.config.option.qual_seed}
    try:
        yield Repeated.of(family, target, table, repeats, progress, **seeded)
    finally:
        if family.remove and not request.config.option.qual_keep_scratch:
            family.remove(target)


@pytest.fixture(scope="session")
def progress(request):
    """A callable that shows one line of a long workload's progress on the terminal (not
    with -q); under xdist each line names its worker."""
    return qual_session(request.config).progress


@pytest.fixture(scope="module")
def table(request, profile) -> dict:
    """The profile's table for the suite's workload family (its marker), or a skip."""
    family = _family_of(request.node)
    if family is None:
        raise pytest.UsageError(f"{request.node.name} is marked with no workload family")
    found = profile.table(family)
    if found is None:
        pytest.skip(f"profile {profile.name} has no [{family}] table")
    return found


@pytest.fixture
def qual_value():
    """The value a family's declared test runs for (SuiteTest.each); None where it runs once."""
    return None


@pytest.fixture
def repetition() -> tuple[int, int]:
    """(this repetition, of how many): (1, 1) unless a suite parametrizes its repeated tests
    with qual_session(config).repetitions()."""
    return (1, 1)


@pytest.fixture(scope="session")
def repeats(request) -> int:
    """How many times a suite measures each judged figure (the profile's `repeats`, or
    --qual-repeats)."""
    return qual_session(request.config).repeats


@pytest.fixture
def record(request) -> Recorder:
    """Where a test puts its measurements; the plugin judges them when the test returns."""
    rec = qual_session(request.config).recorder(request.node)
    request.node.stash[RECORDER_KEY] = rec
    r, n = _repetition_of(request.node)
    if n > 1:  # before Allure's listener adds the pytest parameters: see _judged_name
        allure.dynamic.parameter("repetition", f"{r} of {n}", excluded=True)
    return rec


def _repetition_of(item) -> tuple[int, int]:
    spec = getattr(item, "callspec", None)
    return tuple(spec.params.get("repetition", (1, 1))) if spec else (1, 1)


def _judged_name(item) -> str:
    """A repeated test's name without its repetition (test_x[bs=1M-r2] -> test_x[bs=1M]).
    Its repetitions are one test in the Allure report: the repetition parameter is excluded
    from the test's identity, so the last repetition, which judges the median, is the test
    and carries the verdict, and the earlier ones are its retries (the evidence); none shows
    as a failing test of its own (docs/ARCHITECTURE.md §5)."""
    r, n = _repetition_of(item)
    if n == 1:
        return item.name
    base, _, rest = item.name.partition("[")
    params = rest.removesuffix("]").removesuffix(f"r{r}").removesuffix("-")
    return f"{base}[{params}]" if params else base


@pytest.fixture
def session_measurements(request, target) -> list[Measurement]:
    """Every measurement of this drive recorded so far by this process (for chart tests)."""
    return qual_session(request.config).measurements.setdefault(target.spec, [])


def _label(rec: Recorder) -> None:
    """The workload family, the drive and the profile on the Allure result, before the test's
    body runs (so a test that skips carries them too)."""
    family = _family_of(rec.item)
    if family:
        allure.dynamic.epic(family)
    session = qual_session(rec.item.config)
    drive = session.drive_label(session.spec_of(rec.item))
    allure.dynamic.title(f"{_judged_name(rec.item)} on {drive}")
    allure.dynamic.parameter("drive", drive)
    allure.dynamic.parameter("profile", session.profile.name)
    allure.dynamic.label(report.NODEID_LABEL, rec.item.nodeid)  # what a resumed run keeps


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    __tracebackhide__ = True
    rec = item.stash.get(RECORDER_KEY, None)
    if rec is not None:
        _label(rec)
    started = time.monotonic() - 1  # the kernel log's clock runs a little apart from ours
    try:
        result = yield
    except Stalled as e:  # the storage stopped answering: ends the run, where it can
        if rec is not None:
            qual_session(item.config).engine_stalled(item, e)
        raise
    except DeviceIoError as e:
        if rec is None:
            raise
        # the drive's answer, not qual's failure: the test fails with it (it is not broken),
        # naming the drive's own status and the LBAs where the kernel logged them
        said = None if isinstance(e, DataMismatch) else \
            qual_session(item.config).drive_said(item, e, started)
        item.stash[DEVICE_ERROR_KEY] = {"op": e.op, "offset": e.offset, "target": e.target,
                                        "errno": errno_name(e.errno), "message": str(e),
                                        **({"drive": said} if said else {})}
        raise pytest.fail.Exception(f"the drive returned an error: {e}" + (
            f"; {drive_status.describe(said)}" if said else ""), pytrace=False) from e
    if rec is not None:
        rec.finish()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if QUAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        session = qual_session(item.config)
        spec = session.spec_of(item)
        extra = [(QUAL_TEST, True), (DRIVE, spec),
                 (WHERE, session.where(spec, session.family_of(item)))]
        if rep.failed:
            exc = call.excinfo
            judged = rep.when == "call" and exc is not None and \
                (exc.errisinstance(AssertionError) or exc.errisinstance(pytest.fail.Exception))
            # a drive error or a broken test may be a drive going away: asked again a moment
            settle = not judged or DEVICE_ERROR_KEY in item.stash
            gone = session.departed_with(item, settle=settle)
            if gone and item.nodeid.startswith(gone["test"]):  # the test that met it: ERROR
                rep.longrepr = f"device gone: {gone['what']} (the test met: " \
                               f"{short_message(rep)})"
                judged = False
                extra.append((DEPARTED, gone))
            extra.append((STATUS, "failed" if judged else "broken"))
        if rep.when == "call" and DEVICE_ERROR_KEY in item.stash:
            extra.append((DEVICE_ERROR, item.stash[DEVICE_ERROR_KEY]))
        info = session.target_info(spec)
        if info:
            extra.append((TARGET_INFO, info))
        rep.user_properties = [*rep.user_properties, *extra]  # a copy: item's list is shared
    return rep



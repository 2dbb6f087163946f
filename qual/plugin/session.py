"""The qual session: loaded before any I/O (the profile, the baselines, the targets' names);
on the xdist controller it gathers every qual test's report into one run record per drive,
writes the Allure summary and metadata, and prints the verdict."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import time
import uuid
from pathlib import Path

import pytest

from qual import report, store, thresholds, watchdog
from qual.errors import QualError
from qual.plan import Plan, Selected, make_plan
from qual.targets.filesystem import (OPTIONS as MKFS_OPTIONS, QualFilesystem, erase_leftover,
                                   private_mounts)
from qual.exits import Exit, of_verdicts
from qual.plugin.journal import JOURNAL_NAME, Journal
from qual.plugin.progress import Console, Eta, drive_summary
from qual.plugin.records import RecordWriter, Stopped
from qual.plugin.stalls import StallHandler
from qual.plugin.recorder import Judging, PAYLOAD, Recorder
from qual.record import Baseline, LAST_RECORD, RunRecord, TestResult, drive_model, qual_version
from qual.measurement import Measurement
from qual.targets import DEFAULT_TARGET, Target, drive_label, drive_status
from qual.workloads import registry

SESSION_KEY = pytest.StashKey["QualSession"]()
# keys of report.user_properties: how a worker's results reach the controller under xdist
STATUS, QUAL_TEST, TARGET_INFO, DRIVE, WHERE, DEVICE_ERROR = (
    "qual_status", "qual_test", "qual_target", "qual_drive", "qual_where", "qual_device_error")
DEPARTED = "qual_device_gone"
QUAL_FIXTURES = {"target", "record"}
DRIVE_GROUP = "drive:"  # xdist group of every test that touches one drive
PLUGIN_FLAGS = ("--qual-allow-destructive", "--qual-confirm-serial")  # the guard's refusals
GONE_SETTLE_S = 2.0  # how long a drive that broke a test is asked again whether it is gone


def _is_block(spec: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(spec).st_mode)
    except OSError:
        return False


def qual_session(config) -> QualSession:
    return config.stash[SESSION_KEY]


class QualSession:
    """Loaded before any I/O: the profile, the baselines and the targets' names; on the
    controller it gathers every qual test's report into one run record per drive."""

    def __init__(self, config):
        self.config = config
        opt = config.option
        self.controller = not hasattr(config, "workerinput")
        self.watchdog: watchdog.Watchdog | None = None  # one process, from the first test on
        try:
            self.families = registry()
            self.profile = thresholds.load_profile(opt.qual_profile, self.families)
        except thresholds.ProfileError as e:
            raise pytest.UsageError(f"--qual-profile {opt.qual_profile}: invalid profile:\n{e}") from None
        self._run_settings(opt)
        specs = opt.qual_target or [DEFAULT_TARGET]
        if len(set(specs)) != len(specs):
            raise pytest.UsageError("--qual-target: a drive is named twice")
        self.target_specs: list[str] = specs
        alluredir = getattr(opt, "allure_report_dir", None)
        self.writer = RecordWriter(self.profile, Path(opt.qual_results), specs,
                                   seed=opt.qual_seed, store_url=opt.qual_store,
                                   alluredir=Path(alluredir) if alluredir else None)
        try:  # a store named wrongly is refused before any I/O; one that is down, at the end
            store.check_url(opt.qual_store)
        except store.StoreError as e:  # as `qual run --store` and every command say it
            pytest.exit(f"--qual-store: {e}", returncode=Exit.USAGE)
        # a worker xdist started in place of one whose drive stopped answering never touches
        # that drive again (a stat of it may never return)
        self.abandoned = {spec for spec in specs if not self.controller and
                          self.stall_note(spec).exists()}
        for spec in set(specs) - self.abandoned:
            given = Path(spec)
            if spec != DEFAULT_TARGET and not given.exists() and not given.parent.is_dir():
                raise pytest.UsageError(f"--qual-target {spec}: no such file, directory or "
                                        f"device, and {given.parent} is not a directory to "
                                        "create it in")
        self.baselines: dict[str, Baseline] = {}
        paths = opt.qual_baseline or []
        if paths and len(paths) != len(specs):
            raise pytest.UsageError(f"--qual-baseline: give one per --qual-target ({len(specs)}),"
                                    f" in the same order; got {len(paths)}")
        for spec, path in zip(specs, paths):
            try:  # record files, or the store's runs a selector picks (before any I/O)
                self.baselines[spec] = store.baseline(path, opt.qual_store,
                                                      profile=self.profile.name)
            except (ValueError, store.StoreError) as e:
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
            watchdog.bind_to_parent(os.getppid())  # a worker dies with the run that started it
        self.worker = getattr(config, "workerinput", {}).get("workerid")
        self._targets: dict[str, Target] = {}
        self._sent: set[str] = set()
        self.measurements: dict[str, list[Measurement]] = {}
        self.tests: dict[str, TestResult] = {}
        self.targets_reported: dict[str, dict] = {}
        self.records: dict[str, tuple[Path, dict]] = {}
        self.plans: dict[str, Plan] = {}
        self.caveats: dict[str, dict[str, str]] = {}  # drive -> family -> what --qual-fit did
        self.refused: str | None = None
        self.deselected: list = []  # by -k/-m: their families' criteria are `not selected`
        self.eta = Eta()
        self.console = Console(config, self.worker)
        self.stalls = StallHandler(self.writer, self.worker, self._show)
        self.progress, self.say = self.console.progress, self.console.say
        self.distributed = bool(getattr(opt, "numprocesses", None))
        self._held: set[str] = set()
        self._filesystems: dict[str, QualFilesystem] = {}
        self._fs_targets: dict[str, Target] = {}
        self.raw = {spec for spec in specs if spec not in self.abandoned and _is_block(spec)}
        self.departed: dict[str, dict] = {}  # drive -> where its device went away mid-run
        self.journals = {spec: self._journal(spec, opt.qual_resume) for spec in specs}
        if self.controller and not opt.qual_plan:
            for spec in specs:  # a stall this run's workers note is this run's alone
                self.stall_note(spec).unlink(missing_ok=True)
        if self.raw and os.geteuid() == 0:
            # now, while this process has one thread: the filesystem qual may make on the
            # device is mounted where only this process sees it (targets/filesystem.py)
            with contextlib.suppress(QualError):
                private_mounts()

    def open_target(self, spec: str) -> Target:
        if spec not in self._targets:
            opt = self.config.option
            t = Target(spec if opt.qual_target else None,  # None: the default, made on demand
                       allow_destructive=opt.qual_allow_destructive,
                       confirm_serial=opt.qual_confirm_serial, consent_flags=PLUGIN_FLAGS)
            baseline = self.baselines.get(spec)
            if baseline and not opt.qual_baseline_any:
                theirs = drive_model(baseline.data)
                if theirs != t.identity.model:
                    raise QualError(errno.EINVAL, f"--qual-baseline {baseline.path} is a run of "
                                    f"drive model {theirs}, not {t.identity.model} "
                                    "(--qual-baseline-any to gate against it anyway)",
                                    target=spec)
            t.progress = self.progress
            t.fill_reads = True  # a read test reads blocks this run wrote (docs/ARCHITECTURE.md, "Reads of written blocks")
            self._targets[spec] = t
        return self._targets[spec]

    def _journal(self, spec: str, resume: bool) -> Journal:
        """The drive's journal beside its record (qual.plugin.journal). Resuming, the tests it
        holds are this run's already: their results, and their measurements for the judging
        of later repetitions; the run's start and its first plan are the journal's."""
        path = self.record_path(spec).with_name(JOURNAL_NAME)
        if not resume:
            return Journal(path)
        try:
            journal = Journal.load(path)
        except ValueError as e:
            raise pytest.UsageError(f"--qual-resume: {e}") from None
        said = journal.differences(self.profile.as_dict(), None)
        if said:
            raise pytest.UsageError(f"--qual-resume {path}: another run's journal: "
                                    + "; ".join(said))
        for t in journal.results(spec):
            self.tests[t.nodeid] = t
        self.measurements[spec] = [Measurement.from_dict(m) for t in journal.tests.values()
                                   for m in t["measurements"]]
        self.targets_reported[spec] = journal.header["target"]
        self.writer.started = journal.header["started"]
        journal.resuming(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        return journal

    @property
    def repeats(self) -> int:
        given = self.config.option.qual_repeats
        return given if given is not None else self.profile.repeats

    def repetitions(self, labels: list[str]) -> tuple[list[tuple], list[str]]:
        """Parameters for a suite's repeated tests: every (repetition, label) pair, the
        repetitions interleaved (all labels once, then all again), and their ids."""
        n = self.repeats
        params = [((r, n), label) for r in range(1, n + 1) for label in labels]
        ids = [label if n == 1 else f"{label}-r{r}" for (r, _), label in params]
        return params, ids

    def held_target(self, spec: str, *, filesystem: bool = False) -> Target:
        """The target, locked for this session from its first test on; with `filesystem`, on
        a block device, a folder on the filesystem qual makes there (after the guard)."""
        raw = self.open_target(spec)
        if spec not in self._held:
            raw.lock()
            self._held.add(spec)
            self.config.add_cleanup(lambda: self._release(spec))
        if not filesystem or raw.kind != "block":
            return raw
        if spec not in self._fs_targets:
            raw.check_guard()
            raw.release_claim()  # mkfs, then the mount, hold the device exclusively
            fs = QualFilesystem(str(raw.path), self.profile.filesystem,
                                self.profile.filesystem_options)
            self._filesystems[spec] = fs
            self.progress(f"making qual's {fs.kind} filesystem on {spec} for the file families")
            t = Target(fs.make())
            t.progress = self.progress
            self._fs_targets[spec] = t
        return self._fs_targets[spec]

    def _release(self, spec: str) -> None:
        """At the end of the session, however it ends: qual's scratch files go (unless kept),
        its filesystem is unmounted and erased, and the device is let go."""
        keep = self.config.option.qual_keep_scratch
        try:
            t = self._fs_targets.pop(spec, None)
            if t is not None and not keep:
                t.cleanup()
            fs = self._filesystems.pop(spec, None)
            if fs is not None:
                fs.close()
            if not keep:
                self._targets[spec].cleanup()
        finally:
            self._targets[spec].unlock()

    def where(self, spec: str, family: str | None) -> str:
        """Where a family's tests run on this drive: raw, on qual's filesystem, or in a file."""
        fam = self.families.get(family or "")
        if spec not in self.raw:
            return "file"
        return "filesystem" if fam and fam.filesystem else "raw"

    def spec_of(self, item) -> str:
        """The drive a test runs on: its `target` parameter, else the only target."""
        callspec = getattr(item, "callspec", None)
        return callspec.params["target"] if callspec and "target" in callspec.params \
            else self.target_specs[0]

    def drive_said(self, item, err, since: float) -> dict | None:
        """What the drive under `item` answered an I/O it failed (qual.targets.drive_status):
        its NVMe status as the kernel logged it since `since`, and the LBAs; a raw test's offset
        is the device's, so it picks the command that held it."""
        t = self._targets.get(self.spec_of(item))
        if t is None or t.identity.device is None:
            return None
        raw = self.where(t.spec, self.family_of(item)) == "raw"
        return drive_status.said(t.identity.device, err.errno, since=since,
                                 offset=err.offset if raw else None,
                                 lba_size=t.identity.logical_block_size, op=err.op)

    def target_info(self, spec: str) -> dict | None:
        """A target's identity, sent to the controller once per process and drive."""
        t = self._targets.get(spec)
        if t is None or spec in self._sent:
            return None
        self._sent.add(spec)
        plan = self.plans.get(spec)
        return {"spec": t.spec, "kind": t.kind, "path": str(t.path),
                "identity": t.identity.as_dict(), "plan": plan.as_dict() if plan else None}

    def drive_label(self, spec: str) -> str:
        t = self._targets.get(spec)
        return drive_label(t.identity if t else None, spec, several=len(self.target_specs) > 1)

    def judging(self, spec: str) -> Judging:
        return Judging(self.profile, self.baselines.get(spec), self.config.option.qual_seed,
                       self.caveats.get(spec, {}), drive=spec)

    def recorder(self, item) -> Recorder:
        """A test's recorder: judged against this drive's baseline; what it records joins
        the drive's measurements of this process (for the suites' chart tests)."""
        spec = self.spec_of(item)
        store = self.measurements.setdefault(spec, [])
        return Recorder(item, self.judging(spec), store.extend, earlier=store)

    def pytest_runtest_logstart(self, nodeid, location):
        """`[i/N] test  elapsed …, ETA …` as each test starts (under xdist, as each ends)."""
        if self.controller and not self.distributed and nodeid in self.eta.estimates and \
                self.config.option.verbose >= -1:
            self.say(self.eta.begin(nodeid))

    # ---- hooks (registered as a plugin object)

    def pytest_itemcollected(self, item):
        """As each test is collected, before any pytest_collection_modifyitems: its drive's
        xdist group (xdist's turns the mark into the group name), and an id of its own for
        a test of a file outside the suites' folder (a lab's own family's suite, named with
        `-c suites/pytest.ini`), which pytest gives an empty path, `::test_x` (pytest issue
        11245), so that two such families would share ids in the journal and the record: it
        is named by its family's folder, `stamp/suite.py::test_latency`."""
        if item.nodeid.startswith("::"):
            item._nodeid = f"{item.path.parent.name}/{item.path.name}{item.nodeid}"
        if QUAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(name=f"{DRIVE_GROUP}{self.spec_of(item)}"))

    def watchers_of(self, family: str | None) -> list:
        """The watcher families (health) that cover a family's suites under this profile."""
        if family is None or self.families[family].watch is not None:
            return []
        return [w for w in self.families.values()
                if w.watch is not None and w.watch.covers(self.profile.table(w.name), family)]

    def family_of(self, node) -> str | None:
        """The workload family a suite (or one of its tests) is marked with."""
        return next((m.name for m in node.iter_markers() if m.name in self.families), None)

    def pytest_collection_modifyitems(self, session, config, items):
        """On a raw namespace the raw suites run first, then the file families' suites on the
        filesystem qual makes once they are done (docs/ARCHITECTURE.md, "A raw namespace")."""
        if self.raw:
            items[:] = sorted(items, key=lambda it: self.spec_of(it) in self.raw and
                              self.where(self.spec_of(it), self.family_of(it)) == "filesystem")
        if self.config.option.qual_resume:  # the journal's plan, less what it finished
            planned = {t["id"] for j in self.journals.values()
                       for t in (j.header["target"].get("plan") or {}).get("tests", ())}
            done = {n for j in self.journals.values() for n in j.tests}
            items[:] = [it for it in items if it.nodeid in planned - done]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        """The plan of every drive, from the tests selected (after -k and -m), before any I/O:
        written and the run ended with --qual-plan; otherwise a refusal ends the run here with
        exit 4, each reason named once."""
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None and self._own_lines():  # each test's [i/N] line names it
            tr.showfspath = False
        opt = self.config.option
        if not session.items or (opt.collectonly and not opt.qual_plan):
            return
        if opt.qual_resume:
            self._may_resume(bool(opt.qual_plan))
        selected: dict[str, list[Selected]] = {spec: [] for spec in self.target_specs}
        for item in session.items:
            if not QUAL_FIXTURES & set(getattr(item, "fixturenames", ())):
                continue
            family = self.family_of(item)
            params = {k: v for k, v in getattr(item, "callspec", None).params.items()
                      if k != "target"} if hasattr(item, "callspec") else {}
            repetition = params.pop("repetition", None)
            repetition = repetition[0] if isinstance(repetition, tuple) else None
            selected[self.spec_of(item)].append(Selected(
                item.nodeid, family or "", item.originalname, next(iter(params.values()), None),
                item.get_closest_marker("destructive") is not None, repetition))
        try:
            for spec, chosen in selected.items():
                if chosen and spec not in self.abandoned:
                    self.plans[spec] = self.make_plan(spec, chosen)
                    self.plans[spec].left_out = self.left_out(spec)
                    self.eta.plan(self.plans[spec].as_dict()["tests"])
        except QualError as e:  # said as a sentence (pytest's usage error: exit 4), no trace
            raise pytest.UsageError(f"qual: the run cannot be planned: {e}") from None
        refused = [f"{spec}: {r}" if len(self.plans) > 1 else r
                   for spec, plan in self.plans.items() for r in plan.refusals]
        if opt.qual_plan:
            docs = [p.as_dict() for p in self.plans.values()]
            text = json.dumps(docs[0] if len(docs) == 1 else {"drives": docs}, indent=2)
            if opt.qual_plan == "-":
                print(text)
            else:
                Path(opt.qual_plan).write_text(text + "\n")
            pytest.exit("qual: plan made, nothing run",
                        returncode=Exit.REFUSED if refused else Exit.PASS)
        if not refused:
            self._limit(session.items)
            self._watch(session.items)
            return
        said = "qual: refused before any I/O, nothing was written:\n" + \
            "\n".join(f"  - {r}" for r in refused)
        if self.worker is None:
            raise pytest.UsageError(said)
        # an xdist worker has already told the controller what it collected: every test it is
        # given fails in set-up, untouched, and the worker stops (`qual run -n` plans first)
        self.refused = said
        session.shouldstop = "qual: the plan refused the run"

    def _limit(self, items: list) -> None:
        """Each planned test's time limit is its plan's (plan.time_limit), as pytest-timeout's
        marker, which outranks any `timeout` of the folder qual runs from."""
        limits = {t.id: t.time_limit_s for plan in self.plans.values() for t in plan.tests}
        for item in items:
            if item.nodeid in limits:
                item.add_marker(pytest.mark.timeout(limits[item.nodeid]))

    def _may_resume(self, plan_only: bool) -> None:
        """Resuming: each drive is the journal's (serial, firmware), or the run ends here with
        exit 4 saying which differs. On a raw namespace, the filesystem the killed run left
        (qual's, by its label) is erased first, unless only planning."""
        for spec, journal in self.journals.items():
            said = journal.differences(self.profile.as_dict(),
                                       self.open_target(spec).identity.as_dict())
            if said:
                raise pytest.UsageError(f"qual: --qual-resume {journal.path}: another drive or "
                                        "run: " + "; ".join(said))
            if spec in self.raw and not plan_only:
                with contextlib.suppress(QualError):  # not qual's: the guard names it
                    erase_leftover(spec)
        alluredir = getattr(self.config.option, "allure_report_dir", None)
        if alluredir and self.controller and not plan_only and Path(alluredir).is_dir():
            report.forget_unfinished(Path(alluredir), {n for j in self.journals.values()
                                                       for n in j.tests})

    def _begun(self, spec: str) -> None:
        """A drive's first test has begun: its journal is on disk (Journal.begin)."""
        if not self.journals[spec].header:
            profile = self.profile.as_dict()
            self.journals[spec].begin({
                "run_id": uuid.uuid4().hex, "profile": {k: profile[k] for k in ("name", "digest")},
                "qual_version": qual_version(), "started": self.writer.started,
                "target": self.targets_reported.get(spec, {"spec": spec}),
                "run": {"profile": self.config.option.qual_profile,
                        "targets": self.config.option.qual_target or []}})

    def _finished(self, spec: str, entry: TestResult) -> None:
        """A test ended: its result goes to the drive's journal, on disk before the next."""
        self._begun(spec)
        self.journals[spec].finished(entry)

    def pytest_deselected(self, items):
        self.deselected += items

    def left_out(self, spec: str) -> list[str]:
        """The families some of whose tests on a drive a -k/-m subset deselected (their
        criteria no test of the run judged are `not selected`: record.not_selected)."""
        return sorted({self.family_of(it) for it in self.deselected
                       if QUAL_FIXTURES & set(getattr(it, "fixturenames", ()))
                       and self.spec_of(it) == spec} - {None})

    def pytest_runtest_setup(self, item):
        self.current = item
        if self.refused:
            pytest.fail(self.refused, pytrace=False)
        if self.distributed or self.worker is not None:
            spec = self.spec_of(item)
            note = self.stalled_note(spec)
            if note:  # before any fixture: the drive is not touched again
                pytest.skip(f"not run: {spec} stopped answering ({note['what']})")
        gone = self.departed.get(self.spec_of(item))
        if gone:
            pytest.skip(f"not run: {self.spec_of(item)} is gone ({gone['what']})")

    def departed_with(self, item, *, settle: bool = False) -> dict | None:
        """After a test on a drive failed: whether the drive went away (Target.gone), noted
        once with the test that met it. Its later tests are skipped without touching it, its
        record says `device_gone`, and the other drives of a rig run on. `settle` (the test
        broke, or the drive returned an error, rather than missed a criterion): the kernel fails a lost drive's I/O before it
        reports the capacity gone, so the drive is asked again for up to GONE_SETTLE_S."""
        spec = self.spec_of(item)
        target = self._targets.get(spec)
        if spec not in self.departed and target is not None:
            why = target.gone()
            deadline = time.monotonic() + (GONE_SETTLE_S if settle else 0.0)
            while not why and time.monotonic() < deadline:
                time.sleep(0.05)
                why = target.gone()
            if why:
                self.departed[spec] = {"test": item.nodeid.split(f"@{DRIVE_GROUP}")[0],
                                       "what": why}
        return self.departed.get(spec)

    # -------------------------------------------------------------- a storage that stops

    def _watch(self, items: list) -> None:
        """The watchdog over the run (qual.watchdog; docs/ARCHITECTURE.md §4), from the first
        test on: in the one process, or under xdist in each worker (the controller only waits
        for them)."""
        self.items = [it for it in items if QUAL_FIXTURES & set(getattr(it, "fixturenames", ()))]
        if not self.items or (self.controller and self.distributed):
            return
        limit = max([t["command_timeout"] for t in self.profile.tables.values()
                     if "command_timeout" in t] or [watchdog.DEFAULT_COMMAND_TIMEOUT_S])
        self.watchdog = watchdog.watching(limit, self._stalled).start()
        self.config.add_cleanup(self.watchdog.stop)

    def _stalled(self, stall: watchdog.Stall) -> None:
        """On the watchdog's thread, while the test's own thread sits in the kernel."""
        self.stop_for_stall(getattr(self, "current", None), str(stall))

    def engine_stalled(self, item, error: Exception) -> None:
        """A test's I/O stayed outstanding past the command timeout (the engine's own Stalled
        error): the storage stopped answering, as when the watchdog finds a call stuck. Under
        xdist (no watchdog) the test is only broken."""
        if self.watchdog is not None:
            self.stop_for_stall(item, str(error))

    def stop_for_stall(self, item, stall: str) -> None:
        """The run stops on the stalled test's drive: the stall handler (qual.plugin.stalls)
        is given that test and the drive's later ones; under xdist only this worker ends."""
        spec = self.spec_of(item) if item is not None else self.target_specs[0]
        if self.worker is not None:
            test = item.nodeid.split(f"@{DRIVE_GROUP}")[0] if item is not None else None
            self.stalls.worker_stalled(spec, test, f"Stalled: {stall}")
        later = self.items[self.items.index(item) + 1:] if item in self.items else []
        stopped = [(item, "broken", f"Stalled: {stall}")] if item is not None else []
        stopped += [(it, "skipped", f"not run: {spec} stopped answering (Stalled: {stall})")
                    for it in later if self.spec_of(it) == spec]
        drives = [name for name in self.target_specs
                  if name in {self.spec_of(it) for it in self.items} and
                  any(t.drive == name for t in self.tests.values()) or name == spec]
        self.stalls.stop(spec, stall, [
            Stopped(it.nodeid, it.name, self.family_of(it), spec, outcome, message,
                    where=self.where(spec, self.family_of(it)))
            for it, outcome, message in stopped], self.tests,
            lambda note, stopped: self.write_records(drives, stalled=lambda _: note,
                                                     stopped=stopped))

    def _show(self, lines: list[tuple[str, dict]]) -> None:
        """Lines for the person running qual now, past pytest's capture and its terminal's
        place (a stall's: the run ends after them)."""
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        with self.console.uncaptured():
            for line, markup in lines:
                if tr is not None:
                    tr.write_line(line, **markup)
                else:
                    print(line, file=sys.__stdout__)

    def stall_note(self, spec: str) -> Path:
        return self.writer.stall_note(spec)

    def stalled_note(self, spec: str) -> dict | None:
        return self.writer.stalled(spec)

    def make_plan(self, spec: str, selected: list[Selected]) -> Plan:
        target = self.open_target(spec)
        previous = None
        for path in (self.record_path(spec), self.record_path(spec).with_name(LAST_RECORD)):
            with contextlib.suppress(OSError, ValueError):
                previous = json.loads(path.read_text())
                break
        fs = {"type": self.profile.filesystem,
              "options": list(self.profile.filesystem_options
                              or MKFS_OPTIONS[self.profile.filesystem])}
        plan = make_plan(selected, target, self.profile, self.families, filesystem=fs,
                         keep=self.config.option.qual_keep_scratch, previous=previous,
                         fit=self.config.option.qual_fit or self.profile.fit,
                         repeats=self.repeats)
        for name, fit in plan.fitted.items():  # the run measures what the plan fitted
            self.profile.tables[name].update(fit["changes"])
            self.caveats.setdefault(spec, {})[name] = fit["caveat"]
        return plan

    @pytest.hookimpl(tryfirst=True)  # a family's line in place ends before pytest's result
    def pytest_runtest_logreport(self, report):
        if report.when in ("call", "teardown"):
            self.console.test_ended()
        if not self.controller:
            return
        props = dict(report.user_properties)
        if not props.get(QUAL_TEST):
            props = self._crashed(report) or props  # a worker that ended on a stalled drive
        if not props.get(QUAL_TEST):
            return
        if TARGET_INFO in props:
            self.targets_reported.setdefault(props[TARGET_INFO]["spec"], props[TARGET_INFO])
            self.eta.plan((props[TARGET_INFO].get("plan") or {}).get("tests", ()))
            self._begun(props[TARGET_INFO]["spec"])
        nodeid = report.nodeid.split(f"@{DRIVE_GROUP}")[0]  # xdist appends the group
        entry = self.tests.setdefault(nodeid, TestResult(
            nodeid, props.get(DRIVE, self.target_specs[0])))
        entry.duration_s += report.duration
        if WHERE in props:
            entry.where = props[WHERE]
        if PAYLOAD in props and report.when == "call":
            entry.judged(json.loads(props[PAYLOAD]))
        if DEVICE_ERROR in props:
            entry.device_error = props[DEVICE_ERROR]
        if DEPARTED in props:  # a worker's drive went away: its record says so
            self.departed.setdefault(entry.drive, props[DEPARTED])
        if report.failed and entry.outcome != "failed":
            entry.outcome = props.get(STATUS, "broken")
            entry.message = short_message(report)
        elif report.skipped and entry.outcome == "passed":
            entry.outcome = "skipped"
            entry.message = short_message(report)
        if report.when in ("teardown", "???"):  # "???": xdist's report of a worker's end
            self._finished(entry.drive, entry)
            line = self.eta.end(nodeid, entry.duration_s)
            if self.distributed and self.config.option.verbose >= -1:
                self.say(line)
            elif self._own_lines():  # the test's last line: its result
                self.say(f"  {entry.outcome} in {entry.duration_s:.1f} s")

    def _own_lines(self) -> bool:
        """Whether qual prints each test's lines itself ([i/N], its family's progress, its
        result), pytest's own letter or word left out: the controller of a run in one process,
        unless -v asks for pytest's words (xdist's workers report through pytest's)."""
        return self.controller and not self.distributed and \
            -1 <= self.config.option.verbose <= 0

    def pytest_report_teststatus(self, report, config):
        """A suite test's outcome without pytest's letter while qual prints its result line
        (`_own_lines`): one line per test, its progress and its result, not a file name and a
        dot after them. Counted as pytest counts it, for its summary."""
        if not self._own_lines() or not dict(report.user_properties).get(QUAL_TEST):
            return None
        if report.when == "call":
            return report.outcome, "", ""
        if report.failed:
            return "error", "", ""
        if report.skipped:
            return "skipped", "", ""
        return None

    def _crashed(self, report) -> dict | None:
        """xdist's report of the test a worker was running when it ended: where the worker
        noted that its drive stopped answering, that test is ERROR with the stall."""
        nodeid = report.nodeid.split(f"@{DRIVE_GROUP}")[0]  # xdist's may be cwd-relative
        for spec in self.target_specs:
            note = self.stalled_note(spec)
            if note and note["test"] and nodeid.endswith(note["test"]) and report.failed:
                report.nodeid, report.longrepr = note["test"], note["what"]
                return {QUAL_TEST: True, DRIVE: spec, STATUS: "broken"}
        return None

    def build_record(self, spec: str) -> RunRecord:
        return self.writer.build(spec, [t for t in self.tests.values() if t.drive == spec],
                                 target=self.targets_reported.get(spec),
                                 baseline=self.baselines.get(spec),
                                 journal=self.journals[spec].header,
                                 departed=self.departed.get(spec))

    def _run_settings(self, opt) -> None:
        """A family's settings a rig gives for this run (a field's `run_flag`: the power-cut
        command, say) over the profile's table, so the plan and the tests both see them;
        refused where the profile has no table for them or they do not parse."""
        for family in self.families.values():
            for f in family.fields:
                value = getattr(opt, f.run_flag.removeprefix("--").replace("-", "_"), None) \
                    if f.run_flag else None
                if value is None:
                    continue
                table = self.profile.table(family.name)
                if table is None:
                    raise pytest.UsageError(f"{f.run_flag}: profile {self.profile.name} has no "
                                            f"[{family.name}] table: no test would use it")
                try:
                    table.update(thresholds.family_table(family, {f.name: value}, base=table,
                                                         label=f.run_flag))
                except thresholds.ProfileError as e:
                    raise pytest.UsageError(f"{f.run_flag} {value}: {e}") from None

    def record_path(self, spec: str) -> Path:
        return self.writer.path(spec)

    def pytest_sessionfinish(self, session):
        # Ctrl-C: a record says so beside the verdict, even one whose first test never ended
        interrupted = session.exitstatus == pytest.ExitCode.INTERRUPTED and \
            bool(getattr(self, "items", None))
        if not self.controller or not (self.tests or interrupted) or \
                session.exitstatus == Exit.REFUSED:  # a refused resume writes nothing
            return
        drives = [spec for spec in self.target_specs
                  if interrupted or any(t.drive == spec for t in self.tests.values())]

        def noted(spec: str) -> dict | None:  # a worker's drive that stopped answering
            note = self.stalled_note(spec) if self.distributed else None
            return {"test": note["test"], "what": note["what"]} if note else None
        self.records = self.write_records(
            drives, stalled=noted,
            interrupted="SIGINT (Ctrl-C): the tests after it did not run" if interrupted
            else None)
        for spec, (_, record) in self.records.items():
            planned = {t["id"] for t in (record.get("plan") or {}).get("tests", ())}
            if planned <= {t.nodeid for t in self.tests.values()} and not interrupted:
                self.journals[spec].path.unlink(missing_ok=True)  # done: the record stands
        verdicts = {r["summary"]["verdict"] for _, r in self.records.values()}
        # every test passed (or, resumed, the tests the journal kept count as much as this
        # run's): the records' verdicts say the rest (a criterion not judged, or one the
        # noise decides nothing of)
        if session.exitstatus == Exit.PASS or (self.config.option.qual_resume and
                                               session.exitstatus in (
                pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)):
            session.exitstatus = of_verdicts(verdicts)

    def write_records(self, drives: list[str], *, stalled=lambda spec: None,
                      interrupted: str | None = None,
                      stopped: list[Stopped] = ()) -> dict[str, tuple[Path, dict]]:
        """Each drive's run record, written by the session's RecordWriter: the normal end's
        and a stall's alike (`stalled(drive)`: where the drive stopped answering)."""
        runs = {}
        for spec in drives:
            runs[spec] = self.build_record(spec)
            runs[spec].stalled, runs[spec].interrupted = stalled(spec), interrupted
        return self.writer.write(runs, stopped)

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        for spec, (path, record) in self.records.items():
            tr.section(f"qual: {self.profile.name} on {self.writer.label(record, spec)}")
            for line, markup in drive_summary(record, path, self.writer.stored[spec]):
                tr.write_line(line, **markup)


def short_message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.removeprefix("Failed: ")  # pytest.fail's own prefix
    if isinstance(report.longrepr, tuple):  # skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[0] if report.longrepr else ""

"""The session's parts, without pytest's session around them: the record writer (where each
drive's record goes, written with its Allure summary and its store line, a worker's stall
note), the stall handler (the stalled test ERROR, the later ones skipped, the records written
and said, the run ended with exit 1), the terminal's summary of a drive, and a drive's journal
(its header once, each finished test on disk, a resume noted once)."""

import json

import pytest

from qual.exits import Exit
from qual.plugin.journal import Journal
from qual.plugin.progress import drive_summary
from qual.plugin.records import RecordWriter, Stopped
from qual.plugin.stalls import StallHandler
from qual.record import RECORD_NAME, TestResult, read_record
from qual.thresholds import load_profile
from qual.workloads import registry


@pytest.fixture(scope="module")
def profile():
    return load_profile("ci", registry())


def writer(profile, tmp_path, drives, **kw):
    return RecordWriter(profile, tmp_path / "results", drives, seed=7, store_url="off", **kw)


def test_one_drive_s_record_goes_to_the_results_folder_a_rig_s_to_a_folder_each(profile,
                                                                                tmp_path):
    one = writer(profile, tmp_path, ["/mnt/a"])
    assert one.path("/mnt/a") == tmp_path / "results" / RECORD_NAME
    rig = writer(profile, tmp_path, ["/dev/nvme1n1", "/dev/nvme2n1"])
    assert rig.path("/dev/nvme2n1") == tmp_path / "results" / "dev-nvme2n1" / RECORD_NAME


def test_the_writer_writes_each_drive_s_record_its_allure_summary_and_its_store_line(
        profile, tmp_path):
    allure = tmp_path / "allure-results"
    w = writer(profile, tmp_path, ["/mnt/a", "/mnt/b"], alluredir=allure)
    tests = {d: [TestResult(f"suites/test_x.py::test_{i}", d) for i in range(2)]
             for d in w.drives}
    tests["/mnt/b"][1].outcome = "broken"
    written = w.write({d: w.build(d, tests[d], journal={"run_id": f"run-{d[-1]}"})
                       for d in w.drives})
    for drive, (path, record) in written.items():
        assert path == w.path(drive) and read_record(path) == record
        assert record["run_id"] == f"run-{drive[-1]}" and record["seed"] == 7
        assert [t["nodeid"] for t in record["tests"]] == [t.nodeid for t in tests[drive]]
        assert w.stored[drive] == "not stored: the store is off"
    assert written["/mnt/b"][1]["summary"]["tests_broken"] == 1
    assert written["/mnt/a"][1]["summary"]["tests_broken"] == 0
    pages = sorted(p.read_text() for p in allure.glob("*-attachment.html"))
    assert len(pages) == 2  # a summary page per drive


def test_a_worker_s_stall_note_is_read_back_beside_its_drive_s_record(profile, tmp_path):
    w = writer(profile, tmp_path, ["/dev/nvme1n1", "/dev/nvme2n1"])
    assert w.stalled("/dev/nvme1n1") is None
    w.note_stall("/dev/nvme1n1", "suites/test_x.py::test_0", "Stalled: read", "gw1")
    assert w.stall_note("/dev/nvme1n1").parent == w.path("/dev/nvme1n1").parent
    assert w.stalled("/dev/nvme1n1") == {"drive": "/dev/nvme1n1", "test": "suites/test_x.py::"
                                         "test_0", "what": "Stalled: read", "worker": "gw1"}
    assert w.stalled("/dev/nvme2n1") is None


class Ended(Exception):
    pass


def _end(code):
    raise Ended(code)


def test_a_stall_marks_its_test_broken_the_later_ones_skipped_writes_says_and_ends(
        profile, tmp_path):
    w = writer(profile, tmp_path, ["/mnt/a"])
    shown = []
    handler = StallHandler(w, None, shown.extend, end=_end)
    tests = {"t0": TestResult("t0", "/mnt/a")}
    stopped = [Stopped("t1", "test_1", "bandwidth", "/mnt/a", "broken", "Stalled: pread"),
               Stopped("t2", "test_2", "bandwidth", "/mnt/a", "skipped", "not run: stalled")]

    def write(note, stopped):
        run = w.build("/mnt/a", list(tests.values()))
        run.stalled = note
        return w.write({"/mnt/a": run}, stopped)
    with pytest.raises(Ended) as ended:
        handler.stop("/mnt/a", "pread of 4096 bytes", stopped, tests, write)
    assert ended.value.args == (Exit.FAIL,)
    assert [(t.nodeid, t.outcome) for t in tests.values()] == [
        ("t0", "passed"), ("t1", "broken"), ("t2", "skipped")]
    record = read_record(w.path("/mnt/a"))
    assert record["stalled"] == {"test": "t1", "what": "pread of 4096 bytes"}
    lines = [line for line, _ in shown]
    assert lines[1:3] == ["qual: Stalled: pread of 4096 bytes",
                          "qual: 1 later test(s) on /mnt/a skipped; the storage was not touched "
                          "again (`qual clean` removes what the run left there, once it "
                          "answers)"]
    assert f"run record: {w.path('/mnt/a')}" in lines[-2]
    assert lines[-1] == "not stored: the store is off"


def test_a_worker_s_stall_leaves_its_note_and_ends_that_worker_alone(profile, tmp_path):
    w = writer(profile, tmp_path, ["/dev/nvme1n1", "/dev/nvme2n1"])
    handler = StallHandler(w, "gw3", lambda lines: None, end=_end)
    stopped = [Stopped("t1", "test_1", None, "/dev/nvme1n1", "broken", "Stalled: x")]
    with pytest.raises(Ended):
        handler.stop("/dev/nvme1n1", "x", stopped, {}, write=None)  # nothing written here
    assert w.stalled("/dev/nvme1n1")["worker"] == "gw3"
    assert not w.path("/dev/nvme1n1").exists()


def test_the_terminal_summary_of_a_drive_says_its_verdict_and_where_its_record_is(profile,
                                                                                 tmp_path):
    w = writer(profile, tmp_path, ["/mnt/a"])
    path, record = w.write({"/mnt/a": w.build("/mnt/a", [TestResult("t0", "/mnt/a")])})["/mnt/a"]
    record["summary"]["caveats"] = ["a caveat"]
    lines = drive_summary(record, path, "stored in x as run 1")
    said = dict(lines)
    assert said["CAVEAT: a caveat"] == {"yellow": True}
    verdict = next(line for line, _ in lines if line.startswith("verdict: "))
    assert verdict.endswith(f"run record: {path}")
    assert said[verdict]["green"] == (record["summary"]["verdict"] == "PASS")
    assert lines[-1] == ("stored in x as run 1", {"yellow": False})
    assert json.dumps(lines)  # plain data: the terminal writer's keyword arguments


def test_a_journal_keeps_its_header_and_notes_a_resume_once_a_test_of_it_ends(tmp_path):
    path = tmp_path / "qual-journal.json"
    first = Journal(path)
    first.begin({"run_id": "r1", "started": "then"})
    assert Journal.load(path).header == {"run_id": "r1", "started": "then"}  # no test yet
    first.begin({"run_id": "r2"})  # a journal that has a header keeps it
    first.finished(TestResult("t0", "/mnt/a"))
    again = Journal.load(path)
    again.resuming("now")
    assert "resumed" not in Journal.load(path).header  # a resume that finished nothing
    again.finished(TestResult("t1", "/mnt/a"))
    again.finished(TestResult("t2", "/mnt/a"))
    kept = Journal.load(path)
    assert kept.header["run_id"] == "r1"
    assert kept.header["resumed"] == [{"at": "now", "tests_kept": 1}]  # once, not per test
    assert [t.nodeid for t in kept.results("/mnt/a")] == ["t0", "t1", "t2"]

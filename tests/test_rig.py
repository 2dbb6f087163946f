"""A drive-class qualification at rig scale: nothing of the project's own test set-up reaches
it, a subset judges what it selects."""

import json
import shutil
import subprocess
import sys

from qual import shipped
from qual.plan import time_limit
from testbed import TINY_PROFILE, cells_profile, load_record, needs_root, run_suite


def test_a_clones_own_test_timeout_never_reaches_a_qualification(tmp_path):
    """A clone whose test configuration cuts every test at 1 s: a suite test of 3 s still
    passes, whether pytest is pointed at the clone's suites or `qual run` runs from there, and
    no timeout of the clone's is announced."""
    clone = tmp_path / "clone"
    shutil.copytree(shipped("suites"), clone / "suites")
    (clone / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntimeout = 1\n")
    profile = cells_profile(tmp_path / "slow.toml", "one cell of 3 s", ["seq_read"],
                            runtime="3 s", minimum=["seq_read_bw"])
    pytest_run = subprocess.run(
        [sys.executable, "-m", "pytest", str(clone / "suites" / "test_bandwidth.py"),
         f"--qual-profile={profile}", f"--qual-results={tmp_path / 'a'}", "-k", "test_cell"],
        cwd=clone, capture_output=True, text=True, timeout=300)
    qual_run = subprocess.run(
        ["qual", "run", "--profile", str(profile), "--results", str(tmp_path / "b"),
         "-k", "test_cell"], cwd=clone, capture_output=True, text=True, timeout=300)
    for proc, results in ((pytest_run, tmp_path / "a"), (qual_run, tmp_path / "b")):
        header = proc.stdout.split("collected")[0]
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "timeout:" not in header and "Timeout" not in proc.stdout, header
        assert "configfile: pytest.ini" in header
        (cell,) = load_record(results)["tests"]
        assert cell["outcome"] == "passed" and cell["duration_s"] > 2.5


def test_each_test_is_limited_by_its_own_plan(tmp_path):
    proc = subprocess.run(["qual", "run", "--profile", str(TINY_PROFILE), "--plan", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    tests = json.loads(proc.stdout)["tests"]
    assert tests and all(t["time_limit_s"] == time_limit(t["estimate_max_s"]) for t in tests)
    assert all(t["time_limit_s"] > 4 * t["estimate_max_s"] for t in tests)
    said = subprocess.run(["qual", "run", "--profile", str(TINY_PROFILE), "--plan"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300).stdout
    assert "each test's time limit: 4 x its most + 10 min" in said


def test_a_subset_judges_what_it_selects(tmp_path):
    """-k keeps the latency test out: its criterion is listed once as not selected and the
    run passes on what it judged; nothing is INCOMPLETE."""
    proc, results = run_suite(tmp_path, "-k", "seq_read")
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = load_record(results)["summary"]
    assert summary["verdict"] == "PASS" and summary["checks_passed"] == 1
    assert summary["not_selected"] == ["rand_read_lat[bs=4K,qd=1,pct=99]"]
    assert summary["not_judged"] == []
    assert proc.stdout.count("rand_read_lat[bs=4K,qd=1,pct=99]") == 1
    assert "NOT SELECTED" in proc.stdout and "not judged" not in proc.stdout


@needs_root
def test_a_selected_test_that_cannot_judge_still_leaves_the_run_incomplete(tmp_path, tmpfs):
    """The subset's own criterion is UNVERIFIED (tmpfs has no device counters): INCOMPLETE,
    exit 6, while the criterion it left out is only not selected."""
    proc, results = run_suite(tmp_path, "-k", "seq_read", f"--qual-target={tmpfs / 'd.dat'}")
    assert proc.returncode == 6, proc.stdout[-3000:]
    summary = load_record(results)["summary"]
    assert summary["verdict"] == "INCOMPLETE"
    assert summary["not_judged"] == ["seq_read_bw[bs=64K,qd=4]"]
    assert summary["not_selected"] == ["rand_read_lat[bs=4K,qd=1,pct=99]"]

"""A workload family defined only in tests/ (tests/families/stamp/, registered by the one
QUAL_FAMILIES line below) runs through `qual stamp`, `qual run` (pytest), the run record and
the Allure report with no edit anywhere else; and the CLI's family subcommands are generated
from the families' settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qual import report
from qual.workloads import EXTRA, registry

STAMP = Path(__file__).resolve().parent / "families" / "stamp"
REGISTERED = {**os.environ, EXTRA: str(STAMP)}  # the registry line

PROFILE = """
[profile]
name = "stamp-only"
description = "the tests' own family, and nothing else"

[stamp]
count = 24

[[stamp.criteria]]
metric = "stamp_rate"
min = 1
unit = "IOPS"
source = "any drive makes one 4 KiB write durable per second"

[[stamp.criteria]]
metric = "stamp_lat"
params = { pct = 99 }
max = 10
unit = "s"
source = "a durable 4 KiB write within 10 s (NVMe's own command timeout is 30 s)"
"""


def qual(*args: str, cwd: Path, env=REGISTERED) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qual.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_the_family_is_registered_only_where_it_is_named():
    assert "stamp" not in registry()
    proc = subprocess.run([sys.executable, "-c", "from qual.workloads import registry; "
                           "print(sorted(registry()))"], capture_output=True, text=True,
                          env=REGISTERED, timeout=60)
    assert "'stamp'" in proc.stdout, proc.stderr


def test_qual_family_json_runs_it_and_removes_only_what_it_made(tmp_path):
    mine = tmp_path / "qual-stamp" / "someone-elses"
    mine.mkdir(parents=True)
    proc = qual("stamp", "--target", str(tmp_path), "--count", "16", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["writes"] == 16 and doc["block_size"] == 4096
    assert 0 < doc["p50_s"] <= doc["p99_s"]
    assert "qual stamp: [" in proc.stderr and "ETA" in proc.stderr  # progress, on stderr
    assert [p.name for p in (tmp_path / "qual-stamp").iterdir()] == ["someone-elses"]


def test_its_flags_come_from_its_fields_with_their_units(tmp_path):
    proc = qual("stamp", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = " ".join(proc.stdout.split())
    assert "--count COUNT durable writes [a whole number] (default 64)" in shown
    assert "--block-size SIZE bytes per write [bytes, with a unit: 4K, 128KiB, 1M] " \
        "(default 4K)" in shown
    assert "--keep" in shown and "--seed" in shown  # the command's own


def test_bad_flags_are_refused_before_anything_is_made(tmp_path):
    proc = qual("stamp", "--target", str(tmp_path), "--count", "0", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--count:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "qual-stamp").exists()


def test_quiet_says_nothing_on_stderr(tmp_path):
    proc = qual("stamp", "--target", str(tmp_path), "--count", "4", "-q", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert "stamp_rate = " in proc.stdout


def test_a_profile_judges_the_cli_run(tmp_path):
    profile = tmp_path / "stamp.toml"
    profile.write_text(PROFILE)
    proc = qual("stamp", "--target", str(tmp_path), "--profile", str(profile), "--json",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["writes"] == 24  # the profile's table
    assert {v["id"] for v in doc["verdicts"]} == {"stamp_rate", "stamp_lat[pct=99]"}
    strict = tmp_path / "strict.toml"
    strict.write_text(PROFILE.replace("min = 1\n", "min = 1e12\n"))
    proc = qual("stamp", "--target", str(tmp_path), "--profile", str(strict), cwd=tmp_path)
    assert proc.returncode == 1
    assert "stamp_rate = " in proc.stdout and "< min" in proc.stdout


def test_a_declared_test_that_skips_does_not_start_the_shared_run(tmp_path):
    """A table that switches the family's tests off: both skip, saying why, and the family's
    run, which they would have shared, never starts (no stamp written, no progress said)."""
    profile = tmp_path / "off.toml"
    profile.write_text(PROFILE.replace("count = 24\n", "count = 24\nenabled = false\n"))
    results = tmp_path / "res"
    proc = qual("run", "--target", str(tmp_path / "drive.dat"), "--profile", str(profile),
                "--results", str(results), "-k", "latency or rate", cwd=tmp_path)
    record = json.loads((results / "qual-run.json").read_text())
    mine = [t for t in record["tests"] if t["nodeid"].startswith("stamp/suite.py::")]
    assert [t["outcome"] for t in mine] == ["skipped", "skipped"], proc.stdout[-3000:]
    assert all("switched off" in t["message"] for t in mine)
    assert "stamp 0/24" not in proc.stdout + proc.stderr  # the run never began


@pytest.mark.slow
def test_qual_run_records_and_reports_it(tmp_path):
    profile = tmp_path / "stamp.toml"
    profile.write_text(PROFILE)
    results = tmp_path / "res"
    proc = qual("run", "--target", str(tmp_path / "drive.dat"), "--profile", str(profile),
                "--results", str(results), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    record = json.loads((results / "qual-run.json").read_text())
    # named by the family's folder: pytest's own id for a file outside suites/ has no path
    mine = [t for t in record["tests"] if t["nodeid"].startswith("stamp/suite.py::")]
    latency, rate = mine[:2]  # the tests it declares, in their order (then test_health)
    assert [t["nodeid"].split("::")[1] for t in mine] == ["test_latency", "test_rate",
                                                         "test_health"]
    assert latency["outcome"] == rate["outcome"] == "passed"
    assert {m["id"] for m in latency["measurements"]} == {"stamp_lat[pct=50]",
                                                          "stamp_lat[pct=99]"}
    assert {m["id"] for m in rate["measurements"]} == {"stamp_rate"}
    test = rate
    assert record["summary"]["verdict"] == "PASS" and record["summary"]["checks_passed"] == 2
    # the health watcher covers it as it covers qual's own families: its test ends the suite
    suite = test["nodeid"].split("::")[0]
    (watch,) = [t for t in record["tests"] if t["nodeid"] == f"{suite}::test_health"]
    assert watch["outcome"] == "skipped" and "no SMART health log" in watch["message"]
    assert record["tests"].index(watch) > record["tests"].index(test)
    allure = [json.loads(p.read_text()) for p in (results / "allure-results").glob("*-result.json")]
    (doc,) = [d for d in allure if d["name"].startswith("test_latency") and
              d["labels"] and any(la["value"] == "stamp" for la in d["labels"])]
    assert any(a["name"] == "durable write latency" and a["type"] == "image/png"
               for a in doc["attachments"])
    assert not (tmp_path / "qual-stamp").exists()  # the suite removed what it made
    if report.allure_package() is None:
        pytest.skip("no Allure 3 CLI to build the report (npm install -g allure@3.14)")
    out = tmp_path / "report"
    built = qual("report", str(results), "--out", str(out), cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (out / "index.html").exists() and not (out / "awesome").exists()


@pytest.mark.slow
def test_a_profile_check_knows_it_and_health_can_watch_it(tmp_path):
    """`qual profiles --check` parses its table (a bad value named by key), and [health]
    families may name it, but not a family nobody registered."""
    good = tmp_path / "stamp.toml"
    good.write_text(PROFILE + '\n[health]\nfamilies = ["stamp"]\n')
    proc = qual("profiles", "--check", str(good), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(PROFILE.replace("count = 24", "count = 0"))
    proc = qual("profiles", "--check", str(bad), cwd=tmp_path)
    assert proc.returncode == 4 and "bad.toml:stamp.count: count 0 is outside" in proc.stderr
    bad.write_text(PROFILE + '\n[health]\nfamilies = ["stamp", "nope"]\n')
    proc = qual("profiles", "--check", str(bad), cwd=tmp_path)
    assert proc.returncode == 4
    assert "health.families: 'nope' is not a registered family" in proc.stderr, proc.stderr
    watcher = tmp_path / "watcher.toml"
    watcher.write_text('[profile]\nname = "w"\ndescription = "x"\n\n[health]\n'
                       'families = ["stamp"]\n')
    assert qual("profiles", "--check", str(watcher), cwd=tmp_path).returncode == 0
    unregistered = qual("profiles", "--check", str(watcher), cwd=tmp_path, env=os.environ)
    assert unregistered.returncode == 4 and "'stamp' is not a registered" in unregistered.stderr


@pytest.mark.slow
def test_every_family_with_a_run_has_a_subcommand_with_its_fields_as_flags(tmp_path):
    helps = {}
    for family in registry().values():
        if family.run is None:
            continue
        proc = qual(family.subcommand, "--help", cwd=tmp_path, env=os.environ)
        assert proc.returncode == 0, proc.stderr
        helps[family.name] = proc.stdout
    assert {"bandwidth", "pts", "integrity", "checkpoint", "gnn", "training"} <= helps.keys()
    for flag in ("--mixes", "--block-sizes", "--latency-mixes", "--wsat-multiple", "--purge"):
        assert flag in helps["pts"]
    for flag in ("--block-sizes", "--depths", "--latency-depth", "--steady-state-max-rounds"):
        assert flag in helps["bandwidth"]
    for flag in ("--generations", "--queue-depth", "--patterns"):
        assert flag in helps["integrity"]


@pytest.mark.slow
def test_under_xdist_its_tests_keep_their_drive_and_their_ids(tmp_path):
    """`qual run -n 2`: the family's tests join their drive's xdist group like qual's own
    (one worker holds the drive: no EBUSY between workers), with ids named by its folder."""
    profile = tmp_path / "stamp.toml"
    profile.write_text(PROFILE)
    results = tmp_path / "res"
    proc = qual("run", "-n", "2", "--target", str(tmp_path / "drive.dat"), "--profile",
                str(profile), "--results", str(results), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    record = json.loads((results / "qual-run.json").read_text())
    assert [t["nodeid"] for t in record["tests"] if t["nodeid"].startswith("stamp/")] == [
        "stamp/suite.py::test_latency", "stamp/suite.py::test_rate", "stamp/suite.py::test_health"]
    assert record["summary"]["verdict"] == "PASS"

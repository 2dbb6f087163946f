"""The suites run the way a user runs them (pytest in a subprocess): verdicts, the run record,
Allure results, xdist, baselines, and errors that are errors rather than threshold failures."""

import json
import os
import re
import textwrap

import pytest

from testbed import TINY_PROFILE, load_record, run_suite


def allure_results(results):
    """Every test's *-result.json, parsed;
    attachments they name must exist."""
    folder = results / "allure-results"
    out = []
    for path in sorted(folder.glob("*-result.json")):
        doc = json.loads(path.read_text())
        for att in doc.get("attachments", []):
            assert (folder / att["source"]).is_file(), att
        out.append(doc)
    return out


def labels(result, name):
    return [lab["value"] for lab in result["labels"] if lab["name"] == name]


def profile_with(tmp_path, criterion: str, name="custom.toml") -> str:
    text = TINY_PROFILE.read_text() + "\n" + textwrap.dedent(criterion)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.slow
def test_suite_passes_on_the_default_target(tmp_path):
    proc, results = run_suite(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: PASS" in proc.stdout
    assert re.search(r"\[bandwidth\]\ncriterion\s+measured\s+bound\s+margin\s+verdict\s+source", proc.stdout)
    assert not (tmp_path / ".qual").exists()  # scratch removed, and the folder qual made for it

    record = load_record(results)
    assert record["schema"] == "qual-run/1" and record["summary"]["verdict"] == "PASS"
    assert record["profile"]["name"] == "tiny" and record["target"]["kind"] == "file"
    assert record["target"]["identity"]["device"]
    assert record["engine"]["backends_used"] and record["host"]["kernel"]
    tests = {t["nodeid"].split("::")[1]: t for t in record["tests"]}
    assert {"test_cell[seq_read-64K-qd4]", "test_cell[rand_write-64K-qd4]", "test_latency",
            "test_charts"} <= tests.keys()
    cell = tests["test_cell[seq_read-64K-qd4]"]
    (bw,) = [m for m in cell["measurements"] if m["metric"] == "seq_read_bw"]
    assert bw["value"] > 0 and bw["unit"] == "B/s" and bw["samples"]
    assert bw["context"]["path"] == "O_DIRECT" and bw["context"]["device_bytes"] >= bw["context"]["bytes"] * 0.9
    assert [v["passed"] for v in cell["verdicts"]] == [True]

    docs = allure_results(results)
    assert len(docs) == len(record["tests"])
    # every test passes; the drive-health check skips off NVMe, saying why
    assert {d["name"].split(" on ")[0] for d in docs if d["status"] != "passed"} <= \
        {"test_health"}
    assert tests["test_health"]["outcome"] == "skipped"
    assert "no SMART health log: not an NVMe device" in tests["test_health"]["message"]
    for d in docs:
        assert labels(d, "epic") == ["bandwidth"]
        assert "on " in d["name"] and any(p["name"] == "drive" for p in d["parameters"])
        assert d["status"] == "skipped" or \
            any(a["name"] == "measurements.json" for a in d["attachments"])
    (lat,) = [d for d in docs if d["name"].startswith("test_latency")]
    assert labels(lat, "severity") == ["normal"] and labels(lat, "story") == ["rand_read_lat"]
    assert any(a["type"] == "image/png" for a in lat["attachments"])
    (charts,) = [d for d in docs if d["name"].startswith("test_charts")]
    assert any(a["name"] == "bandwidth heatmap" for a in charts["attachments"])

    folder = results / "allure-results"
    env = dict(line.split("=", 1) for line in (folder / "environment.properties").read_text().splitlines())
    assert {"drive.model", "kernel", "engine.backend", "profile", "host"} <= env.keys()
    categories = json.loads((folder / "categories.json").read_text())
    assert [c["name"] for c in categories][:2] == ["Threshold violations", "Baseline regressions"]
    assert json.loads((folder / "executor.json").read_text())["name"] == "qual"


@pytest.mark.slow
def test_an_unmeetable_bound_fails_with_the_verdict_line(tmp_path):
    profile = profile_with(tmp_path, """
        [[bandwidth.criteria]]
        metric = "seq_write_bw"
        params = { bs = "64K", qd = 4 }
        min = 1000
        unit = "GiB/s"
        source = "no drive writes a terabyte per second"
        severity = "blocker"
        """, "impossible.toml")
    proc, results = run_suite(tmp_path, profile=profile)
    assert proc.returncode == 1
    line = re.search(r"seq_write_bw\[bs=64K,qd=4\] = \S+ \S+ < min 1000 GiB/s \(-\d+\.\d %\) "
                     r"\[impossible.toml: no drive writes a terabyte per second\]", proc.stdout)
    assert line, proc.stdout
    record = load_record(results)
    assert record["summary"]["verdict"] == "FAIL" and record["summary"]["checks_failed"] == 1
    (failed,) = [t for t in record["tests"] if t["outcome"] == "failed"]
    assert "seq_write-64K-qd4" in failed["nodeid"] and failed["message"].startswith("seq_write_bw[")
    assert len(failed["measurements"]) == 2  # recorded before failing
    (doc,) = [d for d in allure_results(results) if d["status"] == "failed"]
    assert labels(doc, "severity") == ["blocker"]
    message = doc["statusDetails"]["message"].removeprefix("Failed: ")  # Allure's prefix
    assert message.startswith("seq_write_bw[bs=64K,qd=4] = ")


@pytest.mark.slow
def test_an_engine_error_is_broken_not_a_threshold_failure(tmp_path):
    """The target vanishes mid-session: later tests are broken (an error), never failed."""
    target = tmp_path / "target-dir"
    target.mkdir()
    (tmp_path / "vanish.py").write_text(textwrap.dedent("""
        import shutil
        def pytest_runtest_teardown(item, nextitem):
            if item.name == "test_cell[seq_read-64K-qd4]":
                shutil.rmtree(item.config.getoption("qual_target")[0])
        """))
    proc, results = run_suite(tmp_path, f"--qual-target={target}", "-p", "vanish",
                              env_extra={"PYTHONPATH": os.pathsep.join(
                                  filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))})
    assert proc.returncode == 1
    assert " < min " not in proc.stdout
    record = load_record(results)
    outcomes = {t["nodeid"].split("::")[1]: t["outcome"] for t in record["tests"]}
    assert outcomes["test_cell[seq_read-64K-qd4]"] == "passed"
    assert outcomes["test_cell[rand_read-64K-qd4]"] == "broken"
    broken = [t for t in record["tests"] if t["outcome"] == "broken"]
    assert all("vanished" in t["message"] and "ENOENT" in t["message"] for t in broken)
    assert record["summary"]["verdict"] == "ERROR"
    statuses = {d["status"] for d in allure_results(results)}
    assert "broken" in statuses and "failed" not in statuses


@pytest.mark.slow
def test_the_suite_runs_under_xdist(tmp_path):
    proc, results = run_suite(tmp_path, "-n", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = load_record(results)
    assert len(record["tests"]) == 7 and record["summary"]["verdict"] == "PASS"
    assert not any("@" in t["nodeid"] for t in record["tests"])
    assert all(t["measurements"] for t in record["tests"]
               if t["outcome"] == "passed" and "test_charts" not in t["nodeid"])
    assert record["target"]["identity"]["device"]  # sent by the worker that measured
    assert len(allure_results(results)) == 7
    assert len(list((results / "allure-results").glob("environment.properties"))) == 1


def test_xdist_modes_that_split_a_drive_are_refused(tmp_path):
    proc, _ = run_suite(tmp_path, "-n", "2", "--dist", "each")
    assert proc.returncode == 4 and "qual needs --dist loadgroup" in proc.stderr


def test_a_bad_profile_stops_the_session_before_any_io(tmp_path):
    bad = profile_with(tmp_path, """
        [[bandwidth.criteria]]
        metric = "seq_read_bw"
        params = { bs = "64K", qd = 4 }
        min = 1
        unit = "GiB"
        source = "x"
        """, "bad.toml")
    proc, results = run_suite(tmp_path, profile=bad)
    assert proc.returncode == 4
    assert "bad.toml:bandwidth.criteria[2].unit: unit 'GiB' measures size, not bandwidth" in proc.stderr
    assert not (tmp_path / ".qual").exists() and not (results / "qual-run.json").exists()
    assert not list(results.glob("allure-results/*"))  # allure made the folder, nothing in it


def test_a_missing_target_directory_is_a_usage_error(tmp_path):
    proc, _ = run_suite(tmp_path, f"--qual-target={tmp_path}/no/such/dir/file")
    assert proc.returncode == 4 and "no such file, directory or device" in proc.stderr


@pytest.mark.slow
def test_a_regression_against_the_baseline_fails(tmp_path):
    first, results = run_suite(tmp_path, "--qual-results=first", alluredir=False)
    assert first.returncode == 0
    baseline = json.loads((tmp_path / "first" / "qual-run.json").read_text())
    charts = {t["nodeid"]: t for t in baseline["tests"]}["test_bandwidth.py::test_charts"]
    assert charts["outcome"] == "skipped" and "no charts drawn" in charts["message"]  # no Allure
    for t in baseline["tests"]:
        for m in t["measurements"]:
            if m["id"] == "rand_read_bw[bs=64K,qd=4]":
                m["value"] *= 100  # the new run is ~99 % slower than this "old firmware"
    path = tmp_path / "old-firmware.json"
    path.write_text(json.dumps(baseline))
    proc, results = run_suite(tmp_path, f"--qual-baseline={path}")
    assert proc.returncode == 1
    assert re.search(r"rand_read_bw\[bs=64K,qd=4\] = .* is 9\d\.\d % worse than baseline .*"
                     r"\(tolerance 50 %\) \[baseline: old-firmware.json\]", proc.stdout), proc.stdout
    record = load_record(results)
    assert record["baseline"] == str(path) and record["summary"]["verdict"] == "FAIL"
    charts = {t["nodeid"]: t for t in record["tests"]}["test_bandwidth.py::test_charts"]
    assert charts["outcome"] == "passed"  # Allure keeps them: drawn


@pytest.mark.parametrize("pct, latency, needed", [
    (99.99, 'runtime = "0.05 s"', 10_000),  # 50 ms at depth 1 cannot give them
    (99.9999, 'runtime = "30 s"\nsamples = 3000', 1_000_000),  # sized by samples: 3,000
])
@pytest.mark.slow
def test_a_percentile_too_few_samples_can_resolve_is_an_error(tmp_path, pct, latency, needed):
    text = re.sub(r"\[bandwidth\.latency\]\n(?:[^\[\n][^\n]*\n)*",  # tiny's latency table
                  f"[bandwidth.latency]\n{latency}\n\n", TINY_PROFILE.read_text())
    assert latency in text
    path = tmp_path / "short.toml"
    path.write_text(text + textwrap.dedent(f"""
        [[bandwidth.criteria]]
        metric = "rand_read_lat"
        params = {{ bs = "4K", qd = 1, pct = {pct} }}
        max = 10
        unit = "ms"
        source = "x"
        """))
    proc, results = run_suite(tmp_path, profile=path)
    assert proc.returncode == 1
    (lat,) = [t for t in load_record(results)["tests"] if t["nodeid"].endswith("test_latency")]
    assert lat["outcome"] == "broken" and f"needs at least {needed:,} samples" in lat["message"]
    if "samples" in latency:
        assert {m["context"]["ops"] for m in lat["measurements"]} == {3000}


@pytest.mark.slow
def test_junitxml_carries_each_test_s_measurements_as_json(tmp_path):
    """--junitxml (a CI system's view of the run): the `qual` property of a test is its
    measurements and verdicts as JSON, not a Python repr."""
    import xml.etree.ElementTree as ET

    junit = tmp_path / "junit.xml"
    proc, _ = run_suite(tmp_path, f"--junitxml={junit}", "-k", "seq_read")
    assert proc.returncode == 0, proc.stdout[-2000:]
    values = [p.get("value") for p in ET.parse(junit).iter("property") if p.get("name") == "qual"]
    assert values
    docs = [json.loads(v) for v in values]
    assert all(d["measurements"] for d in docs)
    assert any(v["id"].startswith("seq_read_bw") for d in docs for v in d["verdicts"])

"""Measurements, baselines and the run's verdict."""

import json

import pytest

from qual.record import Baseline, SCHEMA, TestResult, summarize
from qual.measurement import measure
from qual.workloads import registry
from qual.thresholds import load_profile
from qual.workloads.bandwidth import METRICS


def baseline_file(tmp_path, measurements):
    doc = {"schema": SCHEMA, "target": {"identity": {"firmware": "FW1"}},
           "tests": [{"measurements": [m.as_dict() for m in measurements]}]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    return Baseline.from_paths(path)


def test_change_is_signed_by_the_metric_s_direction(tmp_path):
    bw = measure("bandwidth", METRICS["seq_read_bw"], {"bs": 1 << 20, "qd": 32}, 1000.0)
    lat = measure("bandwidth", METRICS["rand_read_lat"], {"bs": 4096, "qd": 1, "pct": 99.0},
                  100e-6)
    base = baseline_file(tmp_path, [bw, lat])
    slower = measure("bandwidth", METRICS["seq_read_bw"], {"bs": 1 << 20, "qd": 32}, 900.0)
    r = base.compare(slower, 0.05)
    assert r.change == pytest.approx(-0.10) and not r.passed and "10.0 % worse" in r.line()
    assert "baseline: old.json fw FW1" in r.line()
    quicker = measure("bandwidth", METRICS["rand_read_lat"], {"bs": 4096, "qd": 1, "pct": 99.0},
                      80e-6)
    r = base.compare(quicker, 0.05)
    assert r.change == pytest.approx(0.20) and r.passed and r.improved


def test_unstable_measurements_are_not_compared(tmp_path):
    params = {"bs": 4096, "qd": 1, "pct": 100.0}
    old = measure("bandwidth", METRICS["rand_read_lat"], params, 1e-3, comparable=False)
    base = baseline_file(tmp_path, [old])
    new = measure("bandwidth", METRICS["rand_read_lat"], params, 9e-3)
    assert base.compare(new, 0.05) is None
    unresolved = measure("bandwidth", METRICS["rand_read_lat"], params, 9e-3,
                         unresolved="needs at least 10,000 samples but the run completed 12")
    assert not unresolved.comparable and not unresolved.resolved


def test_a_file_that_is_not_a_run_record_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a qual run record"):
        Baseline.from_paths(path)


def test_verdict_of_a_run():
    profile = load_profile("ci", registry())
    judged = [{"id": c.id, "passed": True} for c in profile.criteria]
    ok = [TestResult("t", "d", verdicts=judged)]
    assert summarize(ok, profile)["verdict"] == "PASS"
    assert summarize(ok[:0], profile)["verdict"] == "INCOMPLETE"
    failing = [TestResult("t", "d", "failed", verdicts=[{**judged[0], "passed": False}])]
    assert summarize(failing, profile)["verdict"] == "FAIL"
    broken = [TestResult("t", "d", "broken", verdicts=judged)]
    assert summarize(broken, profile)["verdict"] == "ERROR"

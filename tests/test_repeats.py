"""Repetitions: every judged figure of a repeated suite measured N times, interleaved across its
cells, each repetition kept, the median judged with its interval, and the gate between two
repeated runs taken over all their repetitions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qual import stats
from qual.judge import judge
from qual.record import TestResult, summarize
from qual.measurement import measure
from qual.thresholds import load_profile
from qual.workloads import registry
from qual.workloads.bandwidth import METRICS
from testbed import TINY_PROFILE, load_record, run_suite

SEQ = "seq_read_bw[bs=64K,qd=4]"


@pytest.mark.slow
def test_repetitions_are_interleaved_kept_and_judged_by_their_median(tmp_path):
    proc, results = run_suite(tmp_path, "--qual-repeats", "3", "-k",
                              "seq_read or rand_read or latency")
    assert proc.returncode == 0, proc.stdout[-3000:]
    record = load_record(results)
    order = [t["nodeid"].split("::")[1] for t in record["tests"] if "test_cell" in t["nodeid"]]
    assert order == [f"test_cell[{p}-64K-qd4-r{r}]" for r in (1, 2, 3)
                     for p in ("seq_read", "rand_read")]  # all cells, then all again
    mine = [(t, m) for t in record["tests"] for m in t["measurements"] if m["id"] == SEQ]
    assert [m["context"]["repetition"] for _, m in mine] == [[1, 3], [2, 3], [3, 3]]
    early = [t for t, _ in mine[:2]]
    assert all(not t["verdicts"] for t in early)  # kept, not judged
    final_test, final = mine[-1]
    singles = [m["context"].get("single", m["value"]) for _, m in mine]
    assert final["context"]["repetitions"] == singles
    assert final["value"] == stats.median(singles)
    low, high = final["context"]["interval"]
    assert (low, high) == (min(singles), max(singles))  # 3 repetitions: [min, max], 75 %
    assert final["context"]["interval_confidence"] == 0.75
    assert [v["id"] for v in final_test["verdicts"]] == [SEQ]
    assert record["summary"]["verdict"] == "PASS"

    (tmp_path / "again").mkdir()
    again, results2 = run_suite(tmp_path / "again", "--qual-repeats", "3", "-k",
                                "seq_read or rand_read or latency")
    assert again.returncode == 0
    cmp = subprocess.run([sys.executable, "-m", "qual.cli", "compare",
                          str(results / "qual-run.json"), str(results2 / "qual-run.json"),
                          "--json", "--all"], capture_output=True, text=True)
    assert cmp.returncode in (0, 1, 3, 5), cmp.stderr
    row = next(m for m in json.loads(cmp.stdout)["metrics"] if m["id"] == SEQ)
    assert row["repetitions"] == [3, 3] and row["low"] <= row["change"] <= row["high"]


def test_a_bound_inside_the_repetitions_interval_carries_a_caveat():
    profile = load_profile(TINY_PROFILE, registry())  # seq_read_bw >= 1 MiB/s
    m = measure("bandwidth", METRICS["seq_read_bw"], {"bs": 65536, "qd": 4}, 2 << 20,
                interval=[0.5 * 2**20, 4 << 20], interval_confidence=0.75)
    (verdict,) = judge([m], profile).verdicts
    assert verdict.passed
    assert any("the 75 % interval" in c and "straddles the bound" in c for c in verdict.caveats)


def _seq_read(value: float, interval: list[float] | None):
    return measure("bandwidth", METRICS["seq_read_bw"], {"bs": 65536, "qd": 4}, value,
                   interval=interval, interval_confidence=0.75)


def test_a_pipeline_gate_calls_a_straddling_failure_inconclusive(tmp_path):
    """With `straddle = "inconclusive"` a median under the floor whose interval reaches over it
    decides nothing (exit 5); one whose whole interval is under it still fails; a profile
    without the key fails both, with the caveat."""
    gate = tmp_path / "gate.toml"
    gate.write_text(f'[profile]\nextends = "{TINY_PROFILE}"\ndescription = "t"\n'
                    'straddle = "inconclusive"\n')
    pipeline = load_profile(gate, registry())  # seq_read_bw >= 1 MiB/s
    plain = load_profile(TINY_PROFILE, registry())
    straddling = _seq_read(0.8 * 2**20, [0.5 * 2**20, 1.5 * 2**20])
    below = _seq_read(0.6 * 2**20, [0.5 * 2**20, 0.7 * 2**20])
    (v,) = judge([straddling], pipeline).verdicts
    assert v.inconclusive and not v.passed and v.line().startswith("INCONCLUSIVE: ")
    assert not judge([straddling], pipeline).failing
    (v,) = judge([below], pipeline).verdicts
    assert not v.inconclusive and judge([below], pipeline).failing
    (v,) = judge([_seq_read(0.8 * 2**20, [0.5 * 2**20, 1.5 * 2**20])], plain).verdicts
    assert not v.inconclusive and not v.passed and "straddles the bound" in v.caveats[-1]
    (v,) = judge([_seq_read(0.8 * 2**20, None)], pipeline).verdicts  # one sample: no interval
    assert not v.inconclusive


@pytest.mark.slow
def test_a_pipeline_gate_still_fails_a_whole_interval_under_its_floor(tmp_path):
    """A floor ten times over the fastest repetition: every repetition misses it, so the run
    fails even where a straddling median would only be inconclusive."""
    first, results = run_suite(tmp_path, "--qual-repeats", "3", "-k", "seq_read")
    values = next(m for t in load_record(results)["tests"] for m in t["measurements"]
                  if m["id"] == SEQ and m["context"].get("repetitions"))["context"]["repetitions"]
    gate = tmp_path / "gate.toml"
    gate.write_text(f'[profile]\nextends = "{TINY_PROFILE}"\ndescription = "t"\n'
                    f'straddle = "inconclusive"\n\n[[bandwidth.criteria]]\n'
                    f'metric = "seq_read_bw"\nparams = {{ bs = "64K", qd = 4 }}\n'
                    f'min = {max(values) * 10 / 2**20:.3f}\nunit = "MiB/s"\n'
                    'source = "tests: out of reach"\n')
    (tmp_path / "b").mkdir()
    proc, out = run_suite(tmp_path / "b", "--qual-repeats", "3", "-k", "seq_read",
                          profile=gate)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert load_record(out)["summary"]["verdict"] == "FAIL"


def test_an_inconclusive_verdict_makes_the_run_inconclusive_unless_something_failed():
    profile = load_profile(TINY_PROFILE, registry())
    unsure = {"id": SEQ, "passed": False, "inconclusive": True, "line": "INCONCLUSIVE: x"}
    rest = {"id": "rand_read_lat[bs=4K,qd=1,pct=99]", "passed": True, "line": "y"}
    tests = [TestResult("t", "d", verdicts=[unsure, rest])]
    s = summarize(tests, profile)
    assert s["verdict"] == "INCONCLUSIVE" and s["checks_failed"] == 0
    assert s["inconclusive"] == ["INCONCLUSIVE: x"]
    failed = {**rest, "passed": False}
    s = summarize([TestResult("t", "d", "failed", verdicts=[unsure, failed])], profile)
    assert s["verdict"] == "FAIL" and s["checks_failed"] == 1


def test_a_repeated_outcome_judges_the_median_of_whole_runs():
    from qual.measurement import repeated
    from qual.workloads.base import Repeated

    class Run:
        def __init__(self, v):
            self.v = v

        def measurements(self):
            return [_seq_read(self.v, None)]

        def document(self):
            return {"v": self.v}

    # the last repetition is neither the median nor the first: judging either one fails
    runs = Repeated([Run(v=v) for v in (3.0, 2.0, 1.0)])
    (m,) = runs.measurements()
    assert m.value == 2.0 and m.repetitions == [3.0, 2.0, 1.0]
    assert m.interval == [1.0, 3.0] and m.context["single"] == 1.0
    assert runs.document() == {"v": 1.0}  # everything else is the last repetition's
    (verdict,) = judge([m], load_profile(TINY_PROFILE, registry())).verdicts
    assert verdict.value == 2.0
    # a figure with its own interval (an accuracy's) keeps the widest of them
    a = [_seq_read(0.7, [0.6, 0.8]), _seq_read(0.75, [0.65, 0.85])]
    (m,) = repeated([[a[0]], [a[1]]])
    assert m.interval == [0.6, 0.85]
    # one measured once a run (in the last repetition only) stays as it was measured
    once = _seq_read(0.7, [0.6, 0.8])
    (m,) = repeated([[], [], [once]])
    assert m.value == 0.7 and m.interval == [0.6, 0.8] and m.repetitions is None

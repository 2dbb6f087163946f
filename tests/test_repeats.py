"""Repetitions: every judged figure of a repeated suite measured N times, interleaved across its
cells, each repetition kept, the median judged with its interval, and the gate between two
repeated runs taken over all their repetitions."""

from __future__ import annotations

import json
import subprocess
import sys

from qual import stats
from qual.judge import judge
from qual.record import measure
from qual.thresholds import load_profile
from qual.workloads import registry
from qual.workloads.bandwidth import METRICS
from testbed import TINY_PROFILE, load_record, run_suite

SEQ = "seq_read_bw[bs=64K,qd=4]"


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
                context={"interval": [0.5 * 2**20, 4 << 20], "interval_confidence": 0.75})
    (verdict,) = judge([m], profile).verdicts
    assert verdict.passed
    assert any("the 75 % interval" in c and "straddles the bound" in c for c in verdict.caveats)

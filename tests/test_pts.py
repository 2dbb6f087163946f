"""SNIA PTS: the steady-state rule that ends a test, write saturation's bytes, the purge's
guard, and `qual pts --json` as documented."""

import json
import subprocess
import sys

import pytest

from qual import steady
from qual.targets import Target, UnsafeTarget
from qual.thresholds import family_table
from qual.workloads import pts

from testbed import needs_root, sha256_of


def small(**over) -> dict:
    return family_table(pts.FAMILY, {"size": "8 MiB", "runtime": "20 ms", "workers": 1,
                                   "depth": 4, "block_sizes": ["64K", "4K"],
                                   "mixes": [100, 0], "max_rounds": 6, **over})


def test_steady_state_stops_a_settling_series_and_reports_its_window():
    """A series that falls and then settles: the rounds stop at the first steady window of
    five, and the report names those rounds."""
    series = iter([900.0, 400.0, 250.0, 180.0, 130.0, 101.0, 100.0, 99.0, 100.5, 99.5,
                   0.0, 0.0])
    state, results = steady.rounds_until_steady(lambda: (v := next(series), v), 25)
    assert state.reached and state.rounds == 10 and len(results) == 10
    summary = pts.steady_summary(state, "4K 0/100 iops", [r for r in results])
    assert summary["window_rounds"] == [6, 10] and summary["rounds"] == 10
    assert summary["range"] <= steady.RANGE_SHARE and summary["slope"] <= steady.SLOPE_SHARE


def test_write_saturation_writes_four_times_the_region(tmp_path):
    target = Target(tmp_path)
    out = pts.run_test(target, small(), "wsat")
    section = out.document()["wsat"]
    assert section["bytes_written"] >= 4 * (8 << 20) and section["multiple"] >= 4
    assert section["rounds"][-1]["bytes_written"] == section["bytes_written"]
    assert all(a["bytes_written"] < b["bytes_written"]
               for a, b in zip(section["rounds"], section["rounds"][1:]))
    (m,) = out.measurements()
    assert m.metric == "pts_wsat_iops" and m.value > 0 and "steady_state" in m.context
    target.cleanup()


def test_a_file_is_not_purged_and_the_verdict_says_so(tmp_path):
    target = Target(tmp_path)
    out = pts.run_test(target, small(), "latency")
    section = out.document()["latency"]
    assert section["purge"]["done"] is False
    assert any("no purge" in c for c in section["caveats"])
    assert all(any("no purge" in c for c in m.caveats) for m in out.measurements())
    stats = {m.params["stat"] for m in out.measurements()}
    assert stats == {"mean", "p99.99", "p99.9999", "max"}
    six_nines = [m for m in out.measurements() if m.params["stat"] == "p99.9999"]
    assert not any(m.resolved for m in six_nines)  # a few thousand samples cannot resolve it
    target.cleanup()


@needs_root
def test_purge_is_refused_without_the_destructive_guard(loop_device):
    dev = loop_device(64 << 20)
    before = sha256_of(dev)
    for target in (Target(dev), Target(dev, allow_destructive=True, confirm_serial="wrong")):
        with pytest.raises(UnsafeTarget):
            pts.purge(target, small())
        with pytest.raises(UnsafeTarget):
            pts.run_test(target, small(), "iops")
    assert sha256_of(dev) == before


@pytest.mark.slow
def test_qual_pts_json_has_each_test_with_its_steady_state_window(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "qual.cli", "pts", "--target", str(tmp_path), "--json", "-q",
         "--size", "8M", "--runtime", "50ms", "--workers", "1", "--depth", "4",
         "--block-sizes", "64K,4K", "--mixes", "100,50,0", "--max-rounds", "5"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"iops", "throughput", "latency", "wsat"} <= doc.keys()
    for test in ("iops", "throughput", "latency", "wsat"):
        assert {"rounds", "range", "slope", "window_rounds"} <= doc[test]["steady_state"].keys()
        assert doc[test]["precondition"]["passes"] == 2
    assert {(r["rwmixread"], r["bs"]) for r in doc["iops"]["table"]} == \
        {(m, bs) for m in (100, 50, 0) for bs in (65536, 4096)}
    assert doc["wsat"]["bytes_written"] >= 4 * (8 << 20)

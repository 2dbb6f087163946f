"""SNIA PTS steady-state detection on synthetic series that do and do not settle."""

from __future__ import annotations

import math

import pytest

from qual.steady import MAX_ROUNDS, assess, rounds_until_steady


def test_a_flat_series_is_steady_at_its_fifth_round():
    s = assess([100, 101, 99, 100, 100])
    assert s.reached and s.rounds == 5 and s.range_share == pytest.approx(0.02)


def test_fewer_than_five_rounds_are_never_steady():
    assert not assess([100, 100, 100, 100]).reached


def test_a_fresh_drive_settles_after_its_write_cliff():
    """FOB: fast until the spare area is used, then a cliff, then flat."""
    series = [900, 880, 860, 400, 250, 210, 205, 200, 202, 199, 201, 200]
    first = next(i for i in range(5, len(series) + 1) if assess(series[:i]).reached)
    assert first == 10  # rounds 6..10: 210, 205, 200, 202, 199


def test_a_wide_range_is_not_steady_even_without_a_trend():
    s = assess([100, 125, 100, 125, 100])
    assert not s.reached and s.range_share > 0.20 and s.slope_share < 0.10


def test_a_steady_drift_is_not_steady_even_within_the_range():
    """Each round 3 % lower: the range is 12 % (allowed) but the fitted line falls 12 %."""
    s = assess([100, 97, 94, 91, 88])
    assert s.range_share < 0.20 and not s.reached
    assert s.slope_share == pytest.approx(12 / 94, rel=1e-6)


def test_the_bounds_are_inclusive():
    # range exactly 20 % of the mean, no slope: 90 110 100 100 100 (mean 100)
    assert assess([90, 110, 100, 100, 100]).reached


def test_rounds_stop_when_steady_and_give_up_after_the_limit():
    values = iter([500, 300, 200, 200, 201, 199, 200, 200])
    state, results = rounds_until_steady(lambda: (v := next(values), {"v": v}))
    assert state.reached and state.rounds == 7 and len(results) == 7
    noisy = iter([100 + 50 * math.sin(i) for i in range(100)])
    state, results = rounds_until_steady(lambda: (next(noisy), None))
    assert not state.reached and state.rounds == MAX_ROUNDS
    assert "NOT achieved in 25 rounds" in state.describe()


def test_a_write_cell_runs_in_rounds_and_reports_its_window(tmp_path):
    from qual.targets import Target
    from qual.thresholds import family_table
    from qual.workloads import bandwidth

    table = family_table(bandwidth.FAMILY, {
        "size": "8 MiB", "runtime": "0.05 s", "block_sizes": ["64K"], "depths": [4],
        "patterns": ["seq_write", "seq_read"],
        "steady_state": {"max_rounds": 7, "precondition_passes": 2}})
    said = []
    target = Target(tmp_path)
    write, read = bandwidth.matrix(table)[0], bandwidth.matrix(table)[1]
    bw, _ = bandwidth.run_cell(target, table, write, say=said.append)
    ss = bw.context["steady_state"]
    assert 5 <= ss["rounds"] <= 7 and len(ss["round_bw"]) == ss["rounds"]
    assert bw.value == pytest.approx(sum(ss["window_bw"]) / len(ss["window_bw"]))
    assert ss["reached"] or "NOT achieved in 7 rounds" in bw.caveats[0]
    assert said[0].startswith("preconditioning") and "steady state" in said[-1]
    # bytes, operations, latencies and the device's counts cover the whole window, not its
    # last round
    window = len(ss["window_bw"])
    assert bw.context["rounds_in_window"] == window
    assert bw.context["elapsed_s"] >= 0.9 * window * 0.05  # every round's 0.05 s
    assert sum(bw.samples.values()) == bw.context["ops"] > 0
    assert bw.context["bytes"] == pytest.approx(bw.context["ops"] * 64 * 1024)
    assert bw.context["bytes"] == pytest.approx(
        sum(ss["window_bw"]) / window * bw.context["elapsed_s"], rel=0.25)
    if bw.device_truth == "counted":
        assert bw.context["device_bytes"] >= 0.9 * bw.context["bytes"]
    rbw, _ = bandwidth.run_cell(target, table, read)  # reads are measured once
    assert "steady_state" not in rbw.context

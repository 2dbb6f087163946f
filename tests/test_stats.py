"""The statistics a decision rests on: the median's interval and the noise-aware gate."""

from __future__ import annotations

import math
import random

import pytest

from qual import stats


def test_median_interval_is_the_order_statistics_that_reach_95_percent():
    ten = [float(v) for v in range(1, 11)]
    got = stats.median_interval(ten)
    assert got.value == 5.5
    assert (got.low, got.high) == (2.0, 9.0)  # [x(2), x(9)]: 1 - 2 x 11/1024
    assert got.confidence == pytest.approx(1 - 22 / 1024)
    five = stats.median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (five.low, five.high) == (1.0, 5.0)  # too few for 95 %: the widest, and says so
    assert five.confidence == pytest.approx(1 - 2 / 32)


def test_one_repetition_a_side_gates_as_a_single_comparison():
    assert stats.gate([80.0], [100.0], "higher", 0.10).verdict == "regressed"
    assert stats.gate([95.0], [100.0], "higher", 0.10).verdict == "within"
    assert stats.gate([120.0], [100.0], "higher", 0.10).verdict == "improved"
    assert stats.gate([120.0], [100.0], "lower", 0.10).verdict == "regressed"  # latency


def test_a_clear_shift_is_regressed_and_overlapping_noise_is_inconclusive():
    base = [100.0, 103.0, 98.0, 101.0, 99.0]
    slower = [74.0, 76.0, 75.5, 73.0, 77.0]
    answer = stats.gate(slower, base, "higher", 0.10)
    assert answer.verdict == "regressed"
    assert answer.change.high < -0.10 and answer.change.value == pytest.approx(-0.25, abs=0.02)
    noisy = [60.0, 140.0, 95.0, 110.0, 70.0]
    unsure = stats.gate(noisy, base, "higher", 0.10)
    assert unsure.verdict == "inconclusive"
    assert unsure.change.low < -0.10 < unsure.change.high
    assert unsure.needed is not None and unsure.needed > 5


def _draws(sigma: float, seed: int = 7):
    rng = random.Random(seed)
    return lambda: [100 * math.exp(rng.gauss(0, sigma)) for _ in range(5)]


def test_an_a_a_comparison_under_noise_rarely_says_regressed():
    draw = _draws(0.08)  # 8 % noise a repetition, near the tolerance of 10 %
    answers = [stats.gate(draw(), draw(), "higher", 0.10).verdict for _ in range(400)]
    assert answers.count("regressed") <= 0.05 * len(answers)
    assert answers.count("inconclusive") > 0  # the noise is as large as the question


def test_a_planted_25_percent_loss_is_called_regressed():
    draw = _draws(0.05)
    planted = [stats.gate([0.75 * v for v in draw()], draw(), "higher", 0.10).verdict
               for _ in range(400)]
    assert planted.count("regressed") >= 0.95 * len(planted)


def test_no_change_can_be_taken_without_repetitions():
    with pytest.raises(ValueError):
        stats.gate([], [1.0], "higher", 0.1)
    with pytest.raises(ValueError):
        stats.median([])

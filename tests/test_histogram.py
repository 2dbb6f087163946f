"""The latency histogram: percentiles read from it agree with the same samples sorted."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qual.engine import LatencyHistogram, bucket_index, bucket_value

PCTS = (1, 10, 50, 90, 99, 99.9, 99.99, 100)


def nearest_rank(sorted_samples, pct):
    rank = max(1, math.ceil(pct / 100 * len(sorted_samples)))
    return sorted_samples[rank - 1]


@pytest.mark.parametrize("seed", range(5))
def test_percentiles_within_one_percent_of_sorted_samples(seed):
    rng = np.random.default_rng(seed)
    # latencies from 50 ns to minutes: a body near 100 us and a long tail
    samples = np.concatenate([rng.lognormal(np.log(100_000), 0.6, 100_000),
                              rng.lognormal(np.log(20_000_000), 2.0, 2_000),
                              rng.integers(50, 128, 500)]).astype(np.uint64)
    hist = LatencyHistogram.from_samples(samples)
    ordered = np.sort(samples)
    for pct in PCTS:
        want = int(nearest_rank(ordered, pct))
        got = hist.percentile(pct)
        assert abs(got - want) <= 0.01 * want, (pct, got, want)
    assert hist.count == len(samples)
    assert hist.min_ns == ordered[0] and hist.max_ns == ordered[-1]
    assert hist.mean_ns == pytest.approx(samples.mean(), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**44), min_size=1, max_size=300),
       st.sampled_from(PCTS))
def test_percentile_error_bound_holds_for_any_samples(samples, pct):
    hist = LatencyHistogram.from_samples(samples)
    want = nearest_rank(sorted(samples), pct)
    got = hist.percentile(pct)
    # values past the last bucket (2^40 ns) are only known to be there: clamped to max
    if want < 2**40:
        assert abs(got - want) <= want / 128 + 1e-9 * want


@given(st.integers(min_value=0, max_value=2**40 - 1))
def test_every_value_sits_in_a_bucket_whose_midpoint_is_within_1_128(value):
    rep = bucket_value(bucket_index(value))
    assert abs(rep - value) <= value / 128


def test_small_values_are_exact():
    for v in range(128):
        assert bucket_value(bucket_index(v)) == v


def test_merge_equals_recording_everything():
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, 10**7, 5000), rng.integers(1, 10**9, 5000)
    ha, hb = LatencyHistogram.from_samples(a), LatencyHistogram.from_samples(b)
    ha.merge(hb)
    both = LatencyHistogram.from_samples(np.concatenate([a, b]))
    assert (ha.counts() == both.counts()).all()
    assert ha.summary() == both.summary()


def test_bins_round_trip():
    samples = np.random.default_rng(2).integers(1, 10**8, 10_000)
    hist = LatencyHistogram.from_samples(samples)
    back = LatencyHistogram.from_bins(hist.to_bins(), min_ns=hist.min_ns, max_ns=hist.max_ns,
                                      sum_ns=int(samples.sum()))
    assert back.summary() == hist.summary()


def test_empty_histogram_has_no_percentile():
    from qual.engine import QualError

    with pytest.raises(QualError, match="empty"):
        LatencyHistogram().percentile(50)
    assert LatencyHistogram().summary()["p99"] == 0


def test_p99_9999_of_a_million_samples_is_exact_to_the_bucket_bound():
    """Six nines, as OCP's QoS asks: 1,000,000 samples resolve it (the 999,999th), fewer cannot
    (it would be the maximum), and the histogram reads it within its 1/128 bound."""
    rng = np.random.default_rng(3)
    body = rng.lognormal(np.log(80_000), 0.5, 1_000_000 - 3).astype(np.uint64)
    samples = np.concatenate([body, np.array([30_000_000, 45_000_000, 90_000_000], np.uint64)])
    values, counts = np.unique(samples, return_counts=True)
    bins: dict[int, int] = {}
    for v, c in zip(values.tolist(), counts.tolist()):  # as the engine would have counted them
        rep = bucket_value(bucket_index(v))
        bins[rep] = bins.get(rep, 0) + c
    hist = LatencyHistogram.from_bins(bins, min_ns=int(samples.min()), max_ns=int(samples.max()),
                                      sum_ns=int(samples.sum()))
    want = int(nearest_rank(np.sort(samples), 99.9999))
    assert want == 45_000_000  # the second largest: the tail, not the body, not the maximum
    assert abs(hist.percentile(99.9999) - want) <= want / 128
    assert hist.summary()["p99.9999"] == hist.percentile(99.9999)
    from qual.honesty import samples_needed
    assert samples_needed(99.9999) == 1_000_000 and samples_needed(99.99) == 10_000

"""Latency histograms: the engine's log-linear buckets (<= 0.78 % error), percentiles read from them."""

from __future__ import annotations

import numpy as np

from qual.engine._binding import check
from qual.engine._binding import ffi, lib

PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99, 99.9999)


class LatencyHistogram:
    """Completion latencies (ns) in the engine's log-linear histogram (<= 0.78 % error)."""

    BUCKETS = lib.QUAL_HIST_BUCKETS

    def __init__(self, cdata=None):
        self._h = ffi.new("struct qual_hist *")
        if cdata is None:
            check(lib.qual_hist_init(self._h))
        else:
            ffi.memmove(self._h, ffi.addressof(cdata), ffi.sizeof("struct qual_hist"))

    @classmethod
    def from_samples(cls, samples_ns) -> LatencyHistogram:
        hist = cls()
        for sample in samples_ns:
            hist.record_ns(sample)
        return hist

    @classmethod
    def from_bins(cls, bins: dict, *, min_ns: int, max_ns: int, sum_ns: int) -> LatencyHistogram:
        """Rebuild from `to_bins()` output (as stored in a run record)."""
        hist = cls()
        for value, count in bins.items():
            index = bucket_index(int(value))
            hist._h.buckets[index] += int(count)
            hist._h.count += int(count)
        hist._h.min_ns, hist._h.max_ns, hist._h.sum_ns = min_ns, max_ns, sum_ns
        return hist

    def record_ns(self, sample_ns: int) -> None:
        check(lib.qual_hist_record(self._h, int(sample_ns)))

    @property
    def count(self) -> int:
        return int(self._h.count)

    @property
    def min_ns(self) -> int:
        return int(self._h.min_ns) if self.count else 0

    @property
    def max_ns(self) -> int:
        return int(self._h.max_ns)

    @property
    def mean_ns(self) -> float:
        return self._h.sum_ns / self.count if self.count else 0.0

    def percentile(self, pct: float) -> int:
        out = ffi.new("uint64_t *")
        check(lib.qual_hist_percentile(self._h, float(pct), out))
        return int(out[0])

    def merge(self, other: LatencyHistogram) -> None:
        check(lib.qual_hist_merge(self._h, other._h))

    def counts(self) -> np.ndarray:
        return np.frombuffer(ffi.buffer(self._h.buckets), dtype=np.uint64).copy()

    def to_bins(self) -> dict[int, int]:
        """Non-empty buckets as {representative ns: count}, like fio's json+ `bins`."""
        counts = self.counts()
        return {bucket_value(int(i)): int(counts[i]) for i in np.flatnonzero(counts)}

    def summary(self) -> dict[str, float]:
        """p50 … p99.99, p99.9999, max and mean in ns (empty histogram: all zero)."""
        out = {f"p{pct:g}": (self.percentile(pct) if self.count else 0) for pct in PERCENTILES}
        out["max"] = self.max_ns
        out["mean"] = self.mean_ns
        return out


def bucket_value(index: int) -> int:
    out = ffi.new("uint64_t *")
    check(lib.qual_hist_bucket_value(index, out))
    return int(out[0])


def bucket_index(value_ns: int) -> int:
    out = ffi.new("uint32_t *")
    check(lib.qual_hist_bucket_of(value_ns, out))
    return int(out[0])

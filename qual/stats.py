"""A figure that decides is a distribution (docs/ARCHITECTURE.md §5): the median of its
repetitions with a distribution-free interval, and the change between two sets of repetitions
with its interval and the gate's answer: regressed, improved, within, or inconclusive with the
repetitions that would decide.

The intervals are order statistics, so they assume nothing about the noise's shape: the
median's from the binomial distribution of how many repetitions fall below it; the change's is
the Hodges-Lehmann interval of the log ratio (every new repetition over every baseline one, the
Mann-Whitney rank test inverted), the interval google/benchmark's and pyperf's rank tests
imply. With few repetitions an interval cannot reach 95 %: it is then the widest there is, and
its own confidence is said."""

from __future__ import annotations

import math
from dataclasses import dataclass

CONFIDENCE = 0.95
Z = {0.90: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    if not n:
        raise ValueError("the median of no repetitions")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _binomial_tail(n: int, k: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


@dataclass(frozen=True)
class Interval:
    """A median (or a change) with its interval and the interval's own confidence."""

    value: float
    low: float
    high: float
    confidence: float
    n: int

    def as_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high,
                "confidence": self.confidence, "n": self.n}


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> Interval:
    """The median and the narrowest order-statistics interval [x(k), x(n+1-k)] whose coverage
    reaches `confidence` (or, with too few repetitions, [min, max] and its coverage)."""
    s = sorted(values)
    n = len(s)
    m = median(s)
    k, coverage = 1, 1 - 2 * _binomial_tail(n, 0)
    while k + 1 <= (n + 1) // 2:
        wider = 1 - 2 * _binomial_tail(n, k)  # coverage of [x(k+1), x(n-k)]
        if wider < confidence:
            break
        k, coverage = k + 1, wider
    return Interval(m, s[k - 1], s[n - k], coverage if n > 1 else 0.0, n)


def change_interval(new: list[float], base: list[float], better: str,
                    confidence: float = CONFIDENCE) -> Interval:
    """The change from `base` to `new` as a fraction of `base` ((new - base) / base), its sign
    turned so that it is positive when better in the metric's direction: the Hodges-Lehmann
    estimate of the log ratio and its rank-test interval."""
    if not new or not base or min(new) <= 0 or min(base) <= 0:
        raise ValueError("a change needs positive repetitions on both sides")
    d = sorted(math.log(a) - math.log(b) for a in new for b in base)
    n, m = len(new), len(base)
    pairs = n * m
    z = Z.get(confidence, Z[CONFIDENCE])
    c = max(0, math.floor(pairs / 2 - z * math.sqrt(pairs * (n + m + 1) / 12)))
    c = min(c, (pairs - 1) // 2)
    # the rank test's coverage of [d(c+1), d(pairs-c)] (normal approximation)
    spread = math.sqrt(pairs * (n + m + 1) / 12) or 1.0
    coverage = 1 - 2 * _normal_cdf((c - pairs / 2) / spread) if pairs > 1 else 0.0
    centre, low, high = (math.expm1(x) for x in (median(d), d[c], d[pairs - 1 - c]))
    if better == "lower":
        centre, low, high = -centre, -high, -low
    return Interval(centre, low, high, coverage, min(n, m))


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@dataclass(frozen=True)
class Answer:
    """The gate's answer for one metric."""

    verdict: str  # "regressed", "improved", "within", "inconclusive"
    change: Interval
    tolerance: float
    needed: int | None = None  # inconclusive: repetitions a side that would likely decide

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "change": self.change.as_dict(),
                "tolerance": self.tolerance, "needed": self.needed}


def gate(new: list[float], base: list[float], better: str, tolerance: float,
         confidence: float = CONFIDENCE) -> Answer:
    """Regressed only when the whole interval of the change lies beyond -tolerance, improved
    only when it lies beyond +tolerance, within when it lies inside both; else inconclusive,
    with how many repetitions a side would narrow the interval enough (the interval narrows as
    one over the square root of the repetitions)."""
    ci = change_interval(new, base, better, confidence)
    if ci.high < -tolerance:
        return Answer("regressed", ci, tolerance)
    if ci.low > tolerance:
        return Answer("improved", ci, tolerance)
    if -tolerance <= ci.low and ci.high <= tolerance:
        return Answer("within", ci, tolerance)
    half = (ci.high - ci.low) / 2
    gap = min(abs(ci.value + tolerance), abs(ci.value - tolerance))
    n = max(ci.n, 2)
    needed = math.ceil(n * (half / gap) ** 2) if gap > 0 else None
    return Answer("inconclusive", ci, tolerance, max(needed, n + 1) if needed else None)

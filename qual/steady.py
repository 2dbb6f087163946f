"""SNIA PTS steady state: a tracking variable measured in rounds is steady once the last five
rounds stay within 20 % of their mean and their least-squares line moves by at most 10 % of it
(docs/ARCHITECTURE.md §9, SNIA PTS: as CloudHarmony isSteadyState and TKperf StdyState)."""

from __future__ import annotations

from dataclasses import dataclass

WINDOW = 5            # rounds in the measurement window
RANGE_SHARE = 0.20    # max - min within the window, of its mean
SLOPE_SHARE = 0.10    # fitted line's excursion across the window, of its mean
MAX_ROUNDS = 25       # PTS: report "not achieved" after this many


@dataclass(frozen=True)
class SteadyState:
    reached: bool
    rounds: int                  # rounds measured
    window: tuple[float, ...]    # the last WINDOW values (fewer when there were fewer rounds)
    mean: float
    range_share: float           # (max - min) / mean over the window
    slope_share: float           # |slope| x (WINDOW - 1) / mean

    def describe(self) -> str:
        if not self.reached:
            return (f"steady state NOT achieved in {self.rounds} rounds (last {len(self.window)}"
                    f": range {self.range_share * 100:.1f} %, slope {self.slope_share * 100:.1f}"
                    " % of the mean)")
        return (f"steady state after {self.rounds} rounds: range {self.range_share * 100:.1f} %"
                f", slope {self.slope_share * 100:.1f} % of the mean")


def assess(values: list[float]) -> SteadyState:
    """Whether the last WINDOW of `values` (one per round, in order) are steady."""
    window = tuple(float(v) for v in values[-WINDOW:])
    n = len(window)
    mean = sum(window) / n if n else 0.0
    if n < WINDOW or mean <= 0:
        return SteadyState(False, len(values), window, mean, float("inf"), float("inf"))
    xs = range(n)
    x_mean = (n - 1) / 2
    slope = sum((x - x_mean) * (y - mean) for x, y in zip(xs, window)) / \
        sum((x - x_mean) ** 2 for x in xs)
    range_share = (max(window) - min(window)) / mean
    slope_share = abs(slope) * (n - 1) / mean
    return SteadyState(range_share <= RANGE_SHARE and slope_share <= SLOPE_SHARE, len(values),
                       window, mean, range_share, slope_share)


def rounds_until_steady(measure_round, max_rounds: int = MAX_ROUNDS) -> tuple[SteadyState, list]:
    """Call measure_round() -> (value, anything) until the values are steady or max_rounds
    have run; returns the assessment and every round's result."""
    if max_rounds < 1:
        raise ValueError(f"max_rounds {max_rounds}: steady state needs at least one round")
    results, values = [], []
    state = assess(values)
    for _ in range(max_rounds):
        value, result = measure_round()
        values.append(value)
        results.append(result)
        state = assess(values)
        if state.reached:
            break
    return state, results

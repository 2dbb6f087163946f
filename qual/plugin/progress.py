"""What a person sees of a long run: a line per test with its place in the run, the time so far
and an ETA from the plan (its rates learnt as the run goes), and a family's inner progress at
most once every 10 s (one line rewritten in place on a terminal)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable

from qual import report
from qual.plan import CALIBRATION_LIMITS
from qual.units import format_duration

INNER_INTERVAL_S = 10.0  # a family's progress lines, at most one this often


class Eta:
    """The run's place and its estimated time to go: the plan's estimate of every test not yet
    finished, scaled by how long the finished ones took against their own estimates."""

    def __init__(self):
        self.estimates: dict[str, float] = {}
        self.took: dict[str, float] = {}
        self.started: float | None = None
        self.begun = 0

    def plan(self, tests: list[dict]) -> None:
        """Add a drive's planned tests (Plan.as_dict()["tests"])."""
        for t in tests:
            self.estimates.setdefault(t["id"], t["estimate_s"])

    @property
    def rate(self) -> float:
        """How much longer than planned the finished tests took (1 before any finished)."""
        planned = sum(self.estimates.get(i, 0.0) for i in self.took)
        if planned <= 0:
            return 1.0
        lo, hi = CALIBRATION_LIMITS
        return min(hi, max(lo, sum(self.took.values()) / planned))

    def begin(self, nodeid: str) -> str:
        """A test starts: `[i/N] test  elapsed …, ETA …`."""
        self.started = self.started or time.monotonic()
        self.begun += 1
        return f"[{self.begun}/{len(self.estimates)}] {nodeid}  {self._times()}"

    def end(self, nodeid: str, seconds: float) -> str:
        """A test ended, having taken `seconds`: `[i/N] done test …` (what a run under xdist,
        whose tests start on the workers, shows)."""
        self.started = self.started or time.monotonic() - seconds
        self.took[nodeid] = seconds
        return f"[{len(self.took)}/{len(self.estimates)}] done {nodeid}  {self._times()}"

    def _times(self) -> str:
        elapsed = time.monotonic() - (self.started or time.monotonic())
        left = sum(e for i, e in self.estimates.items() if i not in self.took) * self.rate
        return f"elapsed {format_duration(elapsed)}, ETA {format_duration(left)}"


class Inner:
    """A family's progress messages: on a terminal one line rewritten in place; elsewhere the
    first of each test at once, then at most one line every INNER_INTERVAL_S, and the last
    one held back shown when the test ends."""

    def __init__(self, write: Callable[[str], None], rewrite: Callable[[str], None] | None,
                 newline: Callable[[], None] | None = None,
                 interval: float = INNER_INTERVAL_S):
        self.write, self.rewrite, self.newline, self.interval = write, rewrite, newline, interval
        self.last = float("-inf")
        self.held: str | None = None
        self.open = False  # a rewritten line waits for its newline

    def __call__(self, message: str) -> None:
        if self.rewrite is not None:
            self.rewrite(message)
            self.open = True
            return
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.write(message)
            self.last, self.held = now, None
        else:
            self.held = message

    def close(self) -> None:
        """A test ended: the line in place is finished, or the last message held back shown."""
        if self.open and self.newline is not None:
            self.newline()
        elif self.held is not None:
            self.write(self.held)
        self.last, self.held, self.open = float("-inf"), None, False


class Console:
    """What qual says to the person running it, past pytest's capture: whole lines (`say`; a
    worker's to its stderr, naming the worker), and a family's progress through `Inner`
    (`progress`; -q silences it), one line in place on a terminal."""

    def __init__(self, config, worker: str | None):
        self.config, self.worker = config, worker
        self.inner: Inner | None = None

    def progress(self, message: str, done: float | None = None) -> None:
        """A family's progress (Inner: at most a line every 10 s, one line in place on a
        terminal); -q silences it."""
        if self.config.option.verbose < 0:
            return
        if self.inner is None:
            tr = self.config.pluginmanager.get_plugin("terminalreporter")
            terminal = self.worker is None and tr is not None and tr.isatty
            self.inner = Inner(lambda m: self.say(f"  {m}"),
                               (lambda m: self._rewrite(tr, f"  {m}")) if terminal else None)
        self.inner(message)

    def test_ended(self) -> None:
        """A test ended: a family's line in place is finished, or its last held line shown."""
        if self.inner is not None:
            self.inner.close()

    def say(self, line: str) -> None:
        """A line for the person running qual, past pytest's capture; a worker's goes to its
        stderr (the controller's), whole lines naming the worker."""
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        with self.uncaptured():
            if self.worker is None and tr is not None:
                if getattr(getattr(tr, "_tw", None), "width_of_current_line", 0):
                    tr.write("\n")  # after -q's result letters, which name no file
                tr.write_line(line)
            else:
                print(f"[{self.worker}] {line.strip()}", file=sys.__stderr__, flush=True)

    def _rewrite(self, tr, line: str) -> None:
        with self.uncaptured():
            if not self.inner.open:
                tr.ensure_newline()  # pytest starts its own next line after ours
            tr.rewrite(line, erase=True)

    def uncaptured(self):
        """pytest's capture set aside, for what a person must see now."""
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        return capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()


def drive_summary(record: dict, path, stored: str) -> list[tuple[str, dict]]:
    """What the terminal says of a drive's record as its run ends (or stops on a stall): its
    verdict lines, where it ran, its counts, what was not verified or decided, its caveats,
    its verdict with the record's path, and where it was stored; each line with its markup
    (pytest's terminal writer's colours)."""
    s = record["summary"]
    lines = [(line, {}) for line in report.summary_lines(record)]
    ran = report.placement(record)
    if ran:
        lines.append((f"ran {ran}", {}))
    lines.append((f"{s['measurements']} measurements ({s['informational']} informational), "
                  f"{s['checks_passed']} checks passed, {s['checks_failed']} failed, "
                  f"{s['tests_broken']} tests broken", {}))
    warn = {"yellow": True}
    lines += [(f"UNVERIFIED: {why}", warn) for why in s.get("unverified", ())]
    lines += [(line if line.startswith("INCONCLUSIVE") else  # a verdict's line says so itself
               f"INCONCLUSIVE against the baseline: {line}", warn)
              for line in s.get("inconclusive", ())]
    lines += [(f"CAVEAT: {caveat}", warn) for caveat in s.get("caveats", ())]
    if record.get("interrupted"):
        lines.append((f"interrupted: {record['interrupted']}", warn))
    lines.append((f"verdict: {s['verdict']}    run record: {path}",
                  {"bold": True, "red": s["verdict"] != "PASS", "green": s["verdict"] == "PASS"}))
    lines.append((stored, {"yellow": stored.startswith("not stored")}))
    return lines

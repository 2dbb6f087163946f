"""The `record` fixture's object: where one test puts its measurements and charts. It is given
narrow callbacks (the judging context and where to send what it recorded), never the session,
and judges once when the test body returns."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import allure
import pytest

from qual import thresholds
from qual.judge import judge
from qual.record import Baseline
from qual.measurement import Measurement, with_repetitions
from qual.family import Outcome

PAYLOAD = "qual"  # key of report.user_properties that carries a test's measurements and verdicts


@dataclass(frozen=True)
class Judging:
    """What a test's measurements are judged against."""

    profile: thresholds.Profile
    baseline: Baseline | None
    seed: int
    caveats: dict = field(default_factory=dict)  # family -> what --qual-fit scaled down
    drive: str | None = None  # the target the test measures, named in its errors


ATTACHMENT_TYPES = {"png": allure.attachment_type.PNG, "json": allure.attachment_type.JSON,
                    "text": allure.attachment_type.TEXT}


class Recorder:
    def __init__(self, item, judging: Judging, collect: Callable[[list[Measurement]], None],
                 earlier: list[Measurement] | None = None):
        self.item = item
        self.judging = judging
        self._collect = collect
        self._earlier = earlier if earlier is not None else []
        self.measurements: list[Measurement] = []
        self.repetition: tuple[int, int] = (1, 1)
        # charts are drawn only where Allure keeps them: matplotlib's import and the drawing
        # are seconds of CPU a run without --alluredir (a suite run by hand, a slow guest) spends
        # on pictures nobody sees
        self.drawing = bool(getattr(item.config.option, "allure_report_dir", None))

    def repeat(self, repetition: tuple[int, int]) -> None:
        """This test is repetition r of n of its figures (docs/ARCHITECTURE.md §5): before the
        last, its measurements are kept and not judged; the last judges the median of all of
        them with its interval."""
        self.repetition = tuple(repetition)

    def _combine(self) -> list[Measurement]:
        """The measurements to judge: none before the last repetition; at the last, each the
        median of its repetitions so far, with every repetition and the interval in its
        context."""
        r, n = self.repetition
        if n == 1:
            return self.measurements
        for m in self.measurements:
            m.context["repetition"] = [r, n]
        if r < n:
            return []
        for m in self.measurements:
            with_repetitions(m, [e.value for e in self._earlier if e.id == m.id and e is not m
                                 and e.context.get("repetition", [0, 0])[1] == n] + [m.value])
        return self.measurements

    @property
    def seed(self) -> int:
        return self.judging.seed

    def add(self, measurements: list[Measurement]) -> None:
        self.measurements.extend(measurements)
        self._collect(measurements)

    def outcome(self, outcome: Outcome, *, section: str | None = None,
                charts: tuple[str, ...] | None = None) -> None:
        """A family's outcome: its measurements (or one section of them), its texts, and
        those of its charts named in `charts` that it drew (None: all it drew; (): none)
        attached to the report."""
        self.add(outcome.measurements(section) if section else outcome.measurements())
        for title, text in outcome.texts().items():
            self.attach(title, text, kind="text")
        drawn = outcome.charts() if self.drawing and (charts is None or charts) else {}
        for title, png in drawn.items():
            if charts is None or title in charts:
                self.attach(title, png)

    def attach(self, name: str, body, kind: str = "png") -> None:
        allure.attach(body, name=name, attachment_type=ATTACHMENT_TYPES[kind])

    def finish(self) -> None:
        """Judge, record and label everything, then fail once if any check failed."""
        __tracebackhide__ = True
        for m in self.measurements:
            fitted = self.judging.caveats.get(m.family)
            if fitted and fitted not in m.caveats:
                m.caveats.append(fitted)
        verdict = judge(self._combine(), self.judging.profile, self.judging.baseline)
        payload = {"measurements": [m.as_dict() for m in self.measurements], **verdict.as_dict()}
        # as JSON text: it crosses xdist as a string, and --junitxml writes it as JSON (a
        # dict would be written as its Python repr)
        self.item.user_properties.append((PAYLOAD, json.dumps(payload, default=str)))

        if self.measurements:  # one story, so the report's tree lists the test once
            allure.dynamic.story(", ".join(sorted({m.metric for m in self.measurements})))
        order = thresholds.SEVERITIES
        allure.dynamic.severity(min(verdict.severities, key=order.index)
                                if verdict.severities else "minor")
        self.attach("measurements.json", json.dumps(payload, indent=1, default=str), "json")

        for line in verdict.lines():
            print(line)
        verdict.raise_unresolved(self.judging.drive)
        failing = verdict.failing
        if failing:
            pytest.fail("\n".join(failing + [f"({len(failing)} of {verdict.checks} checks "
                                             "failed)"]), pytrace=False)

"""What every family's run shares: `ResultOutcome` (an `Outcome`, qual.family, over the run's
own result document, which only the family reads), `Repeated` (a whole run done the profile's `repeats` times), the I/O
backend field, the margin a fitted dataset leaves."""

from __future__ import annotations

from collections.abc import Callable

from qual.engine import BACKENDS
from qual.family import Field, Outcome, Repetition
from qual.measurement import Measurement, repeated


FIT_MARGIN = 0.95  # a dataset scaled to fit (--qual-fit) leaves this share of the room used


class ResultOutcome(Outcome):
    """An outcome over the run's own result document (`result`, a dict as rank processes or
    loaders report it): the family reads it; everything past the family reads the protocol's
    typed views of it (measurements, document, texts, charts, exit status)."""

    def __init__(self, result: dict, *, target):
        self.result = result
        self.target = target


class Repeated(Outcome):
    """A family's whole run repeated (docs/ARCHITECTURE.md §5): every repetition runs all of
    the family's cells (loaders, accelerator counts, checkpoint writes and reads) before the
    next starts, so repetitions interleave across them. Its measurements are each the median of
    the repetitions, with every repetition and the interval in their context (a figure the
    family measures once a run, in one repetition, as it was measured); everything else
    (the document, texts and charts) is the last repetition's."""

    def __init__(self, outcomes: list):
        if not outcomes:
            raise ValueError("no repetition ran")
        self.outcomes = list(outcomes)
        self.last = self.outcomes[-1]

    @classmethod
    def run(cls, run: Callable[[Repetition], Outcome], repeats: int,
            progress=None) -> "Repeated":
        outcomes = []
        for r in range(1, repeats + 1):
            if progress and repeats > 1:
                progress(f"repetition {r} of {repeats}")
            outcomes.append(run(Repetition(r, repeats)))
        return cls(outcomes)

    @classmethod
    def of(cls, family, target, table: dict, repeats: int, progress=None,
           **kw) -> "Repeated":
        """`family`'s run on `target`, `repeats` times over; a family that measures a figure
        once a run (Family.measures_once) is told which repetition each run is."""
        return cls.run(lambda repetition: family.run(
            target, table, progress=progress, **kw,
            **({"repetition": repetition} if family.measures_once else {})), repeats, progress)

    def measurements(self, section: str | None = None) -> list[Measurement]:
        """Every repetition's measurements (or one section of them), as one set of medians."""
        return repeated([o.measurements(section) if section else o.measurements()
                         for o in self.outcomes])

    def document(self) -> dict:
        return self.last.document()

    def charts(self) -> dict[str, bytes]:
        return self.last.charts()

    def texts(self) -> dict[str, str]:
        return self.last.texts()

    def exit_status(self) -> int:
        return max(o.exit_status() for o in self.outcomes)


def backend_field() -> Field:
    """The I/O backend, named as fio names it, in every family."""
    return Field("backend", "choice", default="auto", choices=BACKENDS, flag="--ioengine",
                 aliases=("--backend", "--engine"),
                 help="I/O backend (fio's ioengine): io_uring, psync or auto (io_uring where "
                      "it works)")

"""A storage that stops answering mid-run (docs/ARCHITECTURE.md §4): the session's stall
handler. The test that stalled is ERROR, every later test on its drive skipped for it, the
records and the Allure results written (neither lives on the drive), what happened said, and
the run ended with exit 1, touching the drive no more; under xdist only the worker whose drive
stopped ends, leaving a note for the controller. It knows nothing of pytest: the session hands
it the tests and how to write the records, show lines and end."""

from __future__ import annotations

import sys
from collections.abc import Callable

from qual import watchdog
from qual.exits import Exit
from qual.plugin.progress import drive_summary
from qual.plugin.records import RecordWriter, Stopped
from qual.record import TestResult


def _end(code: int) -> None:
    watchdog.kill_descendants()  # every process qual started dies with it
    watchdog.exit_now(code)


class StallHandler:
    """`writer`: the run's records; `worker`: the xdist worker this process is, if any;
    `show(lines)`: (line, markup) pairs for the person running qual; `end(code)`: the process
    ends now, its stuck thread left in the kernel."""

    def __init__(self, writer: RecordWriter, worker: str | None,
                 show: Callable[[list[tuple[str, dict]]], None],
                 end: Callable[[int], None] = _end):
        self.writer, self.worker, self.show, self.end = writer, worker, show, end

    def stop(self, drive: str, stall: str, stopped: list[Stopped],
             tests: dict[str, TestResult], write) -> None:
        """The run stops on `drive`: `stopped`, the test that stalled (ERROR, first, if a test
        was running) and the later tests on the drive (skipped), is noted in `tests`; the
        records are written (`write(stalled, stopped)` -> {drive: (path, record)}: the
        session's writer over its tests), said with the stall, and the run ends with exit 1.
        Under xdist (a worker) only this worker ends, its note left for the controller."""
        said = f"Stalled: {stall}"
        running = next((s for s in stopped if s.outcome == "broken"), None)
        if self.worker is not None:
            self.worker_stalled(drive, running.nodeid if running else None, said)
            return
        for s in stopped:
            entry = tests.setdefault(s.nodeid, TestResult(s.nodeid, drive, where=s.where))
            entry.outcome, entry.message = s.outcome, s.message
        later = len(stopped) - (running is not None)
        lines = [(f"qual: {said}", {"red": True}),
                 (f"qual: {later} later test(s) on {drive} skipped; the storage was not "
                  "touched again (`qual clean` removes what the run left there, once it "
                  "answers)", {})]
        note = {"test": running.nodeid if running else None, "what": stall}
        for spec, (path, record) in write(note, stopped).items():
            lines += drive_summary(record, path, self.writer.stored[spec])
        self.show([("", {}), *lines])
        self.end(Exit.FAIL)

    def worker_stalled(self, drive: str, test: str | None, said: str) -> None:
        """A worker's drive stopped answering: the worker notes it beside the drive's record
        (for the controller, which records the test ERROR and the drive `stalled`, and for the
        worker xdist starts in its place, which skips the drive's other tests without touching
        it) and ends at once; the workers of the other drives run on."""
        self.writer.note_stall(drive, test, said, self.worker)
        print(f"[{self.worker}] qual: {said}; {drive}'s other tests are skipped, the other "
              "drives run on", file=sys.__stderr__, flush=True)
        self.end(Exit.FAIL)

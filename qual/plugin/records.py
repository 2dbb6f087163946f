"""A run's records, the session's writer of them (docs/ARCHITECTURE.md §2, `qual/plugin/`):
where each drive's record goes, the record built from its tests, written durably with its
Allure summary and the store's copy, and the notes a worker leaves when its drive stops
answering. It knows nothing of pytest: the session hands it the tests and the drive's facts."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from qual import engine, report, store
from qual.measurement import Measurement
from qual.record import RECORD_NAME, RunRecord, TestResult, rig_label, summarize, write_record
from qual.targets import drive_label

STALL_NOTE = ".stalled.json"  # beside a drive's record: a worker found it stopped (xdist)


@dataclass
class Stopped:
    """A test a stall stopped (ERROR) or left unrun (skipped), for the record and the Allure
    results: its id, its name, its family, its drive, its outcome and why, and where it ran
    (raw or on the filesystem qual made)."""

    nodeid: str
    name: str
    family: str | None
    drive: str
    outcome: str
    message: str
    where: str | None = None


@dataclass
class RecordWriter:
    """Each drive's run record of a run of `profile` on `drives`: one record per drive, at
    `results/qual-run.json`, or `results/<drive>/qual-run.json` for a rig's; the results
    store's copy (`store_url`), and the Allure summary and metadata where `alluredir` is
    given. `stored[drive]` says where each record was stored, or why not."""

    profile: object  # qual.thresholds.Profile
    results: Path
    drives: list[str]
    seed: int
    store_url: str | None = None
    alluredir: Path | None = None
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    stored: dict[str, str] = field(default_factory=dict)

    def path(self, drive: str) -> Path:
        """results/qual-run.json; with several drives, results/<drive>/qual-run.json."""
        if len(self.drives) == 1:
            return self.results / RECORD_NAME
        slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in drive.strip("/"))
        return self.results / (slug or "drive") / RECORD_NAME

    def label(self, record: dict, drive: str) -> str:
        """The drive as the report and the terminal name it (model and serial where known)."""
        return drive_label(record["target"].get("identity"), drive,
                           several=len(self.drives) > 1)

    def build(self, drive: str, tests: list[TestResult], *, target: dict | None = None,
              baseline=None, journal: dict | None = None,
              departed: dict | None = None) -> RunRecord:
        """The drive's record from its tests: `target`, what its tests reported of it (its
        identity and plan); `baseline`, what it was gated against; `journal`, its journal's
        header (the run's id, and where it was resumed); `departed`, where it went away."""
        target = target or {"spec": drive}
        journal = journal or {}
        backends = sorted({b for t in tests for m in t.measurements
                           if (b := Measurement.from_dict(m).backend)})
        return RunRecord(
            target=target, profile=self.profile.as_dict(),
            engine={"io_uring": engine.io_uring_status() or "available",
                    "backends_used": backends},
            tests=tests, summary=summarize(tests, self.profile, target.get("plan")),
            started=self.started, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            seed=self.seed, baseline=str(baseline.path) if baseline else None,
            plan=target.get("plan"), resumed=journal.get("resumed"),
            run_id=journal.get("run_id") or uuid.uuid4().hex, rig=rig_label(),
            device_gone=departed)

    def write(self, runs: dict[str, RunRecord],
              stopped: list[Stopped] = ()) -> dict[str, tuple[Path, dict]]:
        """Each drive's record, the one way both a run's end and a stall write them: the
        record (durably), the store's copy, the drive's summary in Allure's globals, the Allure
        results of the tests a stall `stopped`, and the report's metadata over every record
        written. Returns {drive: (path, record)}."""
        written = {}
        for drive, run in runs.items():
            record = run.as_dict()
            path = self.path(drive)
            write_record(path, record)
            written[drive] = (path, record)
            self.stored[drive] = store.store_record(record, self.store_url)
            if self.alluredir:
                label = self.label(record, drive)
                mine = [(s.nodeid, s.name, s.family, s.outcome, s.message)
                        for s in stopped if s.drive == drive]
                if mine:
                    report.write_stopped_results(self.alluredir, mine, label)
                report.write_summary_globals(self.alluredir, record, drive=label)
        if self.alluredir and written:
            report.write_allure_metadata(self.alluredir, [r for _, r in written.values()])
        return written

    # ---- a drive that stopped answering under xdist: its worker's note, beside its record

    def stall_note(self, drive: str) -> Path:
        return self.path(drive).with_name(STALL_NOTE)

    def note_stall(self, drive: str, test: str | None, what: str, worker: str | None) -> None:
        write_record(self.stall_note(drive), {"drive": drive, "test": test, "what": what,
                                              "worker": worker})

    def stalled(self, drive: str) -> dict | None:
        """The note a worker left for the drive, if any."""
        with contextlib.suppress(OSError, ValueError):
            return json.loads(self.stall_note(drive).read_text())
        return None

"""A run's journal: each finished test's result on disk as it finishes (atomically, synced),
beside the run record it will become, so that a run killed at any moment (kill -9, a power
loss, a reboot) loses at most the test in flight, and `qual run --resume` continues it with
the same profile, drive, firmware and qual (docs/ARCHITECTURE.md, "Resume")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from qual.record import TestResult, qual_version, write_record

JOURNAL_NAME = "qual-journal.json"
SCHEMA = "qual-journal/1"


@dataclass
class Journal:
    """What a run has finished on one drive: its header (profile, drive, qual, when it
    started, its plan) and every finished test's result, by node id."""

    path: Path
    header: dict = field(default_factory=dict)
    tests: dict[str, dict] = field(default_factory=dict)
    kept: tuple[int, str] | None = None  # resumed: (tests kept, when), noted once a test ends

    @classmethod
    def load(cls, path: Path) -> Journal:
        """ValueError, saying why, when there is none or it cannot be read."""
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{path} does not exist: nothing to resume (a finished run "
                             "leaves its record, not a journal)") from None
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} cannot be read: {e}") from None
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"{path} is not a qual journal ({SCHEMA})")
        return cls(path, doc["header"], doc["tests"])

    def resuming(self, at: str) -> None:
        """This run continues the journal from `at`: noted in its header, with the tests it
        kept, once a test of this run finishes (a resume that finishes none leaves it as it
        was)."""
        self.kept = (len(self.tests), at)

    def begin(self, header: dict) -> None:
        """The drive's first test has begun: the journal is on disk with its header and no
        test yet, so a run killed inside its first test resumes too. A journal that has a
        header keeps it."""
        if not self.header:
            self.header = header
            self.save()

    def finished(self, result: TestResult) -> None:
        """A test finished: its result reaches the disk before the next test starts."""
        if self.kept is not None:  # the first test a resumed run finished
            kept, at = self.kept
            self.header.setdefault("resumed", []).append({"at": at, "tests_kept": kept})
            self.kept = None
        self.tests[result.nodeid] = result.as_dict()
        self.save()

    def save(self) -> None:
        write_record(self.path, {"schema": SCHEMA, "header": self.header, "tests": self.tests})

    def results(self, drive: str) -> list[TestResult]:
        return [TestResult(drive=drive, **t) for t in self.tests.values()]

    def differences(self, profile: dict, identity: dict | None) -> list[str]:
        """Why this run cannot continue the journal's: another profile (name or content),
        drive serial, firmware or qual version, each named."""
        said = []
        theirs = self.header.get("profile", {})
        for key in ("name", "digest"):
            if theirs.get(key) != profile.get(key):
                said.append(f"profile {key}: the journal's is {theirs.get(key)}, this run's "
                            f"{profile.get(key)}")
        drive = (self.header.get("target") or {}).get("identity") or {}
        for key in ("serial", "firmware"):
            if identity is not None and drive.get(key) != identity.get(key):
                said.append(f"drive {key}: the journal's is {drive.get(key)}, this drive's "
                            f"{identity.get(key)}")
        if self.header.get("qual_version") != qual_version():
            said.append(f"qual version: the journal's is {self.header.get('qual_version')}, "
                        f"this qual's {qual_version()}")
        return said

"""The durability promises (docs/ARCHITECTURE.md §6), checked where they show: in the requests a
file system receives (stallfs.py's log) and in the time a slow flush adds. A write's time
includes its fdatasync; a checkpoint has its final name only once its data and its manifest
are durable."""

from __future__ import annotations

import os

import pytest

from qual import engine
from qual.engine import IoJob, run_job
from qual.plugin.journal import JOURNAL_NAME, Journal
from qual.record import TestResult
from qual.targets import Target
from qual.workloads import checkpoint

from test_checkpoint import tiny

BACKENDS = ["io_uring", "psync"]
MiB = 1 << 20
FLUSH_S = 1.0  # what each fsync/fdatasync costs on the slow file system


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_timed_write_includes_its_fdatasync(misbehaving, backend):
    """A 1 MiB write job on a file system whose flushes take a second: the job's time (and so
    its bandwidth) holds that second, since the data is not the drive's until flushed."""
    storage = misbehaving("--fsync-delay", f"{FLUSH_S:g}", size=MiB)
    result = run_job(IoJob(target=str(storage.file), op="write", pattern="sequential",
                           block_size=64 << 10, size=MiB, bytes=MiB, queue_depth=4,
                           direct=False, backend=backend))
    assert result.bytes == MiB
    assert result.elapsed >= FLUSH_S, f"{result.elapsed:.3f} s: the flush was not timed"
    assert ("FSYNC", "stall.dat") in storage.requests()


def test_a_checkpoint_file_write_includes_its_fdatasync(misbehaving):
    storage = misbehaving("--fsync-delay", f"{FLUSH_S:g}")
    data = engine.aligned_empty(2 * MiB)
    engine.fill_random(data, 7)
    _, result = engine.write_checkpoint_file(str(storage.point / "rank-00000.bin"),
                                             [(0, data)], 2 * MiB, chunk_size=MiB)
    assert result.sync >= FLUSH_S and result.elapsed >= result.sync, result
    assert ("FSYNC", "rank-00000.bin") in storage.requests()


def test_a_checkpoint_is_renamed_into_place_only_after_its_manifest_is_durable(misbehaving):
    """The requests of one committed checkpoint, in the order the file system answered them:
    every rank file flushed, the manifest written and flushed under a temporary name, renamed
    to manifest.json, the folder flushed, and only then the folder renamed from `.partial` to
    its final name (the commit), and the root flushed. A crash before the commit leaves a
    `.partial` folder that restore refuses; after it, a complete set."""
    storage = misbehaving()
    checkpoint.run(Target(storage.point), tiny())
    requests = storage.requests()
    partial = "qual-checkpoints/ckpt-000001.partial"

    def at(op: str, path: str) -> int:
        hits = [i for i, r in enumerate(requests) if r == (op, path)]
        assert hits, f"no {op} {path} among {len(requests)} requests"
        return hits[-1]

    data = max(at("FSYNC", f"{partial}/rank-{r:05d}.bin") for r in (0, 1))
    manifest = at("FSYNC", f"{partial}/.manifest.json.tmp")
    named = at("RENAME", f"{partial}/.manifest.json.tmp -> {partial}/manifest.json")
    folder = at("FSYNCDIR", partial)
    commit = at("RENAME", f"{partial} -> qual-checkpoints/ckpt-000001")
    root = at("FSYNCDIR", "qual-checkpoints")
    assert data < manifest < named < folder < commit < root, (data, manifest, named, folder,
                                                              commit, root)


def test_a_finished_test_is_on_disk_before_the_next_one_starts(misbehaving):
    """The run's journal, in the requests its file system answered: each finished test's
    journal is written under a temporary name, flushed, renamed over the journal and its
    folder flushed, all before `finished` returns (a power loss after it keeps the test)."""
    storage = misbehaving()
    journal = Journal(storage.point / JOURNAL_NAME, header={"started": "now"})
    for n, test in enumerate(("suite.py::test_a", "suite.py::test_b")):
        before = len(storage.requests())
        journal.finished(TestResult(test, "drive"))
        requests = storage.requests()[before:]
        tmp = f".{JOURNAL_NAME}.{os.getpid()}.tmp"
        order = [requests.index(r) for r in (("WRITE", tmp), ("FSYNC", tmp),
                                             ("RENAME", f"{tmp} -> {JOURNAL_NAME}"),
                                             ("FSYNCDIR", ""))]
        assert order == sorted(order), requests
        assert list(Journal.load(journal.path).tests) == ["suite.py::test_a",
                                                          "suite.py::test_b"][:n + 1]

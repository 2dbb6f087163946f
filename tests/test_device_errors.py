"""An error the drive returns is a qualification result, not a crash: a file system that
answers reads of one range with EIO (stallfs.py --eio, the medium error a drive returns). The
command names the operation and the offset; in a run the cell that hit it FAILs (it is not
broken), the record counts it, and the next cell runs and passes; integrity names the block and
checks the rest."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed import cells_profile

BAD = 128 << 10  # the unreadable range: 4 KiB at 128 KiB, inside the first reads a queue of 4
# 64 KiB reads submits, so a cell that reads for any time at all meets it
SCRATCH = "qual-target.dat"  # the scratch file qual makes in a directory target


@pytest.fixture
def unreadable(misbehaving):
    """A folder whose scratch file answers reads of [128 KiB, 132 KiB) with EIO."""
    return misbehaving("--eio", f"{SCRATCH}:{BAD}:4096")


def qual(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qual.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("backend", ["io_uring", "psync"])
def test_qual_io_names_the_offset_the_drive_failed(misbehaving, tmp_path, backend):
    storage = misbehaving("--eio", f"stall.dat:{BAD}:4096", size=16 << 20)
    proc = qual("io", "--target", str(storage.file), "--rw", "read", "--bs", "64k", "--size",
                "16M", "--engine", backend, "-q", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"read at offset {BAD}: " in proc.stderr and proc.stderr.rstrip().endswith("[EIO]")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_run_fails_the_cell_that_hit_the_error_and_passes_the_other(unreadable, tmp_path):
    # FUSE has no block-device counters: without device_truth optional the write cell would
    # be UNVERIFIED (rightly), not judged
    profile = cells_profile(tmp_path / "eio.toml", "tests: one unreadable block",
                            ["seq_read", "seq_write"], runtime="0.3 s",
                            profile='device_truth = "optional"\n',
                            minimum=["seq_read_bw", "seq_write_bw"])
    results = tmp_path / "results"
    proc = qual("run", "--target", str(unreadable.point), "--profile", str(profile),
                "--results", str(results), "-k", "test_cell", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    record = json.loads((results / "qual-run.json").read_text())
    outcomes = {t["nodeid"].split("::")[1]: t for t in record["tests"]}
    read, write = outcomes["test_cell[seq_read-64K-qd4]"], outcomes["test_cell[seq_write-64K-qd4]"]
    assert read["outcome"] == "failed", read  # the drive's answer: failed, not broken
    assert read["message"].startswith("the drive returned an error: ")
    assert read["device_error"]["op"] == "read" and read["device_error"]["errno"] == "EIO"
    assert read["device_error"]["offset"] == BAD
    assert write["outcome"] == "passed" and write["verdicts"][0]["passed"]
    summary = record["summary"]
    assert summary["verdict"] == "FAIL" and summary["tests_broken"] == 0
    assert [(e["test"].split("::")[1], e["offset"]) for e in summary["device_errors"]] == [
        ("test_cell[seq_read-64K-qd4]", BAD)]
    assert f"read at offset {BAD}" in proc.stdout and "DEVICE ERROR EIO" in proc.stdout
    allure = {d["name"].split(" on ")[0]: d["status"] for d in (json.loads(p.read_text()) for p
              in (results / "allure-results").glob("*-result.json"))}
    assert allure == {"test_cell[seq_read-64K-qd4]": "failed",
                      "test_cell[seq_write-64K-qd4]": "passed"}


def test_integrity_names_the_unreadable_block_and_checks_the_rest(unreadable, tmp_path):
    proc = qual("integrity", "--target", str(unreadable.point), "--size", "16M",
                "--patterns", "sequential", "--json", "-q", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (doc,) = json.loads(proc.stdout)["patterns"]
    assert doc["blocks"] == 128 and doc["bad_blocks"] == 1  # every block: the check went on
    assert doc["counts"]["unreadable"] == 1 and doc["bytes_verified"] == 127 * (128 << 10)
    assert doc["bad"] == [f"offset {BAD}: unreadable: the drive answered its read with EIO "
                          "(Input/output error)"]

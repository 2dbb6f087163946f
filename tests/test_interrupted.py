"""Interrupted runs: a run killed or stopped with Ctrl-C in the middle of writing leaves nothing
the next run would trust, and cleaning up removes only what qual made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qual.targets import SCRATCH_NAME, Target
from qual.targets.scratch import prove
from qual.thresholds import family_table
from qual.workloads import training
from qual.workloads.training import dataset


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "qual.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the run never got that far"
        time.sleep(0.02)


def test_a_fill_killed_midway_is_not_trusted_and_clean_spares_the_rest(tmp_path):
    theirs = tmp_path / "their-notes.txt"
    theirs.write_text("not qual's")
    scratch = tmp_path / SCRATCH_NAME
    proc = start("io", "--target", str(tmp_path), "--rw", "read", "--size", "3G",
                 "--runtime", "1s")
    wait_for(lambda: scratch.exists() and scratch.stat().st_blocks * 512 > 64 << 20)
    proc.kill()  # as a killed worker dies: no cleanup of its own
    proc.wait(timeout=30)
    owned = prove(scratch)
    assert owned is not None and owned.written < 3 << 30  # the fill is not counted
    target = Target(tmp_path)
    target.ensure_data(1 << 20)  # the next run fills before it reads
    assert prove(scratch).written >= 1 << 20
    subprocess.run([sys.executable, "-m", "qual.cli", "clean", str(tmp_path)], check=True,
                   timeout=60)
    assert not scratch.exists() and theirs.read_text() == "not qual's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["their-notes.txt"]


@pytest.mark.slow
def test_ctrl_c_during_dataset_generation_leaves_an_incomplete_dataset_that_is_redone(tmp_path):
    args = ["train", "--target", str(tmp_path), "--files", "96", "--record-scale", "0.1",
            "--computation-time", "1ms", "--keep"]
    proc = start(*args)
    w = training.workload_of(family_table(training.FAMILY, {"files": 96, "record_scale": 0.1,
                                                          "computation_time": "1ms",
                                                          "accelerators": [1], "epochs": [1]}))
    folder = tmp_path / dataset.FOLDER / w.name
    wait_for(lambda: (folder / "train").is_dir() and len(list((folder / "train").iterdir())) >= 3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, (out, err)
    manifest = json.loads((folder / dataset.MANIFEST).read_text())
    assert manifest["complete"] is False  # generation stopped before it was done
    made = len(list((folder / "train").iterdir()))
    assert made < 96
    data = dataset.prepare(Target(tmp_path), w)  # the next run does not trust it: redone
    assert data.files == 96 and all(Path(data.path(i)).stat().st_size == data.sizes[i]
                                    for i in range(96))
    assert json.loads((folder / dataset.MANIFEST).read_text())["complete"] is True
    training.remove(Target(tmp_path))
    assert not (tmp_path / dataset.FOLDER).exists()


@pytest.mark.slow
def test_ctrl_c_stops_a_suite_run_and_leaves_no_record_claiming_a_verdict(tmp_path):
    env = {**os.environ}
    proc = subprocess.Popen([sys.executable, "-m", "qual.cli", "run", "--results",
                             str(tmp_path / "res"), "-p", "no:randomly"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_for(lambda: (tmp_path / ".qual").exists(), timeout=120)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, out[-2000:])  # as `qual run --help` says
    assert "Traceback" not in err and "Exception ignored" not in out + err, err[-3000:]
    record = json.loads((tmp_path / "res" / "qual-run.json").read_text())
    assert record["summary"]["verdict"] != "PASS"  # what ran is recorded, and no pass claimed
    assert record["interrupted"].startswith("SIGINT (Ctrl-C)")
    assert "interrupted: SIGINT (Ctrl-C)" in out
    assert not (tmp_path / ".qual" / SCRATCH_NAME).exists() or \
        prove(tmp_path / ".qual" / SCRATCH_NAME) is not None
    # the folder qual made for its scratch file goes with it: nothing of qual's is left empty
    assert (tmp_path / ".qual" / SCRATCH_NAME).exists() or not (tmp_path / ".qual").exists()


@pytest.mark.slow
def test_ctrl_c_while_the_gnn_loaders_run_ends_quietly(tmp_path):
    """Ctrl-C in the middle of the GIDS loader's batches: exit 130 saying so, and no
    "Exception ignored" from a generator closed after its loader, no traceback."""
    proc = start("gnn", "--target", str(tmp_path), "--scale", "0.01", "--fanouts", "3,2",
                 "--steps", "2000", "--warmup", "1", "--batch-size", "128")
    said = []

    def stepping() -> bool:  # its first progress line (then one every 10 s at most)
        said.append(proc.stderr.readline())
        return "gids: step " in said[-1]
    wait_for(stepping, timeout=120)
    time.sleep(1.0)  # well into its 2000 batches
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = "".join(said) + err
    assert proc.returncode == 130 and "qual gnn: interrupted" in err, err[-3000:]
    assert "Exception ignored" not in err and "Traceback" not in err, err[-3000:]

"""The plan before any I/O and the raw namespace qualified end to end: `qual run --plan`, a run
refused once with exit 4 (nothing written), the file families on the filesystem qual makes on
a raw device, and the device left blank however the run ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from qual.plan import calibration
from qual.targets.filesystem import label_for
from testbed import CI_DEVICE, TINY_PROFILE, blank, needs_root, qual, serial_of, sh, sha256_of

@pytest.mark.slow
def test_plan_lists_every_test_and_runs_nothing(tmp_path):
    proc = qual("run", "--profile", str(TINY_PROFILE), "--plan", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["refusals"] == [] and plan["kind"] == "file"
    ids = [t["id"] for t in plan["tests"]]
    assert "test_bandwidth.py::test_cell[seq_read-64K-qd4]" in ids  # relative to suites/
    for t in plan["tests"]:
        assert {"id", "family", "bytes_written", "bytes_read", "estimate_s", "where"} <= set(t)
    cells = [t for t in plan["tests"] if "test_cell" in t["id"]]
    assert all(t["estimate_s"] >= 0.2 for t in cells)  # the profile's runtime per cell
    assert cells[0]["bytes_written"] >= 16 << 20  # the scratch file's fill, once
    assert cells[1]["bytes_written"] == 0 or "write" in cells[1]["id"]
    assert plan["total_estimate_s"] == pytest.approx(sum(t["estimate_s"] for t in plan["tests"]))
    assert not (tmp_path / ".qual").exists() and not (tmp_path / "qual-results").exists()
    human = qual("run", "--profile", str(TINY_PROFILE), "--plan", "-k", "seq_read",
                 cwd=tmp_path)
    assert human.returncode == 0 and "total:" in human.stdout
    assert "seq_read-64K-qd4" in human.stdout and "rand_read" not in human.stdout


@needs_root
def test_a_target_too_small_is_refused_once_saying_what_is_free(tmp_path, tmpfs):
    profile = tmp_path / "big.toml"
    profile.write_text(f'[profile]\nextends = "{TINY_PROFILE}"\ndescription = "too big"\n'
                       '[bandwidth]\nsize = "1 GiB"\n')
    proc = qual("run", "--target", str(tmpfs), "--profile", str(profile), cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 4, said
    assert "Traceback" not in said and said.count("does not fit") == 1
    assert "_pytest" not in said  # the sentence, never a pytest exception's name
    assert "needs 1 GiB" in said and "free" in said and "in reserve" in said
    assert os.listdir(tmpfs) == []  # no scratch file, no lock left


def test_a_device_that_does_not_exist_is_refused_by_a_sentence(tmp_path):
    proc = qual("run", "--target", "/dev/qual-no-such-device", "--profile", str(TINY_PROFILE),
                cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 4, said
    assert "ERROR: qual: the run cannot be planned: /dev/qual-no-such-device: does not exist" \
        in proc.stderr
    assert "_pytest" not in said and "Traceback" not in said


@needs_root
@pytest.mark.slow
def test_qual_fit_scales_a_region_down_and_every_figure_says_so(tmp_path, loop_device):
    drive = loop_device.mount(loop_device(256 << 20))  # ext4: the device's counters are truth
    profile = tmp_path / "big.toml"
    profile.write_text(f'[profile]\nextends = "{TINY_PROFILE}"\ndescription = "too big"\n'
                       '[bandwidth]\nsize = "1 GiB"\n')
    args = ["run", "--target", str(drive), "--profile", str(profile), "--qual-fit", "-k",
            "test_cell or test_latency"]
    plan = json.loads(qual(*args, "--plan", "--json", cwd=tmp_path).stdout)
    assert plan["refusals"] == []
    fitted = plan["fitted"]["bandwidth"]
    assert 64 << 20 < fitted["changes"]["size"] < 256 << 20
    assert "bandwidth.size 1 GiB ->" in fitted["caveat"]
    proc = qual(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    record = json.loads((tmp_path / "qual-results" / "qual-run.json").read_text())
    assert fitted["caveat"] in record["summary"]["caveats"]
    for t in record["tests"]:
        for m in t["measurements"]:
            assert fitted["caveat"] in m["context"]["caveats"]
            assert m["context"]["region_bytes"] == fitted["changes"]["size"]


@needs_root
@pytest.mark.slow
def test_a_small_raw_namespace_is_refused_before_any_io(tmp_path, ram_device):
    dev = ram_device(CI_DEVICE)
    before = sha256_of(dev)
    proc = qual("run", "--target", dev, "--profile", "gen4-qlc", "--qual-allow-destructive",
                "--qual-confirm-serial", serial_of(dev), cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 4, said[-3000:]
    assert "Traceback" not in said and "no tests ran" in said
    assert "the bandwidth region (bandwidth.size) needs 64 GiB; the device holds 2 GiB" in said
    assert "test_bandwidth.py::test_cell[seq_read-1M-qd128-r1]" in said  # 5 repeats
    for family in ("integrity", "PTS", "checkpoint", "IGBH", "dataset"):
        assert family in said
    assert sha256_of(dev) == before


@needs_root
def test_the_profile_chooses_qual_s_filesystem_and_its_tool_is_checked_first(tmp_path,
                                                                            ram_device):
    dev = ram_device(CI_DEVICE)
    profile = tmp_path / "xfs.toml"
    profile.write_text('[profile]\nextends = "ci"\ndescription = "ci on xfs"\n'
                       'filesystem = "xfs"\nfilesystem_options = ["-K"]\n')
    proc = qual("run", "--target", dev, "--profile", str(profile), "--qual-allow-destructive",
                "--qual-confirm-serial", serial_of(dev), "--plan", "--json", cwd=tmp_path)
    plan = json.loads(proc.stdout)
    assert plan["filesystem"] == {"type": "xfs", "options": ["-K"]}
    missing = [r for r in plan["refusals"] if "needs mkfs.xfs" in r]
    assert bool(missing) == (shutil.which("mkfs.xfs") is None)
    assert proc.returncode == (4 if missing else 0)


@needs_root
@pytest.mark.slow
def test_kept_data_adds_up_family_by_family(tmp_path, ram_device):
    """On 700 MiB, qual's filesystem offers 609 MiB: each ci file family fits alone (the
    GNN's 429 MiB the most), all four kept to the end (798 MiB) do not."""
    dev = ram_device(700 << 20)
    args = ["run", "--target", dev, "--qual-allow-destructive", "--qual-confirm-serial",
            serial_of(dev), "--plan", "--json"]
    alone = json.loads(qual(*args, cwd=tmp_path).stdout)
    assert alone["refusals"] == []
    kept = json.loads(qual(*args, "--qual-keep-scratch", cwd=tmp_path).stdout)
    (why,) = kept["refusals"]
    assert why.startswith("--qual-keep-scratch keeps every file family's data")
    roomy = ram_device(CI_DEVICE)  # 1.88 GB: the four families' 798 MiB fit, kept or not
    args[2], args[5] = roomy, serial_of(roomy)
    assert json.loads(qual(*args, "--qual-keep-scratch", cwd=tmp_path).stdout)["refusals"] == []


@needs_root
def test_qual_run_with_workers_plans_first_and_is_refused_once(tmp_path, ram_device):
    dev = ram_device(CI_DEVICE)
    proc = qual("run", "--target", dev, "--qual-allow-destructive", "-n", "2", cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 4, said[-3000:]
    assert said.count("guard: serial:") == 1 and "Traceback" not in said
    assert not (tmp_path / "qual-results" / "qual-run.json").exists()  # no worker started


def test_the_last_run_scales_each_test_s_estimate_by_its_own_ratio():
    previous = {"host": {"hostname": socket.gethostname()},
                "plan": {"target": "drive", "tests": [
                    {"id": "a", "family": "pts", "estimate_s": 9.0, "model_s": 2.0},
                    {"id": "b", "family": "pts", "estimate_s": 4.0, "model_s": 4.0},
                    {"id": "c", "family": "pts", "estimate_s": 1.0, "model_s": 1.0}]},
                "tests": [{"nodeid": "a", "duration_s": 8.0, "outcome": "passed"},
                          {"nodeid": "b", "duration_s": 2.0, "outcome": "passed"},
                          {"nodeid": "c", "duration_s": 1.5, "outcome": "skipped"}]}
    factors, basis = calibration(previous, "drive")
    assert factors["a"] == 4.0  # against its model, not its already-scaled estimate
    assert factors["b"] == 0.5 and "c" not in factors  # a skipped test measured nothing
    assert factors["pts"] == pytest.approx(2.25)  # the family's median, for tests not run
    assert "scaled test by test" in basis
    assert calibration(previous, "another drive") == ({}, "model")
    assert calibration({**previous, "host": {"hostname": "elsewhere"}}, "drive")[0] == {}


@needs_root
@pytest.mark.slow
def test_a_raw_namespace_without_its_serial_is_refused_once(tmp_path, ram_device):
    dev = ram_device(CI_DEVICE)
    before = sha256_of(dev)
    proc = qual("run", "--target", dev, "--qual-allow-destructive", cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 4, said[-3000:]
    assert "Traceback" not in said
    assert said.count("guard: serial: confirm the drive with --qual-confirm-serial") == 1
    assert "does not fit" not in said
    assert sha256_of(dev) == before


def _mounted_by(pid: int) -> bool:
    """Whether process pid, or the command it supervises (qual.watchdog.supervised), has
    qual's filesystem mounted (in its own mount namespace)."""
    from qual.watchdog import _descendants

    for p in _descendants(pid):
        try:
            if "qual-fs-" in Path(f"/proc/{p}/mountinfo").read_text():
                return True
        except OSError:
            continue
    return False


def _start_file_families(dev: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "qual.cli", "run", "--target", dev,
                             "--qual-allow-destructive", "--qual-confirm-serial", serial_of(dev),
                             "-k", "test_training_io or test_checkpoint"], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_mounted(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not _mounted_by(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, "qual never mounted its fs"
        time.sleep(0.05)
    time.sleep(2)  # into the family's I/O


@needs_root
@pytest.mark.slow
def test_ctrl_c_while_the_file_families_run_leaves_the_device_blank(tmp_path, ram_device):
    dev = ram_device(CI_DEVICE)
    proc = _start_file_families(dev, tmp_path)
    _wait_mounted(proc)
    assert not subprocess.run(["findmnt", "--source", dev], capture_output=True,
                              text=True).stdout.strip()  # mounted where only qual sees it
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]  # interrupted, as `qual run --help` says
    assert blank(dev), subprocess.run(["blkid", "-p", dev], capture_output=True, text=True).stdout
    record = json.loads((tmp_path / "qual-results" / "qual-run.json").read_text())
    assert record["interrupted"].startswith("SIGINT") and "interrupted: SIGINT" in out


@needs_root
@pytest.mark.slow
def test_a_killed_run_leaves_nothing_mounted_and_clean_erases_only_qual_s_filesystem(
        tmp_path, ram_device):
    dev = ram_device(CI_DEVICE)
    proc = _start_file_families(dev, tmp_path)
    _wait_mounted(proc)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30  # the kernel unmounts as the namespace goes
    while subprocess.run(["blkid", "-p", dev], capture_output=True).returncode == 2 or \
            not _released(dev):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "LABEL=\"qual" in sh("blkid", "-p", dev)
    refused = qual("run", "--target", dev, "--qual-allow-destructive", "--qual-confirm-serial",
                   serial_of(dev), cwd=tmp_path)
    assert refused.returncode == 4
    assert f"qual's own ext4 filesystem, left by a run that was killed: `qual clean {dev}`" in \
        refused.stdout + refused.stderr
    assert qual("clean", dev, cwd=tmp_path).returncode == 0
    assert blank(dev)
    sh("mkfs.ext4", "-q", "-F", dev)  # someone else's filesystem: never erased
    theirs = qual("clean", dev, cwd=tmp_path)
    assert theirs.returncode == 1 and "qual did not make" in theirs.stderr
    assert subprocess.run(["blkid", "-p", dev], capture_output=True).returncode == 0


def _released(dev: str) -> bool:
    try:
        os.close(os.open(dev, os.O_RDONLY | os.O_EXCL))
        return True
    except OSError:
        return False



@needs_root
@pytest.mark.parametrize("whose", ["qual-like", "another's qual label", "qual's"])
def test_clean_erases_a_filesystem_only_where_its_label_proves_its_uuid(tmp_path, ram_device,
                                                                        whose):
    """qual's mark is "qual" and a hash of the filesystem's UUID: a label that merely looks
    like qual's, or qual's label of another filesystem (its UUID differs), is never erased."""
    dev = ram_device(64 << 20)
    mine = str(uuid.uuid4())
    label = {"qual-like": "qual1a2b3c4d", "another's qual label": label_for(str(uuid.uuid4())),
             "qual's": label_for(mine)}[whose]
    sh("mkfs.ext4", "-q", "-F", "-L", label, "-U", mine, dev)
    cleaned = qual("clean", dev, cwd=tmp_path)
    if whose == "qual's":
        assert cleaned.returncode == 0, cleaned.stderr
        assert blank(dev)
    else:
        assert cleaned.returncode == 1 and "qual did not make" in cleaned.stderr, cleaned.stderr
        assert f"LABEL=\"{label}\"" in sh("blkid", "-p", dev)

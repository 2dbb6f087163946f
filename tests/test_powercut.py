"""Power cuts on a loop device (qual.workloads.powercut): its cut detaches it and attaches its
file again, which loses nothing, so every clean cycle verifies with nothing lost; the verifier
is proven by damage planted in the file while it is detached (tests/powercut_damage.py): a
flushed block put back, a block half old and half new, a byte past the region, each FAILs
naming its LBA and nothing else. A cut that never comes back is an ERROR within its bound; a
host cut (the run killed at the cut) is verified by `qual run --resume`. The same on QEMU's
NVMe controller: tests/test_nvme_powercut.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qual import first_page
from testbed import loops_of, needs_root, sh

pytestmark = needs_root
HERE = Path(__file__).parent
DAMAGE = HERE / "powercut_damage.py"
STATE = "flushed_data_survives_power_cuts.state"  # a suite run's, beside its record
QUICK = ["--cycles", "2", "--size", "2M", "--flush-every", "128K", "--cut-from", "0.1s",
         "--cut-until", "0.3s", "--return-timeout", "20s", "--queue-depth", "8"]


class Loop:
    """A loop device over a file in /dev/shm; whatever loop device holds the file at the end
    (a cut may attach it elsewhere) is detached, and the file removed."""

    def __init__(self, name: str, size: int = 8 << 20):
        self.file = Path("/dev/shm") / f"qual-test-{os.getpid()}-{name}.img"
        with open(self.file, "wb") as f:
            f.truncate(size)
        self.dev = sh("losetup", "--find", "--show", str(self.file))

    def now(self) -> list[str]:
        """The loop devices that hold the file now."""
        return loops_of(self.file)

    def close(self) -> None:
        for dev in self.now():
            subprocess.run(["losetup", "--detach", dev], capture_output=True)
        self.file.unlink(missing_ok=True)


@pytest.fixture
def loop():
    made = []

    def make(name: str = "pc") -> Loop:
        made.append(Loop(name))
        return made[-1]
    yield make
    for storage in made:
        storage.close()


def powercut(dev: str, serial: str, *args: str, cwd: Path,
             timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qual.cli", "powercut", "--target", dev,
                           "--allow-destructive", "--confirm-serial", serial, *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def events(state: Path) -> list[str]:
    return [json.loads(line)["event"] for line in state.read_text().splitlines()]


def pending(state: Path) -> bool:
    """A cut began and was never verified (a chunk in flight may log its flush after it)."""
    kinds = events(state)
    return "cut" in kinds and not {"returned", "verified"} & set(kinds[kinds.index("cut"):])


def test_clean_cuts_of_a_loop_device_lose_nothing(loop, tmp_path):
    storage = loop()
    sentinel = os.urandom(4096)  # past the region's guard band: never written
    with open(storage.file, "r+b") as f:
        f.seek(6 << 20)
        f.write(sentinel)
    state = tmp_path / "pc.state"
    proc = powercut(storage.dev, str(storage.file), *QUICK, "--power-cut", "loop", "--state",
                    str(state), "--json", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["totals"]["lost"] == doc["totals"]["torn"] == 0
    assert doc["totals"]["outside_changed"] == 0
    assert doc["cut"]["how"] == "loop" and "losetup -d" in doc["cut"]["command"]
    assert doc["atomic_unit"]["bytes"] == 512  # the loop device's logical block
    assert [c["cycle"] for c in doc["cycles"]] == [1, 2]
    for c in doc["cycles"]:
        assert c["blocks"] == (2 << 20) // 512 and c["bad"] == []
        assert c["return_s"] >= 1.0  # the cut leaves the device detached for a second
        unflushed = c["counts"]["unflushed_old"] + c["counts"]["unflushed_new"]
        assert unflushed in (0, (128 << 10) // 512)  # the chunk in flight, whole, or none
    assert events(state)[:2] == ["qual powercut state", "begin"]
    kinds = events(state)
    assert kinds.count("cut") == kinds.count("returned") == kinds.count("verified") == 2
    assert kinds[-1] == "end"
    assert storage.now(), "the file is attached again after the last cut"
    with open(storage.file, "rb") as f:
        f.seek(6 << 20)
        assert f.read(4096) == sentinel


@pytest.mark.parametrize("kind", ["lost", "torn", "outside"])
def test_damage_planted_between_cut_and_return_fails_naming_its_lba(loop, tmp_path, kind):
    storage = loop(kind)
    state = tmp_path / "pc.state"
    planted = tmp_path / "planted"
    cut = (f"losetup -d {{device}} && {shlex.quote(sys.executable)} {DAMAGE} {state} "
           f"{storage.file} {kind} > {planted} && losetup --find {storage.file}")
    proc = powercut(storage.dev, str(storage.file), *QUICK, "--cycles", "1", "--power-cut",
                    cut, "--state", str(state), "--json", "-q", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    lba = int(planted.read_text())
    name = {"lost": "lost", "torn": "torn", "outside": "outside_changed"}[kind]
    assert {k: doc["totals"][k] for k in ("lost", "torn", "outside_changed")} == {
        k: int(k == name) for k in ("lost", "torn", "outside_changed")}
    (bad,) = doc["cycles"][0]["bad"]
    assert bad["lba"] == lba and bad["kind"] == name, bad
    if kind == "lost":  # the expected sequence and what was read
        assert "a completed flush covered it: expected sequence" in bad["what"]
        assert "read sequence" in bad["what"]
    if kind == "torn":
        assert "torn inside the atomic write unit (512 bytes)" in bad["what"]


def test_a_drive_that_never_comes_back_is_an_error_within_its_bound(loop, tmp_path):
    storage = loop()
    started = time.monotonic()
    proc = powercut(storage.dev, str(storage.file), *QUICK, "--power-cut",
                    "losetup -d {device}", "--return-timeout", "3s", "--state",
                    str(tmp_path / "pc.state"), "-q", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"(serial {storage.file}) did not come back within 3 s of its power cut" in \
        proc.stderr, proc.stderr
    assert time.monotonic() - started < 60
    assert pending(tmp_path / "pc.state")  # cut, never returned nor verified


def test_what_cannot_run_is_refused_before_any_io(loop, tmp_path):
    storage = loop()
    state = tmp_path / "pc.state"
    # no consent: the guard refuses, nothing written, no state
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "powercut", "--target",
                           storage.dev, *QUICK, "--power-cut", "loop", "--state", str(state)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1 and "allow-destructive" in proc.stderr, proc.stderr
    assert not state.exists() and storage.file.read_bytes() == bytes(8 << 20)
    # a file is no drive: not applicable (4), saying why
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "powercut", "--target",
                           str(tmp_path / "scratch"), "--state", str(state)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 4, proc.stderr
    assert "not applicable" in proc.stderr and "a power cut needs a block device" in proc.stderr
    # flags that cannot make a run: 2, before any I/O
    for bad, said in ((["--power-cut", "cut {slot}"], "{slot} is not one of"),
                      (["--size", "1M", "--flush-every", "768K"], "is not a multiple of")):
        proc = powercut(storage.dev, str(storage.file), *QUICK, *bad, "--state", str(state),
                        cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert not state.exists() and storage.file.read_bytes() == bytes(8 << 20)


PROFILE = """[profile]
description = "tests: power cuts of a loop device"

[powercut]
command = "loop"
cycles = 2
size = "2 MiB"
flush_every = "128 KiB"
queue_depth = 8
cut_from = "0.1 s"
cut_until = "0.3 s"
return_timeout = "20 s"
"""


def test_a_host_cut_is_verified_first_by_the_resumed_run(loop, tmp_path):
    """The cut of cycle 1 kills the run itself (the host going down with the drive); `qual run
    --resume` finds the cut pending in the state, verifies it, and does cycle 2."""
    storage = loop()
    profile = tmp_path / "pc.toml"
    profile.write_text(PROFILE)
    results = tmp_path / "results"
    mark = tmp_path / "host-went-down"
    cut = (f"if [ ! -e {mark} ]; then touch {mark}; kill -9 $PPID; exit 0; fi; "
           f"losetup -d {{device}} && sleep 1 && losetup --find {storage.file}")
    run = [sys.executable, "-m", "qual.cli", "run", "--target", storage.dev, "--profile",
           str(profile), "--qual-allow-destructive", "--qual-confirm-serial", str(storage.file),
           "--qual-power-cut", cut]
    first = subprocess.run([*run, "--results", str(results)], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    # killed at the cut: no verdict, no record's exit status
    assert first.returncode not in (0, 1, 4) and mark.exists(), first.stdout[-2000:] + \
        first.stderr
    state = results / STATE
    assert pending(state)
    second = subprocess.run([*run, "--resume", str(results)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    record = json.loads((results / "qual-run.json").read_text())
    (test,) = [t for t in record["tests"] if "test_flushed_data_survives" in t["nodeid"]]
    assert test["outcome"] == "passed"
    found = {m["metric"]: m for m in test["measurements"]}
    assert found["powercut_cycles"]["value"] == 2
    assert found["powercut_flushed_lost"]["value"] == 0
    assert found["powercut_return_time"]["context"]["return_s"][0] is None  # the host's: untimed
    assert found["powercut_return_time"]["context"]["return_s"][1] >= 1.0
    kinds = events(state)
    assert kinds.count("cut") == kinds.count("verified") == 2 and kinds[-1] == "end"


def test_a_lost_block_fails_the_run_and_heads_the_reports_first_page(loop, tmp_path):
    storage = loop()
    profile = tmp_path / "pc.toml"
    profile.write_text(PROFILE.replace("cycles = 2", "cycles = 1"))
    results = tmp_path / "results"
    planted = tmp_path / "planted"
    cut = (f"losetup -d {{device}} && {shlex.quote(sys.executable)} {DAMAGE} "
           f"{results / STATE} {storage.file} lost > {planted} && "
           f"losetup --find {storage.file}")
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "run", "--target", storage.dev,
                           "--profile", str(profile), "--qual-allow-destructive",
                           "--qual-confirm-serial", str(storage.file), "--qual-power-cut", cut,
                           "--results", str(results), "-k", "powercut"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    record = json.loads((results / "qual-run.json").read_text())
    assert record["summary"]["verdict"] == "FAIL"
    (failed,) = [v for t in record["tests"] for v in t.get("verdicts", ()) if not v["passed"]]
    assert failed["id"] == "powercut_flushed_lost" and "qual: what a completed flush" in \
        failed["line"], failed  # the standing criterion: no profile need state it
    lba = int(planted.read_text())
    page = first_page.page([record], None)
    assert f"<b class='LOST'>LOST</b> LBA {lba} after power cut 1: lost: a completed flush " \
        "covered it: expected sequence" in page, page[:3000]


def test_the_plan_lists_the_cut_it_will_run(loop, tmp_path):
    storage = loop()
    profile = tmp_path / "pc.toml"
    profile.write_text(PROFILE)
    bmc = "ipmitool -H bmc7 chassis power cycle # {serial}"
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "run", "--target", storage.dev,
                           "--profile", str(profile), "--plan", "--qual-power-cut", bmc],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 4, proc.stderr  # refused: no consent given, nothing written
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "test_flushed_data_survives" in line)
    assert lines[at + 1].strip().startswith(f"cuts the drive's power 2 times with: {bmc}")
    assert not any("test_health" in line for line in lines)  # a cut restarts its counters
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "run", "--target", storage.dev,
                           "--plan", "--qual-power-cut", bmc],  # ci: no [powercut] table
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 4 and "has no [powercut] table" in proc.stdout + proc.stderr


def test_a_cut_command_dies_with_a_killed_qual(loop, tmp_path):
    storage = loop()
    pid = tmp_path / "cut.pid"
    proc = subprocess.Popen([sys.executable, "-m", "qual.cli", "powercut", "--target",
                             storage.dev, "--allow-destructive", "--confirm-serial",
                             str(storage.file), *QUICK, "--power-cut",
                             f"echo $$ > {pid}; exec sleep 300", "--state",
                             str(tmp_path / "pc.state"), "-q"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pid.exists() and pid.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None, "no cut began"
            time.sleep(0.05)
        cut = int(pid.read_text())
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{cut}").exists() and "zombie" not in Path(
                f"/proc/{cut}/status").read_text(errors="replace").lower():
            assert time.monotonic() < deadline, "the cut command outlived qual"
            time.sleep(0.05)
    finally:
        proc.kill()


def test_a_drive_back_under_another_name_is_cut_there_next(loop, tmp_path):
    """The first cut leaves the device's name to another file, so the drive comes back under
    a new one; the second cut must take the drive where it is now, not the old name's."""
    storage, other = loop("moved"), loop("other")
    cut = (f"losetup -d {{device}} && losetup {{device}} {other.file} && "
           f"losetup --find {storage.file}")
    proc = powercut(storage.dev, str(storage.file), *QUICK, "--power-cut", cut, "--state",
                    str(tmp_path / "pc.state"), "--json", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [c["bad"] for c in doc["cycles"]] == [[], []]
    assert doc["cycles"][0]["device"] != storage.dev  # it came back elsewhere
    assert len(storage.now()) == 1, storage.now()  # each cut took the drive itself
    assert storage.dev in other.now()  # and left the other file where the first cut put it

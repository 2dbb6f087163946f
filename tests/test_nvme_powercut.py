"""Power cuts of an NVMe drive (qual.workloads.powercut) on QEMU's emulated controller under the
kernel's nvme driver (tests/nvmeguest.py). The cut is the test's, asked for by the cut command
qual runs in the guest (cut.sh: a request file in the shared folder, answered): the controller
pulled from its slot over QMP and plugged back over the same file (a drive-only cut), or QEMU
killed and booted again over the same files (the host's power too, then `--qual-resume`).
QEMU loses nothing a flush covered, so every clean cycle verifies with nothing lost; the
verifier is proven by damage planted in the namespace's file while the controller is out
(tests/powercut_damage.py): each FAILs naming its LBA and nothing else. A controller never
plugged back ends its run with an error within the return bound."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

import powercut_damage
from nvmeguest import FIND, Drive, Guest, missing, record_of, suite_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500),
              pytest.mark.skipif(bool(missing()), reason=missing() or "")]

PROFILE = Path(__file__).resolve().parent / "profiles" / "nvme-powercut.toml"
SERIAL = "QUALCUT"
DAMAGE = ("lost", "torn", "outside")
CHUNK_BLOCKS = (1 << 20) // 4096  # a flush's worth of 4 KiB atomic units


def cut_script(shared: Path) -> str:
    """cut.sh KIND: ask the test for a cut and wait (bounded) for its answer; the request goes
    before the answer, so the test never answers one twice."""
    return (f"cd {shlex.quote(str(shared))}; touch req-$1; i=0\n"
            "while [ ! -e ack-$1 ] && [ $i -lt 1800 ]; do sleep 0.1; i=$((i+1)); done\n"
            "rm -f req-$1; rm -f ack-$1\n")


def powercut(kind: str, cycles: int, bound: str, cut: str | None = None) -> str:
    """A `qual powercut` of the drive whose cut is `cut` (default cut.sh KIND), its JSON,
    stderr and exit status in KIND.json, KIND.err, KIND.rc."""
    return (f"python3 -m qual.cli powercut --target $(dev {SERIAL}) --allow-destructive "
            f"--confirm-serial {SERIAL} --size 8M --flush-every 1M --queue-depth 8 "
            f"--cut-from 0.3s --cut-until 1s --cycles {cycles} --return-timeout {bound} "
            f"--power-cut {shlex.quote(cut or f'sh cut.sh {kind}')} --state {kind}.state "
            f"--json -q > {kind}.json 2> {kind}.err; echo $? > {kind}.rc\n")


class Harness:
    """The test's side of cut.sh: each request a cut, made from outside the guest."""

    def __init__(self, guest: Guest):
        self.guest = guest
        self.planted: dict[str, int] = {}
        self.asked: dict[str, float] = {}

    def serve(self, until: str, timeout: float, *, host_cut: bool = False) -> bool:
        """Answer requests until the guest makes `until`; with `host_cut`, a request `host`
        kills QEMU (returns True)."""
        shared = self.guest.shared
        deadline = time.monotonic() + timeout
        while not (shared / until).exists():
            if self.guest.proc.poll() is not None:
                raise AssertionError(f"the guest ended before {until}:\n"
                                     f"{self.guest.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{until} did not appear in {timeout} s:\n"
                                     f"{self.guest.output()[-4000:]}")
            for req in sorted(shared.glob("req-*")):
                kind = req.name.removeprefix("req-")
                if (shared / f"ack-{kind}").exists():
                    continue  # answered; cut.sh has not cleared it yet
                self.asked[kind] = time.monotonic()
                if kind == "host" and host_cut:
                    self.guest.power_off()  # the whole host loses its power, now
                    req.unlink()  # its cut.sh died with it: the next guest asks anew
                    return True
                self.guest.pull(0)
                if kind in DAMAGE:
                    self.planted[kind] = powercut_damage.plant(
                        shared / f"{kind}.state", self.guest.image(0), kind)
                if kind != "never":
                    self.guest.plug(0)
                (shared / f"ack-{kind}").touch()
            time.sleep(0.1)
        return False


@pytest.fixture(scope="module")
def cuts(tmp_path_factory):
    """Guest 1: two clean cuts, one run per planted damage, one cut never answered by a plug,
    then a suite run whose first cut takes the host down (QEMU killed). Guest 2, booted over
    the same files: the run resumed (`--qual-resume`): the host's cut verified first, then
    a drive-only cut."""
    where = tmp_path_factory.mktemp("powercut")
    drives = [Drive(SERIAL, size=32 << 20, lba=4096, slot=True)]
    guest = Guest(drives, where)
    suite = suite_run("host", [SERIAL], "--qual-power-cut=sh cut.sh host", profile=PROFILE)
    guest.shared.mkdir(parents=True, exist_ok=True)
    (guest.shared / "cut.sh").write_text(cut_script(guest.shared))
    harness = Harness(guest)
    again = Guest(drives, where, reuse=True)
    try:
        guest.start(FIND + "dmesg -w > dmesg1.txt 2>&1 &\n" + powercut("clean", 2, "90s")
                    + powercut("rescan", 1, "90s", cut="rescan")
                    + "".join(powercut(kind, 1, "90s") for kind in DAMAGE)
                    + powercut("never", 1, "10s")
                    + "while [ ! -e replugged ]; do sleep 0.1; done\n"
                    + f"for i in $(seq 300); do dev {SERIAL} > /dev/null && break; sleep 0.1; "
                      "done\n"
                    + f"{suite} > host.txt 2>&1\necho $? > host.rc\n",
                    env={"QUAL_STORE": "off", "PYTHONUNBUFFERED": "1"})
        harness.serve("never.rc", 600)
        guest.plug(0)  # the controller the `never` run left out, back for the suite run
        (guest.shared / "replugged").touch()
        assert harness.serve("host.rc", 400, host_cut=True), "the suite run never cut the host"
        again.start(FIND + "dmesg -w > dmesg2.txt 2>&1 &\n"
                    + f"{suite} --qual-resume > resumed.txt 2>&1\necho $? > resumed.rc\n",
                    env={"QUAL_STORE": "off", "PYTHONUNBUFFERED": "1"})
        Harness(again).serve("resumed.rc", 400)
        again.wait(60)
        yield guest, harness
    finally:
        again.power_off()  # the folder both guests use goes with the first
        guest.close()


def doc(guest: Guest, kind: str) -> tuple[int, dict]:
    shared = guest.shared
    rc = int((shared / f"{kind}.rc").read_text())
    out = (shared / f"{kind}.json").read_text()
    return rc, json.loads(out) if out.strip() else {"stderr": (shared / f"{kind}.err").read_text()}


def test_clean_cuts_of_an_nvme_drive_lose_nothing(cuts):
    guest, _ = cuts
    rc, found = doc(guest, "clean")
    assert rc == 0, found
    assert found["serial"] == SERIAL and found["device"].startswith("/dev/nvme")
    assert found["atomic_unit"] == {"bytes": 4096, "source": "Identify Controller AWUPF"}
    assert {k: found["totals"][k] for k in ("lost", "torn", "outside_changed")} == {
        "lost": 0, "torn": 0, "outside_changed": 0}
    assert [c["cycle"] for c in found["cycles"]] == [1, 2]
    for c in found["cycles"]:
        assert c["blocks"] == (8 << 20) // 4096 and c["bad"] == []
        assert 0 < c["return_s"] < 90  # the pull, the plug and the guest's hotplug
        unflushed = c["counts"]["unflushed_old"] + c["counts"]["unflushed_new"]
        assert unflushed in (0, CHUNK_BLOCKS), c  # the chunk the pull caught, or none
        assert c["interrupted"], c  # the pull failed the writes in flight


def test_qual_s_own_hot_removal_and_rescan_loses_nothing(cuts):
    """`rescan`: the controller removed from the PCI bus in the guest and found again (its
    power stays on: QEMU's slot power-off would detach it for good, so `slot` cannot be
    cycled here)."""
    guest, _ = cuts
    rc, found = doc(guest, "rescan")
    assert rc == 0, found
    assert found["cut"]["how"] == "rescan" and "/remove" in found["cut"]["command"]
    (c,) = found["cycles"]
    assert c["bad"] == [] and c["blocks"] == (8 << 20) // 4096 and c["return_s"] > 1.0


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_planted_while_the_controller_is_out_fails_naming_its_lba(cuts, kind):
    guest, harness = cuts
    rc, found = doc(guest, kind)
    assert rc == 1, found
    name = {"lost": "lost", "torn": "torn", "outside": "outside_changed"}[kind]
    assert {k: found["totals"][k] for k in ("lost", "torn", "outside_changed")} == {
        k: int(k == name) for k in ("lost", "torn", "outside_changed")}, found["totals"]
    (bad,) = found["cycles"][0]["bad"]
    assert bad["kind"] == name and bad["lba"] == harness.planted[kind], bad


def test_a_controller_never_plugged_back_is_an_error_within_its_bound(cuts):
    guest, _ = cuts
    rc, found = doc(guest, "never")
    assert rc == 1
    assert f"(serial {SERIAL}) did not come back within 10 s of its power cut" in \
        found["stderr"], found


def test_a_host_cut_is_verified_first_in_the_next_boot(cuts):
    guest, _ = cuts
    assert not (guest.shared / "host.rc").exists()  # the first run died with its host
    assert int((guest.shared / "resumed.rc").read_text()) == 0, \
        (guest.shared / "resumed.txt").read_text()[-4000:]
    record = record_of(guest.shared / "host", SERIAL)
    (test,) = [t for t in record["tests"] if "test_flushed_data_survives" in t["nodeid"]]
    assert test["outcome"] == "passed" and record["summary"]["verdict"] == "PASS"
    found = {m["metric"]: m for m in test["measurements"]}
    assert found["powercut_cycles"]["value"] == 2
    assert found["powercut_flushed_lost"]["value"] == found["powercut_torn"]["value"] == 0
    returns = found["powercut_flushed_lost"]["context"]["return_s"]
    assert returns[0] is None and returns[1] > 0  # the host's cut is not timed; the drive's is
    assert record["resumed"], record.get("resumed")

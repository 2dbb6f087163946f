"""How a drive's power is cut, and how its return is awaited.

The cut is the rig's: a command (a BMC's or a PDU's) with {serial}, {device} and {pci} filled
in. Where the platform has them, qual has its own drive-only cuts: `slot`, the PCIe slot's
power (/sys/bus/pci/slots/*/power) off and on; `rescan`, the controller removed from the PCI
bus and found again (the drive keeps its power: a hot removal, not a power loss); `loop`, a
loop device detached and its file attached again. `auto` is `loop` for a loop device and
`slot` where the drive's slot has power control; anything else is not applicable, saying why.

A drive that comes back is the same serial (and namespace id) at whatever name the kernel
gives it, answering a read; the wait is bounded, and its time is a figure."""

from __future__ import annotations

import errno
import os
import shlex
import signal
import string
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from qual import watchdog
from qual.errors import InvalidJob, NotApplicable, QualError, TargetUnavailable
from qual.targets.identity import disk_dir, find_disk, namespace_id, read_sysfs

WORDS = {  # qual's own cuts, as the plan says them
    "auto": "qual's own: a loop device detached and attached again, or the PCIe slot's power "
            "off and on",
    "slot": "qual's own: the PCIe slot's power off and on (/sys/bus/pci/slots/*/power)",
    "rescan": "qual's own: the controller removed from the PCI bus and found again (the drive "
              "keeps its power)",
    "loop": "qual's own: the loop device detached and its file attached again",
}
BUILTIN = tuple(WORDS)
OFF_S = 1.0  # how long qual's own cuts leave the drive off
SLOTS = Path("/sys/bus/pci/slots")


def _inapplicable(message: str, spec: str) -> NotApplicable:
    return NotApplicable(errno.EOPNOTSUPP, message, target=spec)


class CutFailed(QualError):
    """The cut did not happen as asked, or the drive did not come back within its bound."""


@dataclass(frozen=True)
class Drive:
    """Who the cut drive is, to find it again: serial, transport, namespace id; its PCI
    address where it is on PCI."""

    serial: str
    transport: str | None
    nsid: int | None
    pci: str | None

    @classmethod
    def of(cls, target) -> Drive:
        disk = disk_dir(target._sysfs)
        return cls(target.identity.serial, target.identity.transport, namespace_id(disk),
                   pci_address(disk))


def pci_address(disk: Path) -> str | None:
    """The PCI function above a disk in sysfs (0000:01:00.0), or None."""
    for parent in disk.resolve().parents:
        if (parent / "subsystem").resolve().name == "pci" and (parent / "vendor").exists():
            return parent.name
    return None


def slot_of(pci: str | None) -> Path | None:
    """The PCIe slot that holds a PCI function and can switch its power, or None."""
    if not pci or not SLOTS.is_dir():
        return None
    bus = pci.rsplit(".", 1)[0]
    for slot in sorted(SLOTS.iterdir()):
        if read_sysfs(slot / "address") == bus and (slot / "power").exists():
            return slot
    return None


@dataclass(frozen=True)
class Cut:
    """A cut, resolved for one drive: `how` (command, slot, rescan, loop), the shell line it
    runs (for the plan and the record), and whether qual stops writing before it (a loop
    device: nobody can take its power while the writer holds it)."""

    how: str
    line: str
    quiesce: bool = False

    def run(self, timeout: float) -> None:
        """The cut, bounded by `timeout`: its process group killed past it, its shell killed
        with qual. A command that fails or outlives its bound is a CutFailed naming its exit
        and its last words."""
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", self.line], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True,
                                    preexec_fn=watchdog.dies_with_me())
        except OSError as e:
            raise CutFailed(e.errno, f"the power-cut command could not start: {e.strerror}")
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CutFailed(errno.ETIMEDOUT, f"the power-cut command `{self.line}` had not "
                            f"ended after {timeout:g} s; it was killed") from None
        if proc.returncode != 0:
            said = out.decode(errors="replace").strip().splitlines()[-3:]
            raise CutFailed(errno.EIO, f"the power-cut command `{self.line}` failed (exit "
                            f"{proc.returncode})" + (f": {' / '.join(said)}" if said else ""))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def resolve(command: str, target) -> Cut:
    """The cut `command` means for this target, checked before any I/O: NotApplicable where
    nothing can cut its power, QualError for a command that names what the drive lacks."""
    if target.kind != "block":
        raise _inapplicable(f"{target.spec} is a {target.kind}, not a drive: a power cut needs "
                            "a block device (an NVMe namespace, a loop device)", target.spec)
    drive = Drive.of(target)
    if not drive.serial:
        raise _inapplicable("the drive names no serial: after a cut nothing could tell that "
                            "what came back is the same drive", target.spec)
    loop = drive.transport == "loop"
    if command in BUILTIN:
        return _builtin(command, target, drive)
    fields = {"serial": drive.serial, "device": str(target.path), "pci": drive.pci}
    try:
        names = [n for _, n, _, _ in string.Formatter().parse(command) if n]
    except ValueError as e:
        raise InvalidJob(errno.EINVAL, f"--power-cut {command!r}: {e}") from None
    for name in names:
        if name not in fields:
            raise InvalidJob(errno.EINVAL, f"--power-cut {command!r}: {{{name}}} is not one of "
                            "{serial}, {device}, {pci}")
        if fields[name] is None:
            raise InvalidJob(errno.EINVAL, f"--power-cut {command!r}: {{{name}}}: "
                            f"{target.spec} is not on PCI")
    line = command.format(**{k: shlex.quote(v) for k, v in fields.items() if v is not None})
    return Cut("command", line, quiesce=loop)


def _builtin(word: str, target, drive: Drive) -> Cut:
    if word == "auto":
        if drive.transport == "loop":
            word = "loop"
        elif slot_of(drive.pci):
            word = "slot"
        else:
            raise _inapplicable(
                "nothing here cuts this drive's power: give the rig's command with --power-cut "
                f"(a BMC or PDU command; {{serial}}, {{device}}, {{pci}} are filled in), or "
                f"`rescan` for a hot removal; its PCIe slot has no power control "
                f"({'no PCI address' if not drive.pci else f'no slot under {SLOTS} for {drive.pci}'})",
                target.spec)
    if word == "loop":
        if drive.transport != "loop":
            raise _inapplicable(f"`loop` cuts a loop device; {target.spec} is not one",
                                target.spec)
        return Cut("loop", _loop_line(target), quiesce=True)
    if word == "slot":
        slot = slot_of(drive.pci)
        if slot is None:
            raise _inapplicable(f"`slot`: {target.spec}'s PCIe slot has no power control "
                                f"({drive.pci or 'not on PCI'})", target.spec)
        power = shlex.quote(str(slot / "power"))
        return Cut("slot", f"echo 0 > {power} && sleep {OFF_S:g} && echo 1 > {power}")
    if not drive.pci:  # rescan
        raise _inapplicable(f"`rescan`: {target.spec} is not on PCI", target.spec)
    remove = shlex.quote(f"/sys/bus/pci/devices/{drive.pci}/remove")
    return Cut("rescan", f"echo 1 > {remove} && sleep {OFF_S:g} && echo 1 > /sys/bus/pci/rescan")


def _loop_line(target) -> str:
    """losetup -d, then the same file attached again with the same geometry: at the same
    device, or where another process took that one meanwhile, at whatever loop device is
    free (the drive is found again by its serial, its file)."""
    disk = target._sysfs
    loop = disk / "loop"
    opts = [f"--sector-size {target.align}"]
    for key in ("offset", "sizelimit"):
        value = read_sysfs(loop / key)
        if value and value != "0":
            opts.append(f"--{key} {value}")
    if read_sysfs(loop / "dio") == "1":
        opts.append("--direct-io=on")
    dev = shlex.quote(str(target.path))
    backing = shlex.quote(target.identity.serial)
    opts = " ".join(opts)
    return (f"losetup -d {dev} && sleep {OFF_S:g} && {{ losetup {opts} {dev} {backing} "
            f"2> /dev/null || losetup --find {opts} {backing}; }}")


def await_return(drive: Drive, timeout: float, *, since: float, spec: str) -> tuple[Path, float]:
    """The drive back (its serial, at any name, answering a read of its first block) within
    `timeout` s of `since` (time.monotonic()): its /dev node and the seconds it took; else
    TargetUnavailable, the test's ERROR, in the bound."""
    deadline = since + timeout
    while True:
        path = find_disk(drive.serial, drive.transport, drive.nsid)
        if path is not None and _answers(path, max(0.1, deadline - time.monotonic())):
            return path, time.monotonic() - since
        if time.monotonic() >= deadline:
            raise TargetUnavailable(errno.ENODEV, f"the drive (serial {drive.serial}) did not "
                                    f"come back within {timeout:g} s of its power cut",
                                    target=spec)
        time.sleep(0.1)


def _answers(path: Path, bound: float) -> bool:
    """Whether a read of the device's first 4 KiB returns within `bound` s. The read runs on
    a thread of its own: a device that does not answer cannot hold the wait past its bound."""
    answer: list[bool] = []

    def read() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                answer.append(len(os.pread(fd, 4096, 0)) > 0)
            finally:
                os.close(fd)
        except OSError:
            answer.append(False)
    t = threading.Thread(target=read, name="qual-powercut-probe", daemon=True)
    t.start()
    t.join(min(bound, 5.0))
    return bool(answer and answer[0])

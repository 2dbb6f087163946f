"""The safety guard (docs/ARCHITECTURE.md §4): every rule that forbids writing to a block
device. It fails closed: a probe that cannot answer (a tool missing, an exit status it does not
define, a file it cannot read) is a refusal that names the probe."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from qual.errors import QualError
from qual.targets import nvme as nvme_cli
from qual.targets.identity import (Identity, dev_number, disk_dir, partitions, sysfs_dir)

PROBE_TIMEOUT = 30  # seconds a signature tool may take
MD_MAGIC = 0xA92B4EFC  # Linux md superblock magic (0.90 and 1.x)
GPT_MAGIC = b"EFI PART"
LVM_MAGIC = b"LABELONE"


@dataclass(frozen=True)
class Refusal:
    rule: str
    detail: str


class UnsafeTarget(QualError):
    """The safety guard refused a destructive write; `refusals` says which rules refused."""

    def __init__(self, target: str, refusals: list[Refusal]):
        self.refusals = refusals
        lines = "; ".join(f"{r.rule}: {r.detail}" for r in refusals)
        super().__init__(errno.EPERM, f"refusing to write: {lines}", op="write", target=target)

    def __reduce__(self):
        return (UnsafeTarget, (self.target, self.refusals))


CLI_FLAGS = ("--allow-destructive", "--confirm-serial")  # how `qual io`/`qual <family>` spell them


def guard_refusals(devnode: str, identity: Identity, *, allow_destructive: bool,
                   confirm_serial: str | list[str] | None,
                   flags: tuple[str, str] = CLI_FLAGS) -> list[Refusal]:
    """Every rule that forbids writing to block device `devnode` (empty: allowed). The device is
    judged with its whole disk: a partition is refused when its disk or any other partition of
    it is mounted, swap, held or carries a signature, so no slice of the rig's OS disk is ever a
    target. `flags`: how the command that asks spells its two consents, for the refusals to
    name."""
    refusals: list[Refusal] = []
    if not allow_destructive:
        refusals.append(Refusal("allow-destructive",
                                f"writes to a block device need {flags[0]}"))
    try:
        st = os.stat(devnode)
    except OSError as e:
        return refusals + [Refusal("device", f"cannot stat {devnode}: {e.strerror}")]
    if not stat.S_ISBLK(st.st_mode):
        return refusals + [Refusal("device", f"{devnode} is not a block device")]
    me = sysfs_dir(st.st_rdev)
    if me is None:
        return refusals + [Refusal("device", f"{devnode} has no sysfs entry to check")]
    disk = disk_dir(me)
    family = [disk, *partitions(disk)]  # the whole disk and every slice of it
    numbers = {d: dev_number(d) for d in family}
    unknown = sorted(d.name for d, n in numbers.items() if n is None)
    if unknown:
        return refusals + [Refusal("device", f"sysfs gives no device number for "
                                             f"{', '.join(unknown)}")]
    devs = set(numbers.values())
    slices = f"{devnode}" if len(family) == 1 else f"{devnode} or another slice of {disk.name}"

    refusals += _usage(devnode, slices, me, disk, family, devs)
    probed = [me] if me == disk else [d for d in family if d != disk]  # a disk's own partition
    for d in probed:                                                   # table made the slices
        node = devnode if d == me else f"/dev/{d.name}"
        if not _is_node(node, numbers[d]):
            refusals.append(Refusal("signature", f"no device node {node} to probe"))
            continue
        for found in signatures(node):
            refusals.append(Refusal("signature", found))
    if any(r.rule == "signature" for r in refusals):
        refusals += _leftover(devnode)
    refusals += _serial_refusals(devnode, identity.serial, confirm_serial, flags[1])
    return refusals


def format_namespace(target, *, ses: int = 1, guard_other) -> dict:
    """Format the NVMe namespace `target` (a Target that passed the guard) with secure erase
    setting `ses`. Where the controller's FNA says the format reaches every namespace, each
    other namespace must pass the guard (`guard_other(path)` raises UnsafeTarget), and the
    active namespaces must all be known by a device node; else nothing is formatted and the
    refusal names them."""
    devnode = str(target.path)
    if not nvme_cli.available():
        raise QualError(errno.ENOENT, f"the purge needs nvme-cli: {nvme_cli.INSTALL}",
                        target=target.spec)
    ctrl = nvme_cli.id_ctrl(devnode)
    if ctrl is None or "fna" not in ctrl:
        raise UnsafeTarget(target.spec, [Refusal(
            "format reach unknown", "Identify Controller (FNA) could not be read: qual cannot "
            "tell which namespaces a format erases, so it does not format")])
    reach = [Path(devnode)]
    if nvme_cli.reaches_all_namespaces(int(ctrl["fna"]), ses):
        others = nvme_cli.sibling_namespaces(Path(devnode))
        active = nvme_cli.active_namespaces(devnode)
        if active is None or len(active) != len(others) + 1:
            raise UnsafeTarget(target.spec, [Refusal(
                "format reaches every namespace",
                f"the controller formats all its namespaces (FNA {int(ctrl['fna']):#x}) and "
                f"has {'an unknown number of' if active is None else len(active)} active "
                f"namespaces, {len(others) + 1} with a device node here: one that cannot be "
                "guarded would be erased")])
        refused = []
        for other in others:
            try:
                guard_other(other)
            except UnsafeTarget as e:
                refused.append(f"{other} ({'; '.join(r.rule for r in e.refusals)})")
        if refused:
            raise UnsafeTarget(target.spec, [Refusal(
                "format reaches every namespace",
                f"the controller formats all its namespaces (FNA {int(ctrl['fna']):#x}), and "
                f"{', '.join(refused)} fails the guard: nothing was formatted")])
        reach += others
    method = nvme_cli.format_nvm(devnode, ses, target.spec)
    return {"done": True, "method": method, "namespaces": [str(p) for p in reach]}


def _leftover(devnode: str) -> list[Refusal]:
    """A hint beside the signature refusals when the signature is qual's own filesystem, left
    by a run that was killed before it could erase it."""
    from qual.targets.filesystem import is_qual_filesystem, probe

    try:
        found = probe(devnode)
    except (QualError, OSError, subprocess.SubprocessError):
        return []
    if not is_qual_filesystem(found):
        return []
    return [Refusal("signature", f"it is qual's own {found.get('TYPE')} filesystem, left by a "
                                 f"run that was killed: `qual clean {devnode}` erases it")]


def _usage(devnode: str, slices: str, me: Path, disk: Path, family: list[Path],
           devs: set[tuple[int, int]]) -> list[Refusal]:
    """Mounted, partitioned, held, swap, root: each read from the kernel, or a refusal."""
    out = []
    names = {f"{ma}:{mi}" for ma, mi in devs}
    try:
        mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    except OSError as e:
        out.append(Refusal("mounted", f"cannot read the mount table: {e.strerror}"))
    else:
        mounted = sorted({f[4] for f in mounts if len(f) > 4 and f[2] in names})
        if mounted:
            out.append(Refusal("mounted", f"{slices} is mounted at {', '.join(mounted)}"))
    if me == disk and len(family) > 1:
        out.append(Refusal("partitioned", f"{devnode} has partitions "
                                          f"{', '.join(p.name for p in family[1:])}"))
    holders = []
    for d in family:
        try:
            holders += [h.name for h in (d / "holders").iterdir()]
        except OSError as e:
            out.append(Refusal("holders", f"cannot list the holders of {d.name}: {e.strerror}"))
    if holders:
        out.append(Refusal("holders", f"{slices} is held by {', '.join(sorted(holders))} "
                                      "(LVM, device-mapper or md)"))
    try:
        swaps = _swap_devices()
    except OSError as e:
        out.append(Refusal("swap", f"cannot read /proc/swaps: {e.strerror}"))
    else:
        if swaps & devs:
            out.append(Refusal("swap", f"{slices} is in use as swap"))
    if _root_devices() & devs:
        out.append(Refusal("root", f"{slices} holds the root filesystem"))
    return out


def _is_node(path: str, number: tuple[int, int]) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISBLK(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == number


def _serial_refusals(devnode: str, serial: str | None, confirm_serial: str | list[str] | None,
                     flag: str) -> list[Refusal]:
    # a rig qualifies several drives in one run: each must be among the serials confirmed
    confirmed = [confirm_serial] if isinstance(confirm_serial, str) else list(confirm_serial or ())
    if not serial:
        return [Refusal("serial", f"{devnode} reports no serial to confirm")]
    if not confirmed:
        return [Refusal("serial", f"confirm the drive with {flag} "
                                  f"(it reports {serial!r})")]
    if serial.strip() not in {c.strip() for c in confirmed}:
        shown = " or ".join(repr(c) for c in confirmed)
        return [Refusal("serial", f"{devnode} reports serial {serial!r}, not the confirmed "
                                  f"{shown}")]
    return []


def _swap_devices() -> set[tuple[int, int]]:
    found = set()
    for line in Path("/proc/swaps").read_text().splitlines()[1:]:
        try:
            st = os.stat(line.split()[0])
        except (OSError, IndexError):
            continue  # a swap file that is gone, or a path with spaces: not a block device
        if stat.S_ISBLK(st.st_mode):
            found.add((os.major(st.st_rdev), os.minor(st.st_rdev)))
    return found


def _root_devices() -> set[tuple[int, int]]:
    """The root filesystem's device, its disk, and every device beneath it (dm/md slaves)."""
    found: set[tuple[int, int]] = set()
    block_dir = sysfs_dir(os.stat("/").st_dev)
    todo = [block_dir] if block_dir else []
    while todo:
        d = todo.pop()
        num = dev_number(d)
        if num is None or num in found:
            continue
        found.add(num)
        disk = disk_dir(d)
        if disk != d:
            todo.append(disk)
        todo.extend(s.resolve() for s in (d / "slaves").glob("*"))
    return found


# ------------------------------------------------------------------ signatures


def signatures(devnode: str) -> list[str]:
    """Every filesystem, RAID, volume or partition-table signature on the device, each said
    once per probe that found it: blkid's probe, wipefs's scan of every signature it knows
    (a backup GPT at the end too), and qual's own look at both ends of the device. A probe
    that cannot answer is reported as such, never as "nothing found"."""
    return _blkid(devnode) + _wipefs(devnode) + _scan_ends(devnode)


def _tool(name: str, args: list[str]) -> subprocess.CompletedProcess | str:
    """Run a probe tool: its result, or why it could not answer."""
    exe = shutil.which(name)
    if not exe:
        return (f"{name} was not found on PATH, so signatures cannot be checked (install "
                "util-linux, or put /usr/sbin on PATH)")
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{name} could not run: {e}"


def _blkid(devnode: str) -> list[str]:
    out = _tool("blkid", ["-p", "-o", "export", devnode])
    if isinstance(out, str):
        return [out]
    if out.returncode == 2:  # blkid(8): nothing was found
        return []
    if out.returncode != 0:
        why = out.stderr.strip() or f"exit status {out.returncode}"
        return [f"blkid -p gave no definite answer for {devnode} ({why}); "
                "wipefs --no-act lists what it found"]
    tags = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    # where the device sits (its node, its entry in the disk's partition table) is no signature
    tags = {k: v for k, v in tags.items() if k != "DEVNAME" and not k.startswith("PART_ENTRY_")}
    if not tags:
        return []
    if "PTTYPE" in tags:
        return [f"{devnode} carries a {tags['PTTYPE']} partition table; if its data is "
                "expendable, erase it first (wipefs -a)"]
    if "TYPE" in tags:
        return [f"{devnode} carries a {tags['TYPE']} signature; if its data is expendable, "
                "erase it first (wipefs -a)"]
    return [f"blkid -p found something on {devnode} it does not name: {out.stdout.strip()!r}"]


def _wipefs(devnode: str) -> list[str]:
    out = _tool("wipefs", ["--no-act", "--noheadings", "--output", "TYPE,OFFSET", devnode])
    if isinstance(out, str):
        return [out]
    if out.returncode != 0:
        why = out.stderr.strip() or f"exit status {out.returncode}"
        return [f"wipefs --no-act could not scan {devnode} ({why})"]
    found = [" at ".join(line.split()) for line in out.stdout.splitlines() if line.strip()]
    if not found:
        return []
    return [f"wipefs finds {', '.join(found)} on {devnode}; if its data is expendable, erase "
            "it first (wipefs -a)"]


def _scan_ends(devnode: str) -> list[str]:
    """qual's own look at the offsets where signatures live at both ends of the device: GPT
    headers (primary at LBA 1, backup at the last LBA), md superblocks (1.1 and 1.2 at the
    start, 0.90 and 1.0 at the end) and an LVM2 label. It needs no tool, so it answers even
    where blkid and wipefs are missing."""
    try:
        fd = os.open(devnode, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        return [f"cannot open {devnode} to look for signatures: {e.strerror}"]
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        places = [(lba, "a GPT header at LBA 1", GPT_MAGIC) for lba in (512, 4096)]
        places += [(size - lba, "a backup GPT header at the last LBA", GPT_MAGIC)
                   for lba in (512, 4096)]
        places += [(sector * 512, "an LVM2 label", LVM_MAGIC) for sector in range(4)]
        md = struct.pack("<I", MD_MAGIC)
        places += [(0, "an md 1.1 superblock", md), (4096, "an md 1.2 superblock", md),
                   ((size & ~0xFFFF) - 0x10000, "an md 0.90 superblock", md),
                   (((size >> 9) - 16 & ~7) << 9, "an md 1.0 superblock", md)]
        found = []
        for offset, what, magic in places:
            if offset < 0 or offset + len(magic) > size:
                continue
            os.lseek(fd, offset, os.SEEK_SET)  # every I/O of a workload goes through the
            if os.read(fd, len(magic)) == magic:  # engine's queue; these few bytes are a probe
                found.append(f"{what} (offset {offset})")
    except OSError as e:
        return [f"cannot read {devnode} to look for signatures: {e.strerror}"]
    finally:
        os.close(fd)
    if not found:
        return []
    return [f"{devnode} holds {', '.join(dict.fromkeys(found))}; if its data is expendable, "
            "erase it first (wipefs -a)"]

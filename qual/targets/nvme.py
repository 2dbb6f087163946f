"""nvme-cli, in one place (docs/ARCHITECTURE.md §4): the controller's identity, the SMART and
OCP logs, the active namespaces, and the format a PTS purge runs, which is a guarded
operation of the target like any write.

A Format NVM may reach further than the namespace it names: Identify Controller's FNA (Format
NVM Attributes) bit 0 says a format applies to every namespace of the controller, bit 1 that a
secure erase (user data or cryptographic) does. A purge of a guarded `nvme1n1` would then
erase `nvme1n2`, which no rule looked at; so before formatting, every namespace the format
reaches must pass the guard too, or the purge is refused naming them."""

from __future__ import annotations

import errno
import json
import re
import shutil
import stat
import subprocess
from pathlib import Path

from qual.errors import QualError

TIMEOUT_S = 60  # an identify or a log page
FORMAT_TIMEOUT_S = 3600  # a user-data erase of a large drive
FNA_FORMAT_ALL = 1 << 0  # a format applies to every namespace
FNA_ERASE_ALL = 1 << 1  # a secure erase applies to every namespace
NAMESPACE = re.compile(r"(nvme\d+)n(\d+)")  # a whole namespace's block device, no partition
INSTALL = "nvme-cli is not installed (Debian: apt-get install nvme-cli)"


def available() -> bool:
    return shutil.which("nvme") is not None


def _json(args: list[str], timeout: float = TIMEOUT_S) -> dict | None:
    """`nvme ARGS -o json` parsed; None where nvme-cli is missing, the command fails or says
    nothing parsable (an old drive without the log, a controller that refused)."""
    if not available():
        return None
    try:
        out = subprocess.run(["nvme", *args, "-o", "json"], capture_output=True, text=True,
                             timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def id_ctrl(devnode: str) -> dict | None:
    """Identify Controller of the controller behind `devnode` (a namespace or a controller)."""
    return _json(["id-ctrl", devnode])


def id_ns(devnode: str) -> dict | None:
    """Identify Namespace of the namespace `devnode`."""
    return _json(["id-ns", devnode])


def atomic_write_unit(devnode: str, lba_size: int) -> tuple[int, str] | None:
    """The bytes a write is atomic in across a power failure, and where that was read: the
    namespace's NAWUPF where its NSFEAT bit 1 says it has its own, else the controller's AWUPF
    (both 0's based, in logical blocks); None where Identify cannot be read."""
    ns = id_ns(devnode)
    if ns is not None and int(ns.get("nsfeat", 0)) & 0x2:
        return (int(ns.get("nawupf", 0)) + 1) * lba_size, "Identify Namespace NAWUPF"
    ctrl = id_ctrl(devnode)
    if ctrl is None or "awupf" not in ctrl:
        return None
    return (int(ctrl["awupf"]) + 1) * lba_size, "Identify Controller AWUPF"


def smart_log(device: str) -> dict:
    """The SMART / health log of /dev/DEVICE; ValueError where it cannot be read."""
    doc = _json(["smart-log", f"/dev/{device}"])
    if doc is None:
        raise ValueError(f"nvme smart-log /dev/{device}: no log ({INSTALL})" if not available()
                         else f"nvme smart-log /dev/{device}: the drive gave no log")
    return doc


def temperature_threshold(devnode: str) -> int | None:
    """The composite temperature's over-temperature threshold in kelvin (Get Features 04h,
    Temperature Threshold: TMPTH, bits 15:0), or None where it cannot be read. nvme-cli prints
    this feature's value as text (`Current value:0x00000157`), whatever -o says."""
    if not available():
        return None
    try:
        out = subprocess.run(["nvme", "get-feature", devnode, "-f", "4"], capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"Current value:\s*(0x[0-9a-fA-F]+)", out.stdout)
    return int(m.group(1), 16) & 0xFFFF if out.returncode == 0 and m else None


def ocp_smart_add_log(device: str) -> dict | None:
    """The OCP Datacenter NVMe SSD SMART / health extended log, where the drive has one."""
    return _json(["ocp", "smart-add-log", f"/dev/{device}"])


def active_namespaces(devnode: str) -> list[int] | None:
    """The NSIDs of the controller's active namespaces (Identify, CNS 02h)."""
    doc = _json(["list-ns", devnode])
    if doc is None:
        return None
    return [int(n["nsid"]) for n in doc.get("nsid_list", []) if int(n.get("nsid", 0))]


def reaches_all_namespaces(fna: int, ses: int) -> bool:
    """Whether a Format NVM with secure erase setting `ses` applies to every namespace."""
    return bool(fna & FNA_FORMAT_ALL) or (ses in (1, 2) and bool(fna & FNA_ERASE_ALL))


def sibling_namespaces(path: Path) -> list[Path]:
    """The other namespaces' block devices of the controller of namespace `path`, beside it
    (/dev/nvme1n1 -> /dev/nvme1n2 …; partitions are not namespaces)."""
    m = NAMESPACE.fullmatch(path.name)
    if not m:
        return []
    found = []
    for p in sorted(path.parent.glob(f"{m.group(1)}n*")):
        other = NAMESPACE.fullmatch(p.name)
        if p != path and other and other.group(1) == m.group(1):
            try:
                if stat.S_ISBLK(p.stat().st_mode):
                    found.append(p)
            except OSError:
                continue
    return found


def format_nvm(devnode: str, ses: int, spec: str) -> str:
    """Format NVM on namespace `devnode` with secure erase setting `ses`, bounded; the method
    as said. Which namespaces it reaches, and whether they may be erased, is the guard's
    (qual.targets.guard.format_namespace): call it through there."""
    method = f"nvme format --ses={ses}"
    try:
        proc = subprocess.run(["nvme", "format", devnode, f"--ses={ses}", "--force"],
                              capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise QualError(errno.ETIMEDOUT, f"{method} did not finish in {FORMAT_TIMEOUT_S} s",
                        target=spec) from None
    if proc.returncode != 0:
        raise QualError(errno.EIO, f"{method} failed: {proc.stderr.strip()}", target=spec)
    return method

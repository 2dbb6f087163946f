"""Who a target is: the block device under it (sysfs, nvme-cli), its mount, its counters."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from qual.targets import nvme as nvme_cli

SYS_BLOCK = Path("/sys/dev/block")


@dataclass(frozen=True)
class Identity:
    """Who the target is. For files and directories, the block device underneath them."""

    device: str | None = None  # kernel name (nvme0n1, vda, loop3)
    model: str | None = None
    serial: str | None = None
    firmware: str | None = None
    transport: str | None = None  # nvme, virtio, loop, scsi, ...
    link_speed: str | None = None
    link_width: str | None = None
    capacity: int | None = None
    logical_block_size: int = 512
    filesystem: str | None = None
    mountpoint: str | None = None
    nvme_id_ctrl: dict | None = field(default=None, compare=False)

    def label(self) -> str:
        model = self.model or (f"{self.transport} device" if self.transport else "unknown device")
        parts = [f"serial {self.serial}" if self.serial else None,
                 f"fw {self.firmware}" if self.firmware else None]
        extra = ", ".join(p for p in parts if p)
        return f"{model} ({extra})" if extra else model

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> Identity:
        """An identity as a run record holds it (keys it does not know are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def drive_label(identity: Identity | dict | None, spec: str, *, several: bool = False) -> str:
    """The one name of a drive in titles and summaries: "model (serial S, fw F)", with its
    target path added when a run qualifies several drives."""
    if isinstance(identity, dict):
        identity = Identity.from_dict(identity)
    label = identity.label() if identity else spec
    return f"{label} at {spec}" if several else label


@dataclass(frozen=True)
class DeviceStat:
    """A snapshot of a block device's counters (/sys/block/<dev>/stat)."""

    read_bytes: int
    write_bytes: int
    io_ticks_ms: int
    at: float

    def since(self, before: DeviceStat) -> dict:
        span = self.at - before.at
        busy = (self.io_ticks_ms - before.io_ticks_ms) / 1000.0
        return {
            "read_bytes": self.read_bytes - before.read_bytes,
            "write_bytes": self.write_bytes - before.write_bytes,
            "utilisation": busy / span if span > 0 else 0.0,
        }


# ------------------------------------------------------------------ sysfs and friends


def read_sysfs(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def sysfs_dir(dev: int) -> Path | None:
    """The sysfs directory of a block device number (a disk or a partition)."""
    if os.major(dev) == 0:
        return None
    path = SYS_BLOCK / f"{os.major(dev)}:{os.minor(dev)}"
    return path.resolve() if path.exists() else None


def disk_dir(block_dir: Path) -> Path:
    return block_dir.parent if (block_dir / "partition").exists() else block_dir


def partitions(disk: Path) -> list[Path]:
    return sorted(p for p in disk.iterdir() if (p / "partition").exists())


def dev_number(block_dir: Path) -> tuple[int, int] | None:
    text = read_sysfs(block_dir / "dev")
    if not text:
        return None
    major, minor = text.split(":")
    return int(major), int(minor)


def _link(block_dir: Path) -> tuple[str | None, str | None]:
    """PCIe link speed and width of the nearest PCI device above the block device."""
    for parent in block_dir.parents:
        speed = read_sysfs(parent / "current_link_speed")
        if speed:
            width = read_sysfs(parent / "current_link_width")
            if speed.lower().startswith("unknown"):
                return None, None
            return speed, width
        if parent == Path("/sys/devices"):
            break
    return None, None


def _transport(disk: Path) -> str | None:
    name = disk.name
    if name.startswith("nvme"):
        return "nvme"
    if name.startswith("loop"):
        return "loop"
    modalias = read_sysfs(disk / "device" / "modalias") or ""
    if modalias.startswith("virtio"):
        return "virtio"
    if (disk / "device" / "scsi_level").exists():
        return "scsi"
    return None


def _mount_of(dev: int, path: Path) -> tuple[str | None, str | None]:
    """Filesystem type and mount point of the mount holding `path` (device number `dev`)."""
    best: tuple[str | None, str | None] = (None, None)
    best_len = -1
    want = f"{os.major(dev)}:{os.minor(dev)}"
    target = str(path.resolve())
    for line in mountinfo():
        fields = line.split()
        sep = fields.index("-")
        mnt = fields[4]
        if fields[2] == want and (target == mnt or target.startswith(mnt.rstrip("/") + "/")):
            if len(mnt) > best_len:
                best, best_len = (fields[sep + 1], mnt), len(mnt)
    return best


def mountinfo() -> list[str]:
    try:
        return Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []


def disk_serial(disk: Path, transport: str | None) -> str | None:
    """A disk's serial as sysfs says it; a loop device has none of its own, and its backing
    file names it uniquely."""
    if transport == "loop":
        return read_sysfs(disk / "loop" / "backing_file")
    return read_sysfs(disk / "device" / "serial") or read_sysfs(disk / "serial")


def namespace_id(disk: Path) -> int | None:
    """An NVMe namespace's id (sysfs `nsid`), None for any other disk."""
    text = read_sysfs(disk / "nsid")
    return int(text) if text and text.isdigit() else None


def find_disk(serial: str, transport: str | None, nsid: int | None) -> Path | None:
    """The /dev node of the whole disk that has this serial (and, for an NVMe namespace, this
    namespace id) and a capacity, or None: where a drive that left the system and came back
    is now, whatever name the kernel gave it this time."""
    for disk in sorted(Path("/sys/block").iterdir()):
        if _transport(disk) != transport or disk_serial(disk, transport) != serial:
            continue
        if nsid is not None and namespace_id(disk) != nsid:
            continue
        if int(read_sysfs(disk / "size") or 0) > 0:
            return Path("/dev") / disk.name
    return None


def read_identity(dev: int, *, is_block_target: bool, path: Path) -> Identity:
    """Identity of the block device `dev` (the target itself, or the one under a file)."""
    block_dir = sysfs_dir(dev)
    fs = mnt = None
    if not is_block_target:
        fs, mnt = _mount_of(dev, path)
    if block_dir is None:
        return Identity(filesystem=fs, mountpoint=mnt)
    disk = disk_dir(block_dir)
    dev_dir = disk / "device"
    transport = _transport(disk)
    serial = disk_serial(disk, transport)
    model = read_sysfs(dev_dir / "model")
    if transport == "loop":
        model = "Linux loop device"
    elif transport == "virtio" and not model:
        model = "virtio block device"
    speed, width = _link(disk)
    sectors = read_sysfs(block_dir / "size")
    nvme = nvme_cli.id_ctrl(f"/dev/{disk.name}") if transport == "nvme" else None
    return Identity(
        device=block_dir.name,
        model=model,
        serial=serial,
        firmware=read_sysfs(dev_dir / "firmware_rev") or read_sysfs(dev_dir / "rev"),
        transport=transport,
        link_speed=speed,
        link_width=width,
        capacity=int(sectors) * 512 if sectors else None,
        logical_block_size=int(read_sysfs(disk / "queue" / "logical_block_size") or 512),
        filesystem=fs,
        mountpoint=mnt,
        nvme_id_ctrl=nvme,
    )


def device_stat(dev: int) -> DeviceStat | None:
    """Counters of block device `dev`, or None when the target has no block device."""
    block_dir = sysfs_dir(dev)
    text = read_sysfs(block_dir / "stat") if block_dir else None
    if not text:
        return None
    f = [int(x) for x in text.split()]
    # fields: reads, merges, sectors read, ms, writes, merges, sectors written, ms, in flight,
    # io_ticks (ms busy), ... (Documentation/block/stat.rst; sectors are 512 bytes)
    return DeviceStat(read_bytes=f[2] * 512, write_bytes=f[6] * 512, io_ticks_ms=f[9],
                      at=time.monotonic())


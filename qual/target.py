"""What is being qualified: a file, a directory or a block device; its identity; its safety.

A target is named by one string (DESIGN §4). A file or directory target gets a scratch file
that qual creates, fills once with incompressible data (so reads hit real blocks) and marks
as its own with a sidecar marker; qual writes and removes only files that carry its marker.
Writes to a block device pass the safety guard first, or nothing is written.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import struct
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qual import engine
from qual.engine import IoJob, NoSpace, QualError, TargetUnavailable
from qual.units import format_size

DEFAULT_TARGET = ".qual/target.dat"
SCRATCH_NAME = "qual-target.dat"
FILL_BLOCK = 1 << 20
FILL_DEPTH = 8
FILL_SEED = 0x7175616C  # "qual"
SPACE_RESERVE = 64 << 20  # never fill a filesystem to the last byte

_BLKGETSIZE64 = 0x80081272
_BLKSSZGET = 0x1268
SYS_BLOCK = Path("/sys/dev/block")


class UnsafeTarget(QualError):
    """The safety guard refused a destructive write; `refusals` says which rules refused."""

    def __init__(self, target: str, refusals: list[Refusal]):
        self.refusals = refusals
        lines = "; ".join(f"{r.rule}: {r.detail}" for r in refusals)
        super().__init__(errno.EPERM, f"refusing to write: {lines}", op="write", target=target)

    def __reduce__(self):
        return (UnsafeTarget, (self.target, self.refusals))


@dataclass(frozen=True)
class Refusal:
    rule: str
    detail: str


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


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def _block_dir(dev: int) -> Path | None:
    """The sysfs directory of a block device number (a disk or a partition)."""
    if os.major(dev) == 0:
        return None
    path = SYS_BLOCK / f"{os.major(dev)}:{os.minor(dev)}"
    return path.resolve() if path.exists() else None


def _disk_dir(block_dir: Path) -> Path:
    return block_dir.parent if (block_dir / "partition").exists() else block_dir


def _partitions(disk: Path) -> list[Path]:
    return sorted(p for p in disk.iterdir() if (p / "partition").exists())


def _dev_number(block_dir: Path) -> tuple[int, int] | None:
    text = _read(block_dir / "dev")
    if not text:
        return None
    major, minor = text.split(":")
    return int(major), int(minor)


def _link(block_dir: Path) -> tuple[str | None, str | None]:
    """PCIe link speed and width of the nearest PCI device above the block device."""
    for parent in block_dir.parents:
        speed = _read(parent / "current_link_speed")
        if speed:
            width = _read(parent / "current_link_width")
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
    modalias = _read(disk / "device" / "modalias") or ""
    if modalias.startswith("virtio"):
        return "virtio"
    if (disk / "device" / "scsi_level").exists():
        return "scsi"
    return None


def _nvme_id_ctrl(devnode: str) -> dict | None:
    if not shutil.which("nvme"):
        return None
    try:
        out = subprocess.run(["nvme", "id-ctrl", devnode, "-o", "json"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
        return json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _mount_of(dev: int, path: Path) -> tuple[str | None, str | None]:
    """Filesystem type and mount point of the mount holding `path` (device number `dev`)."""
    best: tuple[str | None, str | None] = (None, None)
    best_len = -1
    want = f"{os.major(dev)}:{os.minor(dev)}"
    target = str(path.resolve())
    for line in _mountinfo():
        fields = line.split()
        sep = fields.index("-")
        mnt = fields[4]
        if fields[2] == want and (target == mnt or target.startswith(mnt.rstrip("/") + "/")):
            if len(mnt) > best_len:
                best, best_len = (fields[sep + 1], mnt), len(mnt)
    return best


def _mountinfo() -> list[str]:
    try:
        return Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []


def read_identity(dev: int, *, is_block_target: bool, path: Path) -> Identity:
    """Identity of the block device `dev` (the target itself, or the one under a file)."""
    block_dir = _block_dir(dev)
    fs = mnt = None
    if not is_block_target:
        fs, mnt = _mount_of(dev, path)
    if block_dir is None:
        return Identity(filesystem=fs, mountpoint=mnt)
    disk = _disk_dir(block_dir)
    dev_dir = disk / "device"
    transport = _transport(disk)
    serial = _read(dev_dir / "serial") or _read(disk / "serial")
    model = _read(dev_dir / "model")
    if transport == "loop":
        # a loop device has no serial of its own; its backing file names it uniquely
        serial = _read(disk / "loop" / "backing_file")
        model = "Linux loop device"
    elif transport == "virtio" and not model:
        model = "virtio block device"
    speed, width = _link(disk)
    sectors = _read(block_dir / "size")
    nvme = _nvme_id_ctrl(f"/dev/{disk.name}") if transport == "nvme" else None
    return Identity(
        device=block_dir.name,
        model=model,
        serial=serial,
        firmware=_read(dev_dir / "firmware_rev") or _read(dev_dir / "rev"),
        transport=transport,
        link_speed=speed,
        link_width=width,
        capacity=int(sectors) * 512 if sectors else None,
        logical_block_size=int(_read(disk / "queue" / "logical_block_size") or 512),
        filesystem=fs,
        mountpoint=mnt,
        nvme_id_ctrl=nvme,
    )


def device_stat(dev: int) -> DeviceStat | None:
    """Counters of block device `dev`, or None when the target has no block device."""
    block_dir = _block_dir(dev)
    text = _read(block_dir / "stat") if block_dir else None
    if not text:
        return None
    f = [int(x) for x in text.split()]
    # fields: reads, merges, sectors read, ms, writes, merges, sectors written, ms, in flight,
    # io_ticks (ms busy), ... (Documentation/block/stat.rst; sectors are 512 bytes)
    return DeviceStat(read_bytes=f[2] * 512, write_bytes=f[6] * 512, io_ticks_ms=f[9],
                      at=time.monotonic())


# ------------------------------------------------------------------ the safety guard


def guard_refusals(devnode: str, identity: Identity, *, allow_destructive: bool,
                   confirm_serial: str | list[str] | None) -> list[Refusal]:
    """Every rule of DESIGN §4 that forbids writing to block device `devnode` (empty: allowed)."""
    refusals: list[Refusal] = []
    if not allow_destructive:
        refusals.append(Refusal("allow-destructive",
                                "writes to a block device need --qual-allow-destructive"))
    st = os.stat(devnode)
    block_dir = _block_dir(st.st_rdev)
    if block_dir is None:
        return refusals + [Refusal("device", f"{devnode} has no sysfs entry to check")]
    parts = _partitions(block_dir)
    devs = {_dev_number(p) for p in [block_dir, *parts]} - {None}
    names = {f"{ma}:{mi}" for ma, mi in devs}

    mounts = [line.split() for line in _mountinfo()]
    mounted = sorted({f[4] for f in mounts if f[2] in names})
    if mounted:
        refusals.append(Refusal("mounted", f"{devnode} or its partitions are mounted at "
                                           f"{', '.join(mounted)}"))
    if parts:
        refusals.append(Refusal("partitioned", f"{devnode} has partitions "
                                               f"{', '.join(p.name for p in parts)}"))
    holders = sorted(h.name for d in [block_dir, *parts] for h in (d / "holders").glob("*"))
    if holders:
        refusals.append(Refusal("holders", f"{devnode} is held by {', '.join(holders)} "
                                           "(LVM, device-mapper or md)"))
    swaps = _swap_devices() & devs
    if swaps:
        refusals.append(Refusal("swap", f"{devnode} is in use as swap"))
    if _root_devices() & devs:
        refusals.append(Refusal("root", f"{devnode} holds the root filesystem"))
    signature = _signature(devnode)
    if signature:
        refusals.append(Refusal("signature", f"{devnode} carries {signature}; if its data is "
                                             "expendable, erase it first (wipefs -a)"))
    serial = identity.serial
    # a rig qualifies several drives in one run: each must be among the serials confirmed
    confirmed = [confirm_serial] if isinstance(confirm_serial, str) else list(confirm_serial or ())
    if not serial:
        refusals.append(Refusal("serial", f"{devnode} reports no serial to confirm"))
    elif not confirmed:
        refusals.append(Refusal("serial", f"confirm the drive with --qual-confirm-serial "
                                          f"(it reports {serial!r})"))
    elif serial.strip() not in {c.strip() for c in confirmed}:
        shown = " or ".join(repr(c) for c in confirmed)
        refusals.append(Refusal("serial", f"{devnode} reports serial {serial!r}, not the "
                                          f"confirmed {shown}"))
    return refusals


def _swap_devices() -> set[tuple[int, int]]:
    found = set()
    try:
        lines = Path("/proc/swaps").read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        try:
            st = os.stat(line.split()[0])
        except (OSError, IndexError):
            continue
        if stat.S_ISBLK(st.st_mode):
            found.add((os.major(st.st_rdev), os.minor(st.st_rdev)))
    return found


def _root_devices() -> set[tuple[int, int]]:
    """The root filesystem's device, its disk, and every device beneath it (dm/md slaves)."""
    found: set[tuple[int, int]] = set()
    block_dir = _block_dir(os.stat("/").st_dev)
    todo = [block_dir] if block_dir else []
    while todo:
        d = todo.pop()
        num = _dev_number(d)
        if num is None or num in found:
            continue
        found.add(num)
        disk = _disk_dir(d)
        if disk != d:
            todo.append(disk)
        todo.extend(s.resolve() for s in (d / "slaves").glob("*"))
    return found


def _signature(devnode: str) -> str | None:
    """A filesystem or partition-table signature on the device, as blkid probes it."""
    if not shutil.which("blkid"):
        return None
    out = subprocess.run(["blkid", "-p", "-o", "export", devnode], capture_output=True,
                         text=True, timeout=30)
    tags = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    if "PTTYPE" in tags:
        return f"a {tags['PTTYPE']} partition table"
    if "TYPE" in tags:
        return f"a {tags['TYPE']} signature"
    return None


# ------------------------------------------------------------------ ownership of scratch files


def marker_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.qual.json")


FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode's generation number


def _generation(path: Path) -> int | None:
    """The inode's generation (ext4, xfs, btrfs): a new file that reuses a deleted one's inode
    number gets a new one. None where the filesystem has none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return struct.unpack("l", fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(8)))[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def read_marker(path: Path) -> dict | None:
    """The marker of a file qual created, or None (no marker, or it belongs to another file:
    another inode, or the same inode number given to a new file)."""
    try:
        marker = json.loads(marker_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return None
    if marker.get("created_by") != "qual" or marker.get("inode") != st.st_ino \
            or marker.get("dev") != st.st_dev \
            or marker.get("generation") != _generation(path):
        return None
    return marker


def write_marker(path: Path, written: int) -> None:
    st = path.stat()
    marker = {"created_by": "qual", "inode": st.st_ino, "dev": st.st_dev,
              "generation": _generation(path), "written": written,
              "fill_seed": FILL_SEED, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = marker_path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(marker))
    os.replace(tmp, marker_path(path))


def fsync_dir(path: Path) -> None:
    """Make the entries of a folder durable (files created, renamed or removed in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the target


class Target:
    """A file, a directory (scratch file inside) or a block device under qualification."""

    def __init__(self, spec: str | os.PathLike | None = None, *, allow_destructive: bool = False,
                 confirm_serial: str | list[str] | None = None):
        self.spec = str(spec) if spec is not None else DEFAULT_TARGET
        self.allow_destructive = allow_destructive
        self.confirm_serial = confirm_serial
        self.progress = None  # where long preparations (the fill) say how far they are
        given = Path(self.spec)
        self._default = spec is None  # .qual/ is made when the scratch file is first needed
        if given.exists() and given.is_dir():
            self.kind, self.path = "directory", given / SCRATCH_NAME
        elif given.exists() and stat.S_ISBLK(given.stat().st_mode):
            self.kind, self.path = "block", given
        elif given.exists() and not given.is_file():
            raise TargetUnavailable(errno.ENOTSUP, "is neither a file, a directory nor a block "
                                                   "device", target=self.spec)
        else:
            if not given.parent.is_dir() and not self._default:
                raise TargetUnavailable(errno.ENOENT, f"directory {given.parent} does not exist",
                                        target=self.spec)
            self.kind, self.path = "file", given
        self._check_access()
        existing = self._existing()
        st = existing.stat()
        self.dev = st.st_rdev if self.kind == "block" else st.st_dev
        self.identity = read_identity(self.dev, is_block_target=self.kind == "block",
                                      path=existing)

    def _existing(self) -> Path:
        """The target path, or the nearest folder above it that exists."""
        p = self.path
        while not p.exists():
            p = p.parent
        return p

    def __repr__(self) -> str:
        return f"Target({self.spec!r}, kind={self.kind}, {self.identity.label()})"

    def _check_access(self) -> None:
        probe = self._existing()
        if not os.access(probe, os.R_OK):
            raise TargetUnavailable(errno.EACCES, "is not readable", target=str(probe))

    # ---- facts about the target

    def _ioctl(self, request: int, fmt: str) -> int:
        """An ioctl on the block device, its failure a TargetUnavailable."""
        try:
            with open(self.path, "rb") as f:
                buf = fcntl.ioctl(f.fileno(), request, b"\0" * struct.calcsize(fmt))
        except OSError as e:
            raise TargetUnavailable(e.errno, f"cannot query the device: {e.strerror}",
                                    target=self.spec) from None
        return struct.unpack(fmt, buf)[0]

    @property
    def capacity(self) -> int:
        """Bytes a job may address: the device's size, or the scratch file's possible size."""
        if self.kind == "block":
            return self._ioctl(_BLKGETSIZE64, "Q")
        existing = self.path.stat().st_size if self.path.exists() else 0
        free = shutil.disk_usage(self._existing()).free
        return existing + max(0, free - SPACE_RESERVE)

    @property
    def align(self) -> int:
        """Offset and length alignment for O_DIRECT: the logical block size, or what statx says."""
        if self.kind == "block":
            return self._ioctl(_BLKSSZGET, "i")
        align = self.identity.logical_block_size
        if self.path.exists():
            reported = engine.dio_alignment(str(self.path))
            if reported:
                align = max(align, reported[1])
        return align

    @property
    def directory(self) -> Path | None:
        """The folder a file-based workload (checkpoints, datasets) works in: the directory
        target itself, or the file target's folder; None for a block device."""
        if self.kind == "block":
            return None
        return self.path.parent

    def device_stat(self) -> DeviceStat | None:
        return device_stat(self.dev)

    def owned(self) -> bool:
        return self.kind != "block" and read_marker(self.path) is not None

    # ---- preparing for I/O

    def ensure_data(self, size: int) -> None:
        """Make [0, size) hold real data written once, so reads hit real blocks."""
        if size > self.capacity:
            raise NoSpace(errno.ENOSPC, f"needs {format_size(size)}, target offers "
                                        f"{format_size(self.capacity)}", target=self.spec)
        if self.kind == "block":
            return
        marker = read_marker(self.path) if self.path.exists() else None
        if self.path.exists() and marker is None:
            self._check_foreign_file(size)
            return
        if marker is None:
            try:
                if self._default:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                write_marker(self.path, 0)
            except OSError as e:
                raise TargetUnavailable(e.errno, f"cannot create qual's scratch file: "
                                        f"{e.strerror}", target=self.spec) from None
            marker = read_marker(self.path)
        written = marker["written"]
        if written >= size:
            return
        align = self.align
        start = written // FILL_BLOCK * FILL_BLOCK
        end = -(-size // FILL_BLOCK) * FILL_BLOCK
        def filled(done: int, _ops: int, seconds: float) -> None:
            if self.progress:
                self.progress(f"filling {self.path}: {format_size(start + done)} of "
                              f"{format_size(end)} ({done / max(seconds, 1e-9) / 2**20:.0f} MiB/s)")

        engine.run_job(IoJob(target=str(self.path), op="write", pattern="sequential",
                             block_size=FILL_BLOCK, queue_depth=FILL_DEPTH, offset=start,
                             size=end - start, bytes=end - start, seed=FILL_SEED, align=align),
                       progress=filled, interval=5.0)
        write_marker(self.path, end)

    def _check_foreign_file(self, size: int) -> None:
        st = self.path.stat()
        if st.st_size < size:
            raise TargetUnavailable(errno.EINVAL, f"holds {format_size(st.st_size)}, the job "
                                    f"needs {format_size(size)}; qual does not extend files it "
                                    "did not create", target=self.spec)
        if st.st_blocks * 512 < size:
            raise TargetUnavailable(errno.EINVAL, "is sparse: reads of holes never reach the "
                                    "device; give a fully written file or a directory",
                                    target=self.spec)

    def ensure_writable(self, size: int) -> None:
        """Check that qual may write [0, size) here, before any byte is written."""
        if self.kind == "block":
            refusals = guard_refusals(str(self.path), self.identity,
                                      allow_destructive=self.allow_destructive,
                                      confirm_serial=self.confirm_serial)
            if refusals:
                raise UnsafeTarget(self.spec, refusals)
        elif self.path.exists() and read_marker(self.path) is None:
            raise TargetUnavailable(errno.EPERM, "was not created by qual; qual writes only "
                                    "files it created (give a directory or a new file name)",
                                    target=self.spec)
        # writes overwrite allocated blocks: allocation is not what a drive is qualified on
        self.ensure_data(size)

    def job(self, **kw) -> IoJob:
        """An IoJob on this target, aligned to it (exclusive open for block-device writes).
        Building it validates the parameters; nothing is read or written yet."""
        kw.setdefault("align", self.align)
        kw.setdefault("exclusive", self.kind == "block" and kw.get("op") == "write")
        return IoJob(target=str(self.path), **kw)

    def prepare(self, job: IoJob) -> None:
        """Make the job's region ready: real data under reads, the guard passed for writes."""
        home = self.path if self.kind == "block" else self.path.parent
        if not home.exists() and not self._default:
            raise TargetUnavailable(errno.ENOENT, f"vanished: {home} no longer exists",
                                    target=self.spec)
        end = job.offset + job.size
        if job.op == "write":
            self.ensure_writable(end)
        else:
            self.ensure_data(end)

    @property
    def lock_file(self) -> Path:
        """Beside a file target: held (flock) by the run that qualifies it."""
        return self.path.with_name(f".{self.path.name}.qual.lock")

    def lock(self) -> None:
        """Hold the target for this process: a second qual run on it is refused at once, since
        two runs on one drive would measure each other."""
        try:
            if self.kind == "block":
                self._lock_path = None
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            else:
                self._lock_path = self.lock_file
                if self._default:
                    self._lock_path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise TargetUnavailable(e.errno, f"cannot open: {e.strerror}", target=self.spec) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TargetUnavailable(errno.EBUSY, "another qual run holds this target",
                                    target=self.spec) from None
        self._lock_fd = fd

    def unlock(self) -> None:
        fd = getattr(self, "_lock_fd", None)
        if fd is None:
            return
        if self._lock_path is not None:
            self._lock_path.unlink(missing_ok=True)
        os.close(fd)
        self._lock_fd = None

    def cleanup(self) -> None:
        """Remove the scratch file, only if qual created it (it carries qual's marker), and
        the lock file a killed run left behind (one no process holds)."""
        if self.kind == "block":
            return
        if read_marker(self.path) is not None:
            self.path.unlink()
            marker_path(self.path).unlink(missing_ok=True)
        lock = self.lock_file
        if lock.exists() and getattr(self, "_lock_path", None) != lock:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock.unlink()  # nobody holds it: a leftover
            except BlockingIOError:
                pass  # a live run holds it
            finally:
                os.close(fd)

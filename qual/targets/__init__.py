"""What is being qualified: a file, a directory or a block device (docs/ARCHITECTURE.md §4).

A target is named by one string. A file or directory target gets a scratch file that qual
creates, fills once with incompressible data (so reads hit real blocks) and proves to be its
own before every write (scratch.py). Writes to a block device pass the safety guard
(guard.py) and hold the device exclusively for the run, or nothing is written. Every job a
target prepares names the inode that was checked, and the engine opens nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import struct
import time
from dataclasses import replace
from pathlib import Path

from qual import engine
from qual.engine import IoJob
from qual.errors import NoSpace, TargetUnavailable
from qual.targets import scratch
from qual.targets.guard import CLI_FLAGS, Refusal, UnsafeTarget, guard_refusals
from qual.targets.identity import (DeviceStat, Identity, device_stat, drive_label, read_identity,
                                  read_sysfs, sysfs_dir)
from qual.targets.scratch import fsync_dir, marker_path
from qual.units import format_size

__all__ = ["DEFAULT_TARGET", "SCRATCH_NAME", "DeviceStat", "Identity", "Refusal", "Target",
           "UnsafeTarget", "device_stat", "drive_label", "fsync_dir", "guard_refusals", "marker_path"]

DEFAULT_TARGET = ".qual/target.dat"
SCRATCH_NAME = "qual-target.dat"
FILL_BLOCK = 1 << 20
FILL_DEPTH = 8
FILL_SEED = 0x7175616C  # "qual"
REBIND_LOCK_S = 30  # udev's probe of a drive that came back holds it this long at most
SPACE_RESERVE = 64 << 20  # never fill a filesystem to the last byte

_BLKGETSIZE64 = 0x80081272
_BLKSSZGET = 0x1268


def _locate(given: Path, default: bool) -> tuple[str, Path]:
    """The kind of target a path names and the path qual uses: the real block device node or
    directory (links resolved), or a file in the real folder by its own name (a link there is
    never followed)."""
    real = Path(os.path.realpath(given))
    try:
        st = os.stat(given)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise TargetUnavailable(e.errno, f"cannot stat: {e.strerror}", target=str(given)) from None
    if st is not None and stat.S_ISBLK(st.st_mode):
        return "block", real
    if real == Path("/dev") or Path("/dev") in real.parents:
        why = "does not exist" if st is None else "is not a block device"
        raise TargetUnavailable(errno.ENODEV, f"{why}: under /dev only an existing block device "
                                "is a target, and qual never creates files there",
                                target=str(given))
    if st is not None and stat.S_ISDIR(st.st_mode):
        return "directory", real / SCRATCH_NAME
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise TargetUnavailable(errno.ENOTSUP, "is neither a file, a directory nor a block "
                                               "device", target=str(given))
    folder = Path(os.path.realpath(given.parent))
    if not folder.is_dir() and not default:
        raise TargetUnavailable(errno.ENOENT, f"directory {given.parent} does not exist",
                                target=str(given))
    return "file", folder / given.name


class Target:
    """A file, a directory (scratch file inside) or a block device under qualification."""

    def __init__(self, spec: str | os.PathLike | None = None, *, allow_destructive: bool = False,
                 confirm_serial: str | list[str] | None = None,
                 consent_flags: tuple[str, str] = CLI_FLAGS):
        self.spec = str(spec) if spec is not None else DEFAULT_TARGET
        self.allow_destructive = allow_destructive
        self.confirm_serial = confirm_serial
        self.consent_flags = consent_flags  # how the command spells the two, for its refusals
        self.progress = None  # where long preparations (the fill) say how far they are
        self._default = spec is None  # .qual/ is made when the scratch file is first needed
        self._made_folder = False  # this Target made .qual/: it removes it once it is empty
        self.inode: tuple[int, int] | None = None  # what prepared jobs may open (checked)
        self._claim_fd: int | None = None  # a block device held exclusively for writes
        # a qualification's reads of a block device read blocks this run wrote (the plugin
        # sets it; `qual io` reads what the device holds, as fio does): [0, written) is done
        self.fill_reads = False
        self.written = 0
        self._lock_fd: int | None = None
        self.kind, self.path = _locate(Path(self.spec), self._default)
        self._check_access()
        existing = self._existing()
        st = existing.stat()
        self.dev = st.st_rdev if self.kind == "block" else st.st_dev
        self.identity = read_identity(self.dev, is_block_target=self.kind == "block",
                                      path=existing)
        if self.kind != "block" and self.identity.filesystem == "devtmpfs":
            raise TargetUnavailable(errno.ENODEV, "is on devtmpfs (/dev) but is not a block "
                                    "device: qual never creates files there", target=self.spec)
        # the block device under it as sysfs knows it, to tell later whether it is still there
        self._sysfs = sysfs_dir(self.dev)
        self._sectors = int(read_sysfs(self._sysfs / "size") or 0) if self._sysfs else 0

    def _existing(self) -> Path:
        """The block device, or the nearest existing folder of a file or scratch file: what the
        target's identity and free space are read from (never through the file, which may be
        a link to elsewhere)."""
        if self.kind == "block":
            return self.path
        p = self.path.parent
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

    def offer(self) -> str:
        """What the target offers, as a refusal says it: the device's size, or a file's
        filesystem's free space less qual's reserve."""
        if self.kind == "block":
            return f"the device holds {format_size(self.capacity)}"
        free = shutil.disk_usage(self._existing()).free
        existing = self.path.stat().st_size if self.path.exists() else 0
        have = f" and qual's scratch file already holds {format_size(existing)}" if existing \
            else ""
        return (f"{self._existing()} has {format_size(free)} free{have}, and qual keeps "
                f"{format_size(SPACE_RESERVE)} of a filesystem in reserve: "
                f"{format_size(self.capacity)} usable")

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

    def gone(self) -> str | None:
        """Why the block device under the target (the device itself, or a file target's
        filesystem's) is no longer there, or None: its node names another device or none,
        or it left sysfs, or it reports no capacity (what the kernel sets when it loses a
        namespace). Read from /dev and sysfs only, which answer whatever the device does."""
        if self._sysfs is None:
            return None  # not on a block device (tmpfs, FUSE): nothing to tell
        name = self.path if self.kind == "block" else f"the device under {self.spec}"
        if self.kind == "block":
            try:
                now = os.stat(self.path)
            except OSError as e:
                return f"{name} is no longer in /dev ({e.strerror})"
            if not stat.S_ISBLK(now.st_mode) or now.st_rdev != self.dev:
                return f"{name} now names another device"
        size = read_sysfs(self._sysfs / "size")
        if size is None:
            return f"{name} has left the system ({self._sysfs} is gone)"
        if int(size) == 0 and self._sectors:
            return (f"{name} reports a capacity of 0 bytes (it held "
                    f"{format_size(self._sectors * 512)} when the run began)")
        return None

    def owned(self) -> bool:
        return self.kind != "block" and scratch.prove(self.path) is not None

    # ---- preparing for I/O

    def ensure_data(self, size: int, *, reads: bool = True) -> None:
        """Make [0, size) hold real data written once, so reads hit real blocks (on a block
        device, with `fill_reads`, blocks this run wrote); afterwards `inode` names what jobs
        may open."""
        if size > self.capacity:
            raise NoSpace(errno.ENOSPC, f"needs {format_size(size)}, {self.offer()}",
                          target=self.spec)
        if self.kind == "block":
            st = os.stat(self.path)
            self.inode = (st.st_dev, st.st_ino)
            if reads and self.fill_reads and self.written < size:
                self._fill_device(size)
            return
        owned = scratch.prove(self.path)
        if owned is None and os.path.lexists(self.path):
            self.inode = self._check_foreign_file(size)
            return
        if owned is None:
            self._make_folder()
            owned = scratch.create(self.path)
        self.inode = owned.inode
        if owned.written >= size:
            return
        end = -(-size // FILL_BLOCK) * FILL_BLOCK
        self._fill(owned.written // FILL_BLOCK * FILL_BLOCK, end)
        scratch.mark(owned, end)

    def _fill_device(self, size: int) -> None:
        """A block device's reads read what this run wrote: [written, size) is written once
        with incompressible data first (a drive answers deallocated blocks without touching its
        media), after the guard and under the exclusive hold."""
        self.check_guard()
        self.claim()
        end = min(self.capacity, -(-size // FILL_BLOCK) * FILL_BLOCK)
        self._fill(self.written // FILL_BLOCK * FILL_BLOCK, end)
        self.written = end

    def _fill(self, start: int, end: int) -> None:
        """[start, end) written sequentially with the fill's data, made durable."""
        def filled(done: int, _ops: int, seconds: float) -> None:
            if self.progress:
                self.progress(f"filling {self.path}: {format_size(start + done)} of "
                              f"{format_size(end)} ({done / max(seconds, 1e-9) / 2**20:.0f} MiB/s)")

        engine.run_job(IoJob(target=str(self.path), op="write", pattern="sequential",
                             block_size=FILL_BLOCK, queue_depth=FILL_DEPTH, offset=start,
                             size=end - start, bytes=end - start, seed=FILL_SEED,
                             align=self.align, expect=self.inode),
                       progress=filled, interval=5.0)

    def _check_foreign_file(self, size: int) -> tuple[int, int]:
        """A file qual did not create, to be read only: a regular file, big enough, not
        sparse. Returns its inode."""
        st = scratch.check_regular(self.path, "file")
        if st.st_size < size:
            raise TargetUnavailable(errno.EINVAL, f"holds {format_size(st.st_size)}, the job "
                                    f"needs {format_size(size)}; qual does not extend files it "
                                    "did not create", target=self.spec)
        if st.st_blocks * 512 < size:
            raise TargetUnavailable(errno.EINVAL, "is sparse: reads of holes never reach the "
                                    "device; give a fully written file or a directory",
                                    target=self.spec)
        return st.st_dev, st.st_ino

    def ensure_writable(self, size: int) -> None:
        """Check that qual may write [0, size) here, before any byte is written: the guard and
        the exclusive hold for a block device, qual's proof of ownership for a file."""
        if self.kind == "block":
            self.check_guard()
            self.claim()
        elif os.path.lexists(self.path) and scratch.prove(self.path) is None:
            raise TargetUnavailable(errno.EPERM, "was not created by qual, or qual cannot prove "
                                    "it was (a link, another file, a forged marker); qual writes "
                                    "only files it created (give a directory or a new file name)",
                                    target=self.spec)
        # writes overwrite allocated blocks: allocation is not what a drive is qualified on
        # (a device's blocks need no fill under a write)
        self.ensure_data(size, reads=False)

    def check_guard(self) -> None:
        """UnsafeTarget, naming every rule, unless the guard allows writing to this block
        device."""
        refusals = guard_refusals(str(self.path), self.identity,
                                  allow_destructive=self.allow_destructive,
                                  confirm_serial=self.confirm_serial, flags=self.consent_flags)
        if refusals:
            raise UnsafeTarget(self.spec, refusals)

    def release_claim(self) -> None:
        """Let go of the exclusive hold (the lock stays): for the filesystem qual makes on the
        device, which mkfs and then the mount hold exclusively in turn."""
        if self._claim_fd is not None:
            os.close(self._claim_fd)
            self._claim_fd = None

    def claim(self) -> None:
        """Hold the block device exclusively (O_EXCL) until unlock(): one open for every job,
        worker and suite of the run, so the kernel refuses a mount or another exclusive user
        meanwhile, and refuses this claim while the device is in use."""
        if self._claim_fd is not None:
            return
        try:
            self._claim_fd = os.open(self.path, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
        except OSError as e:
            why = "is in use (mounted or held): exclusive open refused" if e.errno == errno.EBUSY \
                else f"cannot open exclusively: {e.strerror}"
            raise TargetUnavailable(e.errno, why, target=self.spec) from None

    def let_go(self) -> bool:
        """Close what this process holds open on a block device (its lock and exclusive hold)
        before the device is cut off: a loop device is detached only once nobody holds it, and
        a drive that comes back is another device. Returns whether it was locked."""
        self.release_claim()
        locked = self._lock_fd is not None
        if locked:
            os.close(self._lock_fd)
            self._lock_fd = None
        return locked

    def rebind(self, path: Path, *, lock: bool) -> None:
        """The same drive (the caller proved its serial) back at `path`, perhaps under another
        name: what the target is, re-read; the guard asked again before any write; the lock
        taken again where it was held."""
        self.path = path
        st = os.stat(path)
        self.dev = st.st_rdev
        self.identity = read_identity(self.dev, is_block_target=True, path=path)
        self._sysfs = sysfs_dir(self.dev)
        self._sectors = int(read_sysfs(self._sysfs / "size") or 0) if self._sysfs else 0
        self.inode = None
        if lock:  # udev probes a device that appears under its shared lock: wait it out
            deadline = time.monotonic() + REBIND_LOCK_S
            while True:
                try:
                    self.lock()
                    break
                except TargetUnavailable as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def job(self, **kw) -> IoJob:
        """An IoJob on this target, aligned to it. Building it validates the parameters;
        nothing is read or written until prepare() has checked the target."""
        kw.setdefault("align", self.align)
        return IoJob(target=str(self.path), **kw)

    def prepare(self, job: IoJob) -> IoJob:
        """Make the job's region ready (real data under reads, the guard passed for writes) and
        return the job bound to the inode that was checked: the engine opens nothing else."""
        home = self.path if self.kind == "block" else self.path.parent
        if not home.exists() and not self._default:
            raise TargetUnavailable(errno.ENOENT, f"vanished: {home} no longer exists",
                                    target=self.spec)
        end = job.offset + job.size
        if job.writes:
            self.ensure_writable(end)
        else:
            self.ensure_data(end)
        return replace(job, expect=self.inode)

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
                self._make_folder()
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW |
                             os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise TargetUnavailable(e.errno, f"cannot open: {e.strerror}", target=self.spec) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TargetUnavailable(errno.EBUSY, "another qual run holds this target",
                                    target=self.spec) from None
        self._lock_fd = fd

    def _make_folder(self) -> None:
        """The default target's folder (.qual/), made where it is missing."""
        if self._default and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._made_folder = True

    def unlock(self) -> None:
        """Let go of the target: the lock, the exclusive hold of a block device, and the
        folder .qual/ where this run made it and left nothing in it (a run stopped by Ctrl-C
        included)."""
        self.release_claim()
        if self._lock_fd is None:
            return
        if self._lock_path is not None:
            self._lock_path.unlink(missing_ok=True)
        os.close(self._lock_fd)
        self._lock_fd = None
        if self._made_folder:
            with contextlib.suppress(OSError):  # not empty: the kept scratch file is in it
                self.path.parent.rmdir()

    def cleanup(self) -> list[str]:
        """Remove the scratch file, only if qual provably created it, and the lock file a
        killed run left behind (a regular file no process holds); returns what it removed."""
        if self.kind == "block":
            return []
        removed = []
        owned = scratch.prove(self.path)
        if owned is not None:
            scratch.remove(owned)
            removed.append(str(self.path))
        lock = self.lock_file
        if lock.exists() and getattr(self, "_lock_path", None) != lock:
            try:
                fd = scratch.open_nofollow(lock, os.O_RDWR)
            except OSError:
                return removed
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    lock.unlink()  # nobody holds it: a leftover
                    removed.append(str(lock))
            except BlockingIOError:
                pass  # a live run holds it
            finally:
                os.close(fd)
        return removed

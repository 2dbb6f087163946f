"""The filesystem qual makes on a raw namespace for the file families (checkpoint, training,
GNN: docs/ARCHITECTURE.md, "A raw namespace"). It is made only on a device that passed the
guard, mounted on a folder qual made inside this process's own mount namespace (so no other
process sees it, and it cannot outlive the process), and at the end unmounted and its signature
erased, so the device is left as blank as it was found.

qual's mark is the filesystem's label: "qual" and 8 hex digits of a hash of the UUID qual gave
it. `qual clean DEV` erases a filesystem only where the label proves it is qual's (a run killed
between mount and erase leaves one behind; the guard then refuses the device and says so)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import subprocess
import time
import uuid as uuids
from pathlib import Path

from qual import watchdog
from qual.errors import QualError
from qual.targets.scratch import own_tempdir

# ext4 without lazy initialisation: its inode tables and journal are written by mkfs, not by a
# kernel thread in the background while qual measures; no blocks reserved for root
OPTIONS = {"ext4": ("-E", "lazy_itable_init=0,lazy_journal_init=0", "-m", "0"),
           "xfs": ()}
MKFS_TIMEOUT_S = 600     # mkfs of a large namespace writes its inode tables
UNMOUNT_WAIT_S = 30      # a file closed a moment ago can keep the mount busy briefly
TOOL_TIMEOUT_S = 60
MARK = b"qual filesystem:"

CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18

_private = False


def label_for(fs_uuid: str) -> str:
    """qual's label for a filesystem with this UUID (12 characters: xfs's limit)."""
    return "qual" + hashlib.sha256(MARK + fs_uuid.lower().encode()).hexdigest()[:8]


def usable_room(capacity: int, kind: str) -> int:
    """Bytes the file families can fill on a `kind` filesystem made over `capacity` bytes: less
    its journal or log (up to 1 GiB on large devices), its inode tables (ext4: 256 bytes per
    16 KiB, 1.6 %) and qual's reserve for the filesystem's own metadata."""
    journal = min(1 << 30, max(16 << 20, capacity // 64))
    tables = capacity // 64 if kind == "ext4" else capacity // 100
    return max(0, capacity - journal - tables - (64 << 20))


def private_mounts() -> None:
    """Put this process in a mount namespace of its own whose mounts propagate nowhere: what it
    mounts no other process sees, and the kernel unmounts it when the process ends, however it
    ends. Must run before the process starts threads (CLONE_NEWNS refuses a process whose
    threads share its filesystem context)."""
    global _private
    if _private:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise QualError(e, f"cannot make a private mount namespace for qual's filesystem: "
                           f"{os.strerror(e)} (root is needed, before any thread starts)")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        e = ctypes.get_errno()
        raise QualError(e, f"cannot make qual's mounts private: {os.strerror(e)}")
    _private = True


def _tool(cmd: list[str], what: str, timeout: float = TOOL_TIMEOUT_S) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=watchdog.dies_with_me())
    except FileNotFoundError:
        raise QualError(errno.ENOENT, f"{what} needs {cmd[0]}, which is not installed",
                        target=cmd[-1]) from None
    except subprocess.TimeoutExpired:
        raise QualError(errno.ETIMEDOUT, f"{what}: {cmd[0]} did not finish in {timeout:g} s",
                        target=cmd[-1]) from None
    if proc.returncode != 0:
        raise QualError(errno.EIO, f"{what}: {' '.join(cmd)} failed: "
                                   f"{(proc.stderr or proc.stdout).strip()}", target=cmd[-1])
    return proc.stdout


def probe(device: str) -> dict[str, str]:
    """What blkid finds on the device (TYPE, LABEL, UUID, ...); {} when it finds nothing."""
    proc = subprocess.run(["blkid", "-p", "-o", "export", device], capture_output=True,
                          text=True, timeout=TOOL_TIMEOUT_S)
    if proc.returncode == 2:
        return {}
    if proc.returncode != 0:
        raise QualError(errno.EIO, f"blkid -p cannot probe the device: {proc.stderr.strip()}",
                        target=device)
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def is_qual_filesystem(found: dict[str, str]) -> bool:
    """Whether blkid's findings are a filesystem qual made (its label proves its UUID)."""
    return bool(found.get("UUID")) and found.get("LABEL") == label_for(found["UUID"])


def erase_leftover(device: str) -> bool:
    """`qual clean DEV`: erase the filesystem an interrupted run left on the device, only if it
    carries qual's mark and is not mounted; returns whether there was one."""
    found = probe(device)
    if not found:
        return False
    if not is_qual_filesystem(found):
        raise QualError(errno.EPERM, f"holds a {found.get('TYPE', 'signature')} qual did not make "
                        f"(label {found.get('LABEL')!r}): qual erases only its own filesystem",
                        target=device)
    fd = os.open(device, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)  # EBUSY while mounted
    os.close(fd)
    _tool(["wipefs", "-a", "-q", device], "erasing qual's filesystem")
    return True


class QualFilesystem:
    """A filesystem qual makes on a device, mounted where only this process sees it."""

    def __init__(self, device: str, kind: str = "ext4", options: tuple[str, ...] | None = None):
        self.device = device
        self.kind = kind
        self.options = tuple(OPTIONS[kind] if options is None else options)
        self.uuid = str(uuids.uuid4())
        self.label = label_for(self.uuid)
        self.mountpoint: Path | None = None
        self.made = False

    def describe(self) -> dict:
        return {"type": self.kind, "options": list(self.options), "label": self.label,
                "uuid": self.uuid, "device": self.device}

    def make(self) -> Path:
        """mkfs (with qual's label and UUID), then mount on a new folder in this process's
        private mount namespace; returns the mount point."""
        private_mounts()
        ident = ["-L", self.label, "-U", self.uuid] if self.kind == "ext4" else \
            ["-L", self.label, "-m", f"uuid={self.uuid}", "-f"]
        flags = ["-q", "-F"] if self.kind == "ext4" else ["-q"]
        self.made = True  # from here on a signature may be on the device: close() erases it
        _tool([f"mkfs.{self.kind}", *flags, *ident, *self.options, self.device],
              f"making qual's {self.kind} filesystem", timeout=MKFS_TIMEOUT_S)
        point = own_tempdir("fs", whole=False)
        try:
            _tool(["mount", "-t", self.kind, self.device, str(point)], "mounting qual's filesystem")
        except QualError:
            point.rmdir()
            raise
        self.mountpoint = point
        return point

    def close(self) -> None:
        """Unmount (waiting out a briefly busy mount, then detaching it) and erase the
        signature qual made; safe to call twice."""
        if self.mountpoint is not None:
            point, self.mountpoint = self.mountpoint, None
            deadline = time.monotonic() + UNMOUNT_WAIT_S
            while subprocess.run(["umount", str(point)], capture_output=True,
                                 timeout=TOOL_TIMEOUT_S).returncode and os.path.ismount(point):
                if time.monotonic() > deadline:
                    raise QualError(errno.EBUSY, f"qual's filesystem at {point} stayed busy for "
                                    f"{UNMOUNT_WAIT_S} s; it is unmounted when this process ends, "
                                    f"then `qual clean {self.device}` erases it",
                                    target=self.device)
                time.sleep(0.2)
            with contextlib.suppress(OSError):
                point.rmdir()  # the folder qual made, empty once unmounted
        if self.made:
            self.made = False
            _tool(["wipefs", "-a", "-q", self.device], "erasing qual's filesystem")

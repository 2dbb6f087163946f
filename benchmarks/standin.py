"""The RAM-backed stand-in for a Gen5 drive: ext4 on a loop device over a file in /dev/shm,
where the host software, not the flash, is the limit (docs/benchmarks.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

SHM = Path("/dev/shm")


def _sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@contextmanager
def ram_stand_in(size: int):
    """(mount point, loop device) of a fresh stand-in of `size` bytes; removed afterwards. Its
    memory is taken up front (and mkfs told not to give it back by discarding): the first
    touch of a page of /dev/shm costs more than later ones, and a run over pages never
    touched ran at half the speed of the same run after it."""
    backing = Path(tempfile.mkdtemp(dir=SHM, prefix="qual-bench-")) / "drive.img"
    with open(backing, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    dev = _sh("losetup", "--find", "--show", "--direct-io=on", str(backing))
    point = Path(tempfile.mkdtemp(prefix="qual-bench-mnt-"))
    try:
        _sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", dev)
        _sh("mount", "-o", "noatime", dev, str(point))
        yield point, dev
    finally:
        for _ in range(50):  # the kernel lets go of a ring's files a moment after close
            if subprocess.run(["umount", str(point)], capture_output=True).returncode == 0 \
                    or not os.path.ismount(point):
                break
            time.sleep(0.1)
        subprocess.run(["losetup", "--detach", dev], capture_output=True)
        shutil.rmtree(backing.parent, ignore_errors=True)
        point.rmdir()


@contextmanager
def raw_stand_in(size: str):
    """A raw RAM-backed loop device of `size` (its memory taken up front, O_DIRECT through to
    it), for reads only; detached afterwards."""
    from qual.units import parse_size

    backing = Path(tempfile.mkdtemp(dir=SHM, prefix="qual-bench-")) / "drive.img"
    with open(backing, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, parse_size(size))
    dev = _sh("losetup", "--find", "--show", "--direct-io=on", str(backing))
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "--detach", dev], capture_output=True)
        shutil.rmtree(backing.parent, ignore_errors=True)

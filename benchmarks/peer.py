"""What every benchmark needs before it starts: fio, the peer it is measured against, and a
folder on the drive to hold both tools' files."""

from __future__ import annotations

import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from qual.targets import Target


def bench_folder(folder: str) -> tuple[Path, Target] | None:
    """The folder (made if missing) and its target, or None after saying that fio is missing."""
    if not shutil.which("fio"):
        print("fio is not installed (Debian: apt-get install fio)", file=sys.stderr)
        return None
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path, Target(path)


@contextmanager
def shared_file(folder: str, size: str):
    """The path of a file of `size` in folder, written once with random blocks so that both
    tools read real blocks, and removed afterwards; exits 2 when fio is missing."""
    from qual.units import parse_size

    ready = bench_folder(folder)
    if ready is None:
        raise SystemExit(2)
    _, target = ready
    target.ensure_data(parse_size(size))
    try:
        yield target.path
    finally:
        target.cleanup()

"""A DLIO-style training dataset on the target: sample files of incompressible bytes, sizes
drawn per file as DLIO's generator draws them (normal around the record length), written
through the engine with O_DIRECT and made durable, separately from any measured run. A
manifest lists every file and its size; a dataset is reused while its parameters match."""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from qual import engine
from qual.engine import IoJob
from qual.errors import NoSpace, TargetUnavailable
from qual.targets import Target
from qual.targets.scratch import drop_cache, fsync_dir, own_folder, remove_made
from qual.units import format_size
from qual.workloads.training.configs import Workload

FOLDER = "qual-train"
MANIFEST = "qual-dataset.json"
FORMAT = "qual-training-dataset/1"
WRITE_BLOCK = 1 << 20
WRITE_DEPTH = 8
MIN_FILE = 4096


@dataclass(frozen=True)
class Dataset:
    folder: Path
    workload: Workload
    sizes: tuple[int, ...]  # bytes per file, in file order
    seed: int

    @property
    def files(self) -> int:
        return len(self.sizes)

    @property
    def bytes(self) -> int:
        return sum(self.sizes)

    def path(self, i: int) -> str:
        return str(self.folder / "train" / _name(i, self.files))

    def drop_cache(self) -> None:
        """Evict the files' pages, so that a page-cache-mode epoch starts from the device."""
        for i in range(self.files):
            drop_cache(self.path(i))

    def as_dict(self) -> dict:
        return {"folder": str(self.folder), "files": self.files, "bytes": self.bytes,
                "mean_file_bytes": self.bytes / self.files, "seed": self.seed,
                "min_file_bytes": min(self.sizes), "max_file_bytes": max(self.sizes)}


def _name(i: int, n: int) -> str:
    width = len(str(n))
    return f"img_{i + 1:0{width}d}_of_{n}.bin"  # DLIO's img_<i>_of_<n>, raw bytes


def file_sizes(w: Workload, seed: int) -> np.ndarray:
    """Bytes of each file: samples_per_file records, each normal(record_length, stdev) as DLIO
    draws a record's dimensions, at least 4 KiB."""
    rng = np.random.default_rng(seed)
    records = rng.normal(w.record_length, w.record_stdev, size=(w.files, w.samples_per_file)) \
        if w.record_stdev else np.full((w.files, w.samples_per_file), float(w.record_length))
    return np.maximum(MIN_FILE, np.rint(np.abs(records)).astype(np.int64).sum(axis=1))


def _folder(target: Target, w: Workload) -> Path:
    home = target.directory
    if home is None:
        raise TargetUnavailable(errno.ENOTSUP, "training data needs a filesystem: give a "
                                "directory on the drive", target=target.spec)
    return home / FOLDER / w.name


def _identity(w: Workload, seed: int) -> dict:
    """What a dataset's manifest must say to be reused, as JSON reads it back (lists)."""
    return json.loads(json.dumps({"format": FORMAT, "workload": asdict(w), "seed": seed}))


def prepare(target: Target, w: Workload, *, seed: int = 0, progress=None) -> Dataset:
    """The dataset for w on the target: the existing one when it matches, else generated (a
    stale one qual made is replaced; anything else in the way is refused)."""
    folder = _folder(target, w)
    manifest = folder / MANIFEST
    sizes = file_sizes(w, seed)
    if manifest.exists():
        doc = json.loads(manifest.read_text())
        if doc.get("created_by") != "qual":
            raise TargetUnavailable(errno.EEXIST, f"{folder} holds a dataset qual did not make",
                                    target=target.spec)
        if {k: doc.get(k) for k in ("format", "workload", "seed")} == _identity(w, seed) and \
                doc.get("complete") and _intact(folder, doc["sizes"]):
            return Dataset(folder, w, tuple(doc["sizes"]), seed)
        shutil.rmtree(folder)
    elif folder.exists():
        raise TargetUnavailable(errno.EEXIST, f"{folder} exists and is not a qual dataset",
                                target=target.spec)
    need = int(sizes.sum())
    free = shutil.disk_usage(folder.parent if folder.parent.exists() else target.directory).free
    if need > free:
        raise NoSpace(errno.ENOSPC, f"the {w.name} dataset needs {format_size(need)} in "
                      f"{w.files} files; {format_size(free)} is free", target=target.spec)
    own_folder(folder.parent)  # qual-train/: no one else may plant links in it
    (folder / "train").mkdir(parents=True)
    doc = {"created_by": "qual", **_identity(w, seed), "sizes": [int(s) for s in sizes],
           "complete": False}
    manifest.write_text(json.dumps(doc))
    align = target.align
    data = Dataset(folder, w, tuple(doc["sizes"]), seed)
    for i, size in enumerate(doc["sizes"]):
        _write(data.path(i), size, align, seed * 1_000_003 + i)
        if progress and (i + 1) % max(1, data.files // 10) == 0:
            progress(f"{w.name}: {i + 1}/{data.files} files generated")
    fsync_dir(folder / "train")
    doc["complete"] = True
    manifest.write_text(json.dumps(doc))
    fsync_dir(folder)
    return data


def _write(path: str, size: int, align: int, seed: int) -> None:
    """One file of incompressible bytes, durable: O_DIRECT writes of the size rounded up to the
    alignment, then cut to the exact size."""
    padded = -(-size // align) * align
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        os.posix_fallocate(fd, 0, padded)
    except OSError as e:
        os.close(fd)
        raise NoSpace(e.errno, f"cannot allocate {format_size(padded)}: {e.strerror}",
                      target=path) from None
    os.close(fd)
    block = min(WRITE_BLOCK, padded)
    block -= block % align
    full = padded // block * block
    engine.run_job(IoJob(target=path, op="write", pattern="sequential", block_size=block,
                         queue_depth=WRITE_DEPTH, size=full, bytes=full, seed=seed, align=align))
    if padded > full:  # the tail, smaller than one block
        engine.run_job(IoJob(target=path, op="write", pattern="sequential",
                             block_size=padded - full, offset=full, size=padded - full,
                             bytes=padded - full, seed=seed, align=align))
    os.truncate(path, size)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _intact(folder: Path, sizes: list[int]) -> bool:
    files = folder / "train"
    n = len(sizes)
    try:
        return all((files / _name(i, n)).stat().st_size == s for i, s in enumerate(sizes))
    except OSError:
        return False


def remove(target: Target) -> None:
    """Every dataset qual made on the target (each carries qual's manifest)."""
    if target.directory is not None:
        remove_made(target.directory / FOLDER, MANIFEST)

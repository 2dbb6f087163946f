"""Checkpoints on disk: a directory per checkpoint with one file per rank and a manifest,
committed atomically; restore refuses anything not complete and intact; cleanup removes only
what qual made.

Commit order: every rank's data file is written and made durable inside `<name>.partial/`;
then the manifest (tensor table, offsets, chunk CRCs, plan, its own CRC32C) is written,
fsync'ed and renamed into place; then the directory is fsync'ed and renamed to `<name>/` and
the root fsync'ed. A crash at any point leaves the earlier complete checkpoints, plus at most a
`.partial` directory that restore refuses and cleanup removes.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
from pathlib import Path

from qual import engine
from qual.errors import DataMismatch, QualError
from qual.targets.scratch import fsync_dir, own_folder

ROOT_NAME = "qual-checkpoints"
MARKER = ".qual-checkpoints.json"
MANIFEST = "manifest.json"
FORMAT = "qual-ckpt/1"
PARTIAL = ".partial"
NAME = re.compile(r"^ckpt-(\d{6})$")


class IncompleteCheckpoint(QualError):
    """A checkpoint directory that was never committed (or lost its manifest)."""


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.bin"


def _canonical(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "crc32c"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class CheckpointStore:
    """The checkpoints qual keeps under one folder (`<dir>/qual-checkpoints/`)."""

    def __init__(self, parent: str | Path):
        self.root = Path(parent) / ROOT_NAME

    # ---- ownership

    def create(self) -> None:
        """Make the root (or adopt it, if qual made it before)."""
        if self.root.exists() and not self.owned():
            raise QualError(errno.EEXIST, "exists and was not made by qual; qual will not write "
                            "checkpoints into it", target=str(self.root))
        own_folder(self.root)
        marker = self.root / MARKER
        if not marker.exists():
            marker.write_text(json.dumps({"created_by": "qual", "format": FORMAT,
                                          "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
            fsync_dir(self.root)

    def owned(self) -> bool:
        try:
            return json.loads((self.root / MARKER).read_text()).get("created_by") == "qual"
        except (OSError, ValueError):
            return False

    # ---- writing

    def next_name(self) -> str:
        used = [int(m.group(1)) for p in self.root.iterdir()
                if (m := NAME.match(p.name.removesuffix(PARTIAL)))]
        return f"ckpt-{max(used, default=0) + 1:06d}"

    def begin(self, name: str) -> Path:
        partial = self.root / f"{name}{PARTIAL}"
        partial.mkdir()
        return partial

    def commit(self, partial: Path, manifest: dict) -> Path:
        """Manifest last, then the rename that makes the checkpoint exist."""
        manifest = {**manifest, "format": FORMAT}
        manifest["crc32c"] = engine.crc32c(_canonical(manifest))
        tmp = partial / f".{MANIFEST}.tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps(manifest).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, partial / MANIFEST)
        fsync_dir(partial)
        final = partial.with_name(partial.name.removesuffix(PARTIAL))
        os.replace(partial, final)
        fsync_dir(self.root)
        return final

    # ---- reading

    def complete(self) -> list[Path]:
        """Committed checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and NAME.match(p.name))

    # ---- removing what qual made

    def prune(self, keep: int) -> list[Path]:
        """Delete the oldest committed checkpoints beyond `keep` (newest kept)."""
        done = self.complete()
        gone = done[:max(0, len(done) - keep)]
        for p in gone:
            shutil.rmtree(p)
        return gone

    def remove_partials(self) -> list[Path]:
        if not self.owned():
            return []
        gone = [p for p in self.root.iterdir() if p.is_dir() and p.name.endswith(PARTIAL)
                and NAME.match(p.name.removesuffix(PARTIAL))]
        for p in gone:
            shutil.rmtree(p)
        return gone

    def remove_all(self) -> None:
        """Every checkpoint qual made here, then the root itself; nothing else is touched."""
        if not self.owned():
            return
        for p in self.root.iterdir():
            if p.is_dir() and NAME.match(p.name.removesuffix(PARTIAL)):
                shutil.rmtree(p)
        (self.root / MARKER).unlink()
        try:
            self.root.rmdir()
        except OSError:
            pass  # something qual did not make is inside: it stays


def load(ckpt: str | Path) -> dict:
    """The manifest of a committed checkpoint set, checked: committed, not altered, every data
    file present with the size the manifest gives. A set travels (moved, renamed, copied to
    another host): committed means its manifest is present and intact, whatever its folder is
    called; only a folder still named `.partial` (a commit that never finished) is refused."""
    ckpt = Path(ckpt)
    if ckpt.name.endswith(PARTIAL):
        raise IncompleteCheckpoint(errno.ENODATA, "was never committed (a .partial "
                                   "directory): refusing to restore it", target=str(ckpt))
    path = ckpt / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IncompleteCheckpoint(errno.ENODATA, "has no manifest: refusing to restore it",
                                   target=str(ckpt)) from None
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise DataMismatch(errno.EBADMSG, f"manifest is corrupt (not JSON: {e})",
                           target=str(path)) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataMismatch(errno.EBADMSG, "manifest is corrupt or not qual's (no qual-ckpt/1 "
                           "format field): refusing to restore it", target=str(path))
    if manifest.get("crc32c") != engine.crc32c(_canonical(manifest)):
        raise DataMismatch(errno.EBADMSG, "manifest is corrupt: its CRC32C does not match "
                           "its content", target=str(path))
    for r in manifest["ranks"]:
        data = ckpt / r["file"]
        if not data.exists():
            raise IncompleteCheckpoint(errno.ENOENT, f"{r['file']} is missing: the set is "
                                       "incomplete, refusing to restore it", target=str(ckpt))
        size = data.stat().st_size
        if size != r["file_size"]:
            raise DataMismatch(errno.EBADMSG, f"{r['file']} holds {size} bytes, the "
                               f"manifest says {r['file_size']}", target=str(ckpt))
    return manifest

"""The feature store on the target: every node type's features back to back in one file, each
row aligned to the page size, no header (an .npy header shifts every row: GIDS issue #12), a
type-offset map (GIDS's `heterograph_map`), and a CRC32C per type, checked on demand."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qual import engine
from qual.errors import DataMismatch
from qual.targets.scratch import drop_cache, own_folder
from qual.workloads.gnn.igbh import FEATURE_DIM, IGBH, NODE_TYPES

FOLDER = "qual-gnn"
FORMAT = "qual-feature-store/1"
CHUNK_ROWS = 16384


@dataclass(frozen=True)
class FeatureStore:
    path: Path
    rows: int
    row_bytes: int
    row_stride: int
    page_size: int
    offsets: dict  # node type -> first row
    counts: dict
    crcs: dict  # node type -> CRC32C of its rows' bytes
    dataset: dict

    @property
    def manifest_path(self) -> Path:
        return self.path.with_suffix(".json")

    def global_rows(self, ntype: str, ids: np.ndarray) -> np.ndarray:
        return ids + self.offsets[ntype]

    def memmap(self) -> np.ndarray:
        """The store as [rows, dim] float32 (rows padded to the stride are sliced off)."""
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(self.rows, self.row_stride))
        return raw[:, :self.row_bytes].view(np.float32)

    def drop_cache(self) -> None:
        drop_cache(self.path)

    def verify(self, dataset: IGBH | None = None) -> None:
        """Check every type's CRC; with the dataset, also every row against its source file."""
        store = self.memmap()
        for t in NODE_TYPES:
            lo, n = self.offsets[t], self.counts[t]
            crc = 0
            for a in range(0, n, CHUNK_ROWS):
                b = min(n, a + CHUNK_ROWS)
                block = np.ascontiguousarray(store[lo + a:lo + b])
                crc = engine.crc32c(block, crc)
                if dataset is not None and not np.array_equal(
                        block.view(np.uint32), np.asarray(dataset.features(t)[a:b]).view(np.uint32)):
                    raise DataMismatch(errno.EBADMSG, f"{t} rows {a}..{b} differ from the dataset",
                                       target=str(self.path))
            if crc != self.crcs[t]:
                raise DataMismatch(errno.EBADMSG, f"{t} rows fail their CRC32C (stored "
                                   f"{self.crcs[t]:08x}, read {crc:08x})", target=str(self.path))

    def as_dict(self) -> dict:
        return {"format": FORMAT, "path": str(self.path), "rows": self.rows,
                "row_bytes": self.row_bytes, "row_stride": self.row_stride,
                "page_size": self.page_size, "offsets": self.offsets, "counts": self.counts,
                "crcs": self.crcs, "dataset": self.dataset}


def _identity(dataset: IGBH) -> dict:
    """What a store was built from: enough to know it is still the same data."""
    feat = {t: os.stat(dataset.base / t / "node_feat.npy") for t in NODE_TYPES}
    return {"root": str(dataset.root.resolve()), "size": dataset.size, "counts": dataset.counts,
            "mtimes": {t: st.st_mtime_ns for t, st in feat.items()}}


def build(dataset: IGBH, folder: str | Path, *, page_size: int = 4096) -> FeatureStore:
    """The store for a dataset in `folder`: reused when its manifest says it was built from
    this very dataset, else written afresh (the type order and offsets are GIDS's)."""
    folder = own_folder(Path(folder) / FOLDER)
    name = dataset.size.replace("@", "-x")
    path = folder / f"igbh-{name}.features"
    ident = _identity(dataset)
    manifest = path.with_suffix(".json")
    if path.exists() and manifest.exists():
        doc = json.loads(manifest.read_text())
        if doc.get("format") == FORMAT and doc.get("dataset") == ident and \
                doc.get("page_size") == page_size and path.stat().st_size == doc["rows"] * doc["row_stride"]:
            return FeatureStore(path=path, rows=doc["rows"], row_bytes=doc["row_bytes"],
                                row_stride=doc["row_stride"], page_size=page_size,
                                offsets=doc["offsets"], counts=doc["counts"], crcs=doc["crcs"],
                                dataset=ident)
    row_bytes = FEATURE_DIM * 4
    stride = -(-row_bytes // page_size) * page_size
    offsets, at = {}, 0
    for t in NODE_TYPES:
        offsets[t] = at
        at += dataset.counts[t]
    crcs = {}
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        pad = bytes(stride - row_bytes)
        for t in NODE_TYPES:
            src = dataset.features(t)
            crc = 0
            for a in range(0, dataset.counts[t], CHUNK_ROWS):
                block = np.ascontiguousarray(src[a:a + CHUNK_ROWS])
                crc = engine.crc32c(block, crc)
                if pad:
                    padded = np.zeros((len(block), stride), dtype=np.uint8)
                    padded[:, :row_bytes] = block.view(np.uint8).reshape(len(block), row_bytes)
                    f.write(padded.tobytes())
                else:
                    f.write(block.tobytes())
            crcs[t] = crc
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    store = FeatureStore(path=path, rows=at, row_bytes=row_bytes, row_stride=stride,
                         page_size=page_size, offsets=offsets, counts=dict(dataset.counts),
                         crcs=crcs, dataset=ident)
    manifest.write_text(json.dumps({**store.as_dict(), "created_by": "qual"}))
    store.drop_cache()  # the first measured read comes from the device
    return store


def remove(folder: str | Path) -> None:
    """Every feature store qual made in folder (files with qual's manifest), and the folder if
    it is then empty."""
    folder = Path(folder) / FOLDER
    if not folder.is_dir():
        return
    for manifest in folder.glob("*.json"):
        try:
            doc = json.loads(manifest.read_text())
        except ValueError:
            continue
        if doc.get("created_by") == "qual":
            Path(doc["path"]).unlink(missing_ok=True)
            manifest.unlink()
    for partial in folder.glob("*.partial"):
        partial.unlink()
    try:
        folder.rmdir()
    except OSError:
        pass


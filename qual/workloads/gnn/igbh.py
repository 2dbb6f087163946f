"""The IGBH dataset on disk, read exactly as the IGB loaders read it, and a deterministic
generator of synthetic IGBH in that same layout (docs/ARCHITECTURE.md §9, IGB).

    <root>/<size>/processed/<ntype>/node_feat.npy          float32 [n, 1024]
    <root>/<size>/processed/paper/node_label_19.npy        labels (19 classes)
    <root>/<size>/processed/paper/node_label_2K.npy        labels (2,983 classes)
    <root>/<size>/processed/<src>__<rel>__<dst>/edge_index.npy   int64 [E, 2] (src, dst)

tiny/small/medium files are real .npy files; for large/full the paper and author features
and the paper labels are header-less raw arrays (np.memmap at offset 0), as the IGB loaders
open them.
"""

from __future__ import annotations

import errno
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qual.errors import QualError

NODE_TYPES = ("paper", "author", "fos", "institute")
RELATIONS = (("paper", "cites", "paper"), ("paper", "written_by", "author"),
             ("author", "affiliated_to", "institute"), ("paper", "topic", "fos"))
FEATURE_DIM = 1024
CLASSES = 19
CLASSES_2K = 2983
HEADERLESS = ("large", "full")  # paper/author features and paper labels are raw arrays
MARKER = "QUAL_SYNTHETIC.json"

# Node counts of the published sizes (reference §3.3: paper and author counts from the IGB,
# GLT and MLPerf code; fos and institute from GIDS's offsets and logs). Institute counts for
# tiny and small are not published: the generator uses 10 % of the fos count.
SIZES = {
    "tiny": {"paper": 100_000, "author": 357_041, "fos": 84_220, "institute": 8_422},
    "small": {"paper": 1_000_000, "author": 1_926_066, "fos": 190_449, "institute": 19_045},
    "medium": {"paper": 10_000_000, "author": 15_544_654, "fos": 415_054, "institute": 23_256},
    "large": {"paper": 100_000_000, "author": 116_959_896, "fos": 649_707, "institute": 26_524},
    "full": {"paper": 269_346_174, "author": 277_220_883, "fos": 712_960, "institute": 26_918},
}


def rel_name(rel: tuple[str, str, str]) -> str:
    return "__".join(rel)


class IGBH:
    """An IGBH dataset (downloaded or synthetic) opened read-only, memory-mapped."""

    def __init__(self, root: str | Path, size: str):
        self.root = Path(root)
        self.size = size
        self.base = self.root / size / "processed"
        if not self.base.is_dir():
            raise QualError(errno.ENOENT, f"no IGBH dataset here (expected {self.base})",
                            target=str(self.root))
        self.headerless = size.split("@")[0] in HEADERLESS
        self.counts = {t: self._rows(t) for t in NODE_TYPES}
        marker = self.base.parent / MARKER
        self.synthetic = json.loads(marker.read_text()) if marker.exists() else None

    def _feat_path(self, ntype: str) -> Path:
        path = self.base / ntype / "node_feat.npy"
        if not path.exists():
            raise QualError(errno.ENOENT, f"IGBH {self.size} has no {ntype} features",
                            target=str(path))
        return path

    def _raw(self, ntype: str) -> bool:
        return self.headerless and ntype in ("paper", "author")

    def _rows(self, ntype: str) -> int:
        path = self._feat_path(ntype)
        if self._raw(ntype):
            size = path.stat().st_size
            if size % (FEATURE_DIM * 4):
                raise QualError(errno.EBADMSG, f"{size} bytes is not a whole number of "
                                f"{FEATURE_DIM}-float rows", target=str(path))
            return size // (FEATURE_DIM * 4)
        arr = np.load(path, mmap_mode="r")
        if arr.dtype != np.float32 or arr.ndim != 2 or arr.shape[1] != FEATURE_DIM:
            raise QualError(errno.EBADMSG, f"features are {arr.dtype} {arr.shape}, IGBH's are "
                            f"float32 [n, {FEATURE_DIM}]", target=str(path))
        return arr.shape[0]

    def features(self, ntype: str) -> np.ndarray:
        path = self._feat_path(ntype)
        if self._raw(ntype):
            return np.memmap(path, dtype=np.float32, mode="r",
                             shape=(self.counts[ntype], FEATURE_DIM))
        return np.load(path, mmap_mode="r")

    def labels(self, classes: int = CLASSES) -> np.ndarray:
        path = self.base / "paper" / ("node_label_19.npy" if classes == CLASSES
                                      else "node_label_2K.npy")
        if self.headerless:
            raw = np.memmap(path, dtype=np.float32, mode="r", shape=(self.counts["paper"],))
            return np.asarray(raw).astype(np.int64)
        return np.load(path).astype(np.int64)

    def edges(self, rel: tuple[str, str, str]) -> np.ndarray:
        path = self.base / rel_name(rel) / "edge_index.npy"
        arr = np.load(path, mmap_mode="r")
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise QualError(errno.EBADMSG, f"edge_index is {arr.shape}, IGBH's is [E, 2]",
                            target=str(path))
        return arr

    @property
    def nodes(self) -> int:
        return sum(self.counts.values())

    @property
    def feature_bytes(self) -> int:
        return self.nodes * FEATURE_DIM * 4

    def describe(self) -> dict:
        return {"root": str(self.root), "size": self.size, "counts": self.counts,
                "nodes": self.nodes, "feature_bytes": self.feature_bytes,
                "synthetic": self.synthetic}


# ------------------------------------------------------------------ the synthetic generator


def synthetic_name(size: str, scale: float) -> str:
    return size if scale == 1 else f"{size}@{scale:g}"


def _zipf_weights(n: int, rng: np.random.Generator, a: float = 0.8) -> np.ndarray:
    """Popularity of n items: a power law over a random order (power-law degrees)."""
    w = 1.0 / np.arange(1, n + 1) ** a
    rng.shuffle(w)
    return w / w.sum()


def _pick(rng, cdf: np.ndarray, members: np.ndarray, k: int) -> np.ndarray:
    return members[np.minimum(np.searchsorted(cdf, rng.random(k)), len(members) - 1)]


@dataclass(frozen=True)
class Calibration:
    """How hard the synthetic IGBH is: where a paper's class can be read from. As in the real
    IGBH, the answer lies in the graph, not in a paper's own features.

    signal: per node type, the class centroid's weight in the features (unit-variance noise
    per dimension, centroids of norm sqrt(1024)). homophily: per relation, the share of a
    paper's targets drawn from its own class (the rest from anyone), each target weighted by
    its power-law popularity. ambiguity: the share of papers labelled another class than the
    one their features and links follow (the real IGBH's labels are ambiguous too), which caps
    any model at 1 - ambiguity * 18/19.

    The defaults, measured on tiny@0.2 with the ci profile's RGAT (24 steps; tests/test_gnn.py
    holds each to its bound):
    - paper 0.06: a paper's own features alone. No classifier on them can beat the Bayes rule
      with the true centroids, 55 % of the true class, 47 % of the labels; an MLP trained on
      them reaches 32 % (at most 50 % at any scale).
    - author 0.3 and written_by 0.97: an author's other papers, two hops out, and the authors
      of the papers a paper cites carry the class; RGAT through either loader reaches 77-78 %.
    - cites 0.55, topic 0.7, fos and institute 0: citations help less, and the hot hubs (the
      topics) hold little, so that the answer lies in the many cold rows: with the outer
      hop's rows shuffled within the batch RGAT falls to 57 %, with each of them replaced by
      the neighbouring page (every time the same) to 66 %, with a cache that serves a slot's
      old contents before its refill to 59 %, with every neighbour's row shuffled to chance.
    - ambiguity 0.16: RGAT can reach no more than 84.8 %, however long it trains (the
      nvme-rig profile's 1,172 steps on IGBH-small)."""

    signal: dict = field(default_factory=lambda: {"paper": 0.06, "author": 0.3, "fos": 0.0,
                                                  "institute": 0.0})
    homophily: dict = field(default_factory=lambda: {"cites": 0.55, "written_by": 0.97,
                                                     "topic": 0.7})
    ambiguity: float = 0.16

    def as_dict(self) -> dict:
        return {"signal": dict(self.signal), "homophily": dict(self.homophily),
                "ambiguity": self.ambiguity}


CALIBRATION = Calibration()


def generate(root: str | Path, size: str = "tiny", *, scale: float = 1.0, seed: int = 0,
             chunk_rows: int = 65536, calibration: Calibration = CALIBRATION,
             progress=None) -> IGBH:
    """Write a synthetic IGBH of `size` (its published node counts, times `scale`) under
    root/<size>[@scale]/processed, deterministically for a seed and calibration (see
    Calibration). Citations, authors and topics follow the papers' classes with power-law
    popularity. Features are written in chunks: sizes larger than memory work."""
    if size not in SIZES:
        raise QualError(errno.EINVAL, f"IGBH size {size!r} is not one of {', '.join(SIZES)}")
    if not 0 < scale <= 1:
        raise QualError(errno.EINVAL, f"scale {scale} is outside (0, 1]")
    name = synthetic_name(size, scale)
    base = Path(root) / name / "processed"
    counts = {t: max(8, math.ceil(n * scale)) for t, n in SIZES[size].items()}
    headerless = size in HEADERLESS
    rng = np.random.default_rng(seed)
    for t in NODE_TYPES:
        (base / t).mkdir(parents=True, exist_ok=True)

    # classes: papers, and the authors and topics that write about each class
    class_p = _zipf_weights(CLASSES, rng, 0.5)
    paper_class = rng.choice(CLASSES, size=counts["paper"], p=class_p)
    author_class = rng.choice(CLASSES, size=counts["author"], p=class_p)
    fos_class = rng.choice(CLASSES, size=counts["fos"], p=class_p)
    centroids = rng.standard_normal((CLASSES, FEATURE_DIM)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True) / math.sqrt(FEATURE_DIM)
    signal = calibration.signal
    classes_of = {"paper": paper_class, "author": author_class, "fos": fos_class,
                  "institute": np.zeros(counts["institute"], dtype=np.int64)}

    for t in NODE_TYPES:
        path = base / t / "node_feat.npy"
        shape = (counts[t], FEATURE_DIM)
        if headerless and t in ("paper", "author"):
            out = np.memmap(path, dtype=np.float32, mode="w+", shape=shape)
        else:
            out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
        trng = np.random.default_rng([seed, NODE_TYPES.index(t)])
        for lo in range(0, counts[t], chunk_rows):
            hi = min(counts[t], lo + chunk_rows)
            block = trng.standard_normal((hi - lo, FEATURE_DIM), dtype=np.float32)
            if signal[t]:
                block += np.float32(signal[t]) * centroids[classes_of[t][lo:hi]]
            out[lo:hi] = block
            if progress:
                progress(f"{t} features {hi}/{counts[t]}")
        out.flush()
        del out

    # the label: the paper's class, but for an ambiguous share another class
    lrng = np.random.default_rng([seed, len(NODE_TYPES)])
    label = paper_class.copy()
    other = lrng.random(counts["paper"]) < calibration.ambiguity
    label[other] = (paper_class[other] + lrng.integers(1, CLASSES, int(other.sum()))) % CLASSES
    labels_2k = label * (CLASSES_2K // CLASSES) + rng.integers(0, CLASSES_2K // CLASSES,
                                                               counts["paper"])
    for fname, values in (("node_label_19.npy", label), ("node_label_2K.npy", labels_2k)):
        path = base / "paper" / fname
        if headerless:
            values.astype(np.float32).tofile(path)  # the large/full loaders read float32 raw
        else:
            np.save(path, values.astype(np.int64))

    members = {t: [np.flatnonzero(classes_of[t] == c) for c in range(CLASSES)]
               for t in ("paper", "author", "fos")}
    popularity = {t: _zipf_weights(counts[t], rng) for t in NODE_TYPES}

    def homophilous(src_class: np.ndarray, dst_type: str, k: int, share: float) -> np.ndarray:
        """k targets per source: `share` of them from the source's class, the rest from
        anyone, each weighted by the target's popularity."""
        out = np.empty(len(src_class) * k, dtype=np.int64)
        own = rng.random(len(out)) < share
        cls = np.repeat(src_class, k)
        everyone = np.cumsum(popularity[dst_type])
        out[~own] = _pick(rng, everyone, np.arange(counts[dst_type]), int((~own).sum()))
        for c in range(CLASSES):
            sel = own & (cls == c)
            pool = members[dst_type][c]
            if not sel.any():
                continue
            if len(pool) == 0:
                out[sel] = _pick(rng, everyone, np.arange(counts[dst_type]), int(sel.sum()))
                continue
            w = popularity[dst_type][pool]
            out[sel] = _pick(rng, np.cumsum(w / w.sum()), pool, int(sel.sum()))
        return out

    papers = np.arange(counts["paper"])
    plan = {("paper", "cites", "paper"): (papers, paper_class, "paper", 8),
            ("paper", "written_by", "author"): (papers, paper_class, "author", 3),
            ("paper", "topic", "fos"): (papers, paper_class, "fos", 2)}
    for rel, (src, src_class, dst_type, k) in plan.items():
        dst = homophilous(src_class, dst_type, k, calibration.homophily[rel[1]])
        edges = np.stack([np.repeat(src, k), dst], axis=1)
        if rel[1] == "cites":
            edges = edges[edges[:, 0] != edges[:, 1]]  # no self-citations
        edges = np.unique(edges, axis=0)
        (base / rel_name(rel)).mkdir(exist_ok=True)
        np.save(base / rel_name(rel) / "edge_index.npy", edges.astype(np.int64))
    inst = _pick(rng, np.cumsum(popularity["institute"]), np.arange(counts["institute"]),
                 counts["author"])
    rel = ("author", "affiliated_to", "institute")
    (base / rel_name(rel)).mkdir(exist_ok=True)
    np.save(base / rel_name(rel) / "edge_index.npy",
            np.stack([np.arange(counts["author"]), inst], axis=1).astype(np.int64))

    marker = {"created_by": "qual", "generator": "qual synthetic IGBH", "size": size,
              "scale": scale, "seed": seed, "counts": counts,
              "calibration": calibration.as_dict()}
    (base.parent / MARKER).write_text(json.dumps(marker))
    os.sync()
    return IGBH(root, name)

"""The vector database's data: seeded clustered float32 vectors written in DiskANN's .bin
layout (two int32 counts, then the rows) a chunk at a time, so that ten million of 1536
dimensions never sit in memory at once; queries drawn around the same clusters; and each
sampled query's exact k nearest neighbours by brute force (numpy), the truth recall is judged
against."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

CHUNK_BYTES = 64 << 20  # rows generated, written or compared at a time
SPREAD = 0.35  # a point's distance from its cluster centre, against the centres' own spread


def _rows_per_chunk(dimensions: int) -> int:
    return max(1, CHUNK_BYTES // (dimensions * 4))


def centres(table: dict) -> np.ndarray:
    rng = np.random.default_rng([table["data_seed"], 0])
    return rng.standard_normal((table["clusters"], table["dimensions"]), dtype=np.float32)


def _around(centre_rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    noise = rng.standard_normal(centre_rows.shape, dtype=np.float32)
    return centre_rows + np.float32(SPREAD) * noise


def write_vectors(path: Path, table: dict, progress=None) -> int:
    """The base vectors at `path`, made durable; returns the bytes written. Chunk i is drawn
    from its own seed ([data_seed, 1, i]), so the data does not depend on the chunk size."""
    n, d = table["vectors"], table["dimensions"]
    c = centres(table)
    rows = _rows_per_chunk(d)
    with open(path, "wb") as f:
        f.write(np.array([n, d], dtype=np.int32).tobytes())
        for i, start in enumerate(range(0, n, rows)):
            rng = np.random.default_rng([table["data_seed"], 1, i])
            count = min(rows, n - start)
            f.write(_around(c[rng.integers(0, len(c), count)], rng).tobytes())
            if progress:
                progress(start + count, n)
        f.flush()
        os.fsync(f.fileno())
    return 8 + n * d * 4


def read_vectors(path: Path) -> np.ndarray:
    """The vectors of a .bin file, mapped (read a chunk at a time as they are used)."""
    n, d = np.fromfile(path, dtype=np.int32, count=2)
    return np.memmap(path, dtype=np.float32, mode="r", offset=8, shape=(int(n), int(d)))


def queries(table: dict) -> np.ndarray:
    """The queries, drawn around the data's clusters from their own seed."""
    rng = np.random.default_rng([table["data_seed"], 2])
    c = centres(table)
    return _around(c[rng.integers(0, len(c), table["queries"])], rng)


def exact_neighbours(vectors: np.ndarray, sample: np.ndarray, k: int) -> np.ndarray:
    """Each sampled query's k nearest vectors by squared L2 distance (ids, nearest first), by
    brute force over the vectors a chunk at a time."""
    best_d = np.full((len(sample), k), np.inf, dtype=np.float32)
    best_i = np.zeros((len(sample), k), dtype=np.int64)
    rows = _rows_per_chunk(vectors.shape[1])
    for start in range(0, len(vectors), rows):
        x = np.asarray(vectors[start:start + rows])
        # |x - q|^2 = |x|^2 - 2 x.q + |q|^2; the last term orders nothing within a query
        dist = (x * x).sum(1)[None, :] - 2 * sample @ x.T
        both_d = np.concatenate([best_d, dist], axis=1)
        both_i = np.concatenate([best_i, np.arange(start, start + len(x))[None, :]
                                 .repeat(len(sample), 0)], axis=1)
        keep = np.argpartition(both_d, k - 1, axis=1)[:, :k]
        best_d = np.take_along_axis(both_d, keep, 1)
        best_i = np.take_along_axis(both_i, keep, 1)
    order = np.argsort(best_d, axis=1)
    return np.take_along_axis(best_i, order, 1)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """The share of the true k nearest neighbours found, over all sampled queries."""
    k = truth.shape[1]
    return float(np.mean([len(set(f[:k].tolist()) & set(t.tolist())) / k
                          for f, t in zip(found, truth)]))

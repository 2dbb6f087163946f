"""qual's KV store against MLPerf Storage v3.0's own NVMe tier, on the same request stream.

The reference's kv_cache_benchmark keeps each KV entry on the drive as one `.npy` file written
with `np.save`, flush and fsync, and reads it back with `np.load` after asking the kernel to drop
that file's cached pages (`posix_fadvise(DONTNEED)`), buffered; its "device time" is the time
around the save or the load. Here the same server loop (qual.workloads.kvcache.workload.serve:
the same users, conversations and batches for the same seed) runs once through that tier and
once through qual's store (O_DIRECT, one fdatasync a write batch), on the same folder, rounds
alternating. extra_info holds each side's tokens per second (wall clock and storage time), the
decode bytes each read, and how many of them the device itself read: qual's must be all of
them; the reference's tier says nothing about its own.

    pytest benchmarks/test_kvcache_vs_npy.py                      # on the RAM stand-in
    pytest benchmarks/test_kvcache_vs_npy.py --bench-target DIR   # on a drive
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from qual import engine, honesty
from qual.targets import Target
from qual.thresholds import family_table
from qual.workloads import kvcache
from qual.workloads.kvcache.spec import drive_bytes
from qual.workloads.kvcache.workload import serve


@dataclass(frozen=True)
class Moved:
    """A batch of entries through the .npy tier, as the engine's KvBatch reports one."""

    bytes: int
    latencies: np.ndarray
    starts: np.ndarray
    elapsed: float
    sync_s: float = 0.0


class NpyTier:
    """The reference's NVMe tier: one .npy file per entry (named by its place in the store)."""

    backend = "buffered .npy (np.save + fsync; fadvise DONTNEED + np.load)"

    def __init__(self, folder):
        self.folder = folder

    def _path(self, offset: int) -> str:
        return os.path.join(self.folder, f"{offset}.npy")

    def write(self, entries) -> Moved:
        lat, starts, t0 = [], [], time.perf_counter()
        for offset, buf in entries:
            t = time.perf_counter()
            starts.append(t - t0)
            with open(self._path(offset), "wb") as f:
                np.save(f, buf, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            lat.append(time.perf_counter() - t)
        return Moved(sum(len(b) for _, b in entries), np.array(lat), np.array(starts),
                     time.perf_counter() - t0)

    def read(self, entries) -> Moved:
        lat, starts, t0 = [], [], time.perf_counter()
        for offset, buf in entries:
            t = time.perf_counter()
            starts.append(t - t0)
            path = self._path(offset)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            buf[:] = np.load(path, allow_pickle=False)
            lat.append(time.perf_counter() - t)
        return Moved(sum(len(b) for _, b in entries), np.array(lat), np.array(starts),
                     time.perf_counter() - t0)


def _round(target: Target, table: dict, open_store) -> dict:
    """One run of the stream through a store; the device's counters around it."""
    before = target.device_stat()
    with open_store() as kv:
        r = serve(table, kv, seed=42)
    seen = honesty.between(before, target.device_stat())
    return {"tokens_per_s": r["tokens_per_s"], "storage_tokens_per_s": r["storage_tokens_per_s"],
            "decode_bytes": r["read"], "device_read_bytes": seen and seen["read_bytes"]}


@contextmanager
def npy_tier(folder):
    """The .npy tier in a fresh folder, removed afterwards."""
    os.makedirs(folder)
    try:
        yield NpyTier(folder)
    finally:
        shutil.rmtree(folder)


def test_kvcache_store_vs_npy(benchmark, bench_folder, bench_size, bench_rounds):
    """The same users' conversations (llama3.1-8b, no host-memory tier: every entry on the
    drive) through qual's store and through the reference's .npy tier."""
    users = 16 if bench_size >= 1 << 30 else 2
    table = family_table(kvcache.FAMILY, {"users": users, "requests": 4,
                                          "context_tokens": [64, 256], "turn_tokens": 32,
                                          "generation_tokens": 16, "block_size": "1 MiB",
                                          "cpu_mem": 0})
    target = Target(bench_folder)
    store = bench_folder / "qual-kv.bin"
    with open(store, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, drive_bytes(table))
    rounds = {"qual": [], "npy": []}

    def qual_round():
        rounds["qual"].append(_round(target, table, lambda: engine.KvStore(
            str(store), block_size=table["block_size"], queue_depth=table["queue_depth"])))

    def npy_round():
        rounds["npy"].append(_round(target, table, lambda: npy_tier(bench_folder / "npy-kv")))

    try:
        benchmark.pedantic(qual_round, setup=npy_round, rounds=bench_rounds, iterations=1)
    finally:
        store.unlink()
    med = {side: {k: statistics.median(r[k] or 0 for r in rs) for k in rs[0]}
           for side, rs in rounds.items()}
    share = {side: statistics.median(r["device_read_bytes"] / r["decode_bytes"] for r in rs)
             if rs[0]["device_read_bytes"] is not None else None for side, rs in rounds.items()}
    benchmark.extra_info.update({
        **{f"{side}_{k}": v for side, m in med.items() for k, v in m.items()},
        "qual_device_read_share": share["qual"], "npy_device_read_share": share["npy"],
        "tokens_per_s_ratio": statistics.median(
            q["tokens_per_s"] / n["tokens_per_s"] for q, n in zip(rounds["qual"], rounds["npy"])),
        "rounds": len(rounds["qual"])})
    assert med["qual"]["decode_bytes"] == med["npy"]["decode_bytes"]  # the same stream

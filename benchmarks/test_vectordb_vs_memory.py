"""DiskANN's search with its index on the drive, beside the same index held in memory and beside
the drive's own 4 KiB random reads at the same depth.

The vectordb family's run (qual.workloads.vectordb: the vectors written, the disk index built,
every query searched by `searchers` processes, each query's beam of O_DIRECT sector reads)
against, in the same round: DiskANN's in-memory index of the same vectors searched with the
same queries and search list (`build_memory_index`, `StaticMemoryIndex`, as many threads as
searchers: its recall must agree with the disk index's), and qual's engine reading 4 KiB at
random at depth searchers x beam width (the most sector reads the searchers can have in
flight) over a region as large as the index. extra_info holds the disk search's QPS and
sector reads a second, the in-memory QPS, both recalls, the engine's 4 KiB IOPS, and the share
of that capability the search reached.

    pytest benchmarks/test_vectordb_vs_memory.py                      # on the RAM stand-in
    pytest benchmarks/test_vectordb_vs_memory.py --bench-target DIR   # on a drive
"""

from __future__ import annotations

import shutil
import statistics
import time

import numpy as np
import pytest

from qual import honesty
from qual.targets import Target
from qual.thresholds import family_table
from qual.workloads import vectordb
from qual.workloads.vectordb import data, workload
from qual.workloads.vectordb.spec import index_bytes

diskannpy = pytest.importorskip("diskannpy")

SECTOR = 4096
L = 100  # the search list compared (recall about 1 here; the release's is 200)


def _memory_search(folder, table: dict, queries: np.ndarray, truth: np.ndarray) -> dict:
    """The same vectors as DiskANN's in-memory index, searched with the same queries."""
    index = folder / "memory-index"
    index.mkdir()
    try:
        vectors = np.asarray(data.read_vectors(folder / "vectors.bin"))
        diskannpy.build_memory_index(data=vectors, distance_metric="l2",
                                     index_directory=str(index),
                                     complexity=table["build_list"],
                                     graph_degree=table["graph_degree"],
                                     num_threads=table["searchers"], vector_dtype=np.float32)
        held = diskannpy.StaticMemoryIndex(index_directory=str(index),
                                           num_threads=table["searchers"],
                                           initial_search_complexity=L, distance_metric="l2",
                                           vector_dtype=np.float32,
                                           dimensions=table["dimensions"])
        started = time.perf_counter()
        found = held.batch_search(queries, table["k"], L, table["searchers"])
        wall = time.perf_counter() - started
        return {"qps": len(queries) / wall,
                "recall": data.recall(found.identifiers[:len(truth)], truth)}
    finally:
        shutil.rmtree(index)


def _random_reads(target: Target, depth: int, size: int, seconds: float) -> float:
    """The engine's 4 KiB random reads at `depth` over `size` bytes: IOPS, device-checked."""
    job = target.job(op="read", pattern="random", block_size=SECTOR, queue_depth=depth,
                     size=size, runtime=seconds)
    result, _ = honesty.run_checked(target, job)
    return result.iops


def test_disk_index_search_vs_memory_and_the_drive(benchmark, bench_folder, bench_size,
                                                   bench_rounds):
    # the default 1G: 100,000 vectors; a smoke run (16M) proves the benchmark works in seconds
    big, smoke = bench_size >= 1 << 30, bench_size < 256 << 20
    table = family_table(vectordb.FAMILY, {
        "vectors": 100_000 if big else 5_000 if smoke else 20_000, "dimensions": 128,
        "clusters": 128, "graph_degree": 32, "build_list": 50,
        "queries": 4000 if big else 200 if smoke else 1000,
        "recall_queries": 200, "search_lists": [L], "searchers": 4, "beam_width": 4,
        "timeout": "20 min"})
    target = Target(bench_folder)
    rounds: list[dict] = []
    depth = table["searchers"] * table["beam_width"]

    def one_round():
        r = workload.run(target, table)
        (s,) = r["searches"]
        rounds[-1].update(disk_qps=s["qps"], disk_recall=s["recall"],
                          sector_reads_per_s=s["read_bytes"] / SECTOR / s["wall_s"],
                          read_per_query=s["read_per_query"], build_s=r["build"]["seconds"])

    def peers():
        rounds.append({})
        folder = bench_folder / "vdb-peer"
        folder.mkdir()
        try:
            data.write_vectors(folder / "vectors.bin", table)
            queries = data.queries(table)
            truth = data.exact_neighbours(data.read_vectors(folder / "vectors.bin"),
                                          queries[:table["recall_queries"]], table["k"])
            mem = _memory_search(folder, table, queries, truth)
        finally:
            shutil.rmtree(folder)
        rounds[-1].update(memory_qps=mem["qps"], memory_recall=mem["recall"],
                          iops_4k=_random_reads(target, depth, index_bytes(table), 3.0))

    try:
        benchmark.pedantic(one_round, setup=peers, rounds=bench_rounds, iterations=1)
    finally:
        workload.remove(target)
        Target(bench_folder).cleanup()
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    benchmark.extra_info.update({
        **med, "depth": depth, "search_list": L, "rounds": len(rounds),
        "share_of_4k_iops": statistics.median(r["sector_reads_per_s"] / r["iops_4k"]
                                              for r in rounds),
        "disk_over_memory_qps": statistics.median(r["disk_qps"] / r["memory_qps"]
                                                  for r in rounds)})
    assert abs(med["disk_recall"] - med["memory_recall"]) <= 0.05  # one index, two homes

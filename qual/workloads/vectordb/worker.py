"""A process of the vector database's run, apart from qual's own: DiskANN prints to its
standard output, and its search holds Python's GIL, so a build runs here and each query in
flight is a searcher process of its own (docs/ARCHITECTURE.md §4: each dies with qual).

    python -m qual.workloads.vectordb.worker JOB.json

A build job builds the disk index and exits. A searcher opens the index (its PQ code into
memory), says `ready` on its control descriptor, then for each search list L it reads on its
standard input searches its share of the queries one at a time, timing each, and writes their
neighbours, latencies, the bytes this process read from storage (/proc/self/io: the
kernel's count of the reads it submitted) and its page-ins (major faults: code or data of a
mapped file read back in, counted there too, from whatever device holds it) to a file, then
says `done L`."""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import numpy as np

PREFIX = "ann"  # DiskANN's file names in the index folder: ann_disk.index, ann_pq_*.bin …


def read_bytes() -> int:
    """Bytes this process has had read from storage (the kernel's task I/O accounting)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def page_ins() -> int:
    """Major faults of this process: pages of a mapped file (its code, its libraries) read
    back from storage after the host took them away."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def build(job: dict) -> None:
    import diskannpy

    diskannpy.build_disk_index(
        data=job["data"], distance_metric="l2", index_directory=job["index"],
        complexity=job["build_list"], graph_degree=job["graph_degree"],
        search_memory_maximum=job["pq_budget_gb"],
        build_memory_maximum=job["build_memory"] / 2**30, num_threads=job["threads"],
        pq_disk_bytes=0, vector_dtype=np.float32, index_prefix=PREFIX)


def search(job: dict, control: int) -> None:
    import diskannpy

    # two threads' scratch though one query is in flight: DiskANN 0.7 loads the medoids through
    # a scratch of the pool and with a pool of one waits for it forever
    index = diskannpy.StaticDiskIndex(
        index_directory=job["index"], num_threads=2, num_nodes_to_cache=job["cache_nodes"],
        cache_mechanism=1 if job["cache_nodes"] else 0, distance_metric="l2",
        vector_dtype=np.float32, dimensions=job["dimensions"], index_prefix=PREFIX)
    queries = np.load(job["queries"])
    mine = np.arange(job["searcher"], len(queries), job["searchers"])
    k, beam = job["k"], job["beam_width"]
    os.write(control, b"ready\n")
    for line in sys.stdin:
        L = int(line)
        ids = np.empty((len(mine), k), dtype=np.int64)
        latency = np.empty(len(mine), dtype=np.int64)
        before, faults = read_bytes(), page_ins()
        for j, q in enumerate(mine):
            # a batch of one: diskannpy 0.7's single-query search() answers the kth
            # neighbour k times over (its result is copied from the wrong slot)
            started = time.perf_counter_ns()
            found = index.batch_search(queries[q:q + 1], k, L, 1, beam)
            latency[j] = time.perf_counter_ns() - started
            ids[j] = found.identifiers[0]
        read, faults = read_bytes() - before, page_ins() - faults
        np.savez(f"{job['out']}-L{L}.npz", queries=mine, ids=ids, latency_ns=latency,
                 read=np.int64(read), page_ins=np.int64(faults))
        os.write(control, f"done {L}\n".encode())


def main(argv: list[str]) -> int:
    job = json.loads(open(argv[1]).read())
    if job["kind"] == "build":
        build(job)
    else:
        search(job, job["control"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

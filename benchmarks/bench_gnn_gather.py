"""Feature gathering of the GIDS-style loader against the DGL-style mmap baseline, and the
GIDS loader's 4 KiB page reads against fio's 4 KiB random reads, on one feature store.

The store (a synthetic IGBH, tiny by default: 550 k nodes, 2.25 GB of features) is several
times larger than the host memory both loaders may use: the mmap baseline runs under a budget
equal to what the GIDS loader holds (its page cache plus its CPU buffer). Every run starts
cold: the store's pages are evicted and the loader is new. Both loaders gather the features of
the same sampled batches; throughput is feature bytes delivered per second of gathering.

The read-rate comparison runs the GIDS loader with coalescing off and no CPU buffer, so every
SSD request is one 4 KiB page, and divides its requests by the time reads were outstanding;
fio reads 4 KiB at random from the same file at the same depth, O_DIRECT, io_uring. Rounds
alternate which loader goes first; the table shows medians over rounds.

    python benchmarks/bench_gnn_gather.py [--target DIR] [--size tiny] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from peer import bench_folder
from qual.thresholds import family_table
from qual.workloads import gnn
from qual.workloads.gnn.graph import Graph
from qual.workloads.gnn.igbh import CLASSES
from qual.workloads.gnn.store import build
from qual.workloads.gnn.train import splits


def gather(name: str, table: dict, store, graph, labels, seeds: np.ndarray, seed: int) -> dict:
    """One cold pass of a loader over the batches of `seeds`: rows, gather seconds, counters."""
    store.drop_cache()
    loader = gnn.open_loader(name, table, store, graph, labels, fanouts=table["fanouts"],
                             batch_size=table["batch_size"], seed=seed)
    try:
        if name == "gids":
            loader.cache.stats(reset=True)
        rows, seconds = 0, 0.0
        for batch in loader.batches(seeds):
            rows += batch.sample.node_count
            seconds += batch.times["gather"]
        out = {"rows": rows, "gather_s": seconds, "bw": rows * store.row_bytes / seconds,
               "setup": loader.setup()}
        if name == "gids":
            out["cache"] = loader.cache.stats().as_dict()
        return out
    finally:
        loader.close()


def fio_randread(path: Path, size: int, depth: int, runtime: float) -> float:
    cmd = ["fio", "--name=bench", f"--filename={path}", "--rw=randread", "--bs=4k",
           f"--iodepth={depth}", f"--size={size}", f"--runtime={runtime}", "--time_based=1",
           "--direct=1", "--ioengine=io_uring", "--randrepeat=0", "--readonly",
           "--output-format=json"]
    doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return doc["jobs"][0]["read"]["iops"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=".qual/bench-gnn", help="a folder on the drive")
    ap.add_argument("--size", default="tiny", help="synthetic IGBH size (default tiny)")
    ap.add_argument("--scale", type=float, default=1.0, help="share of the size's nodes")
    ap.add_argument("--batches", type=int, default=40, help="mini-batches per pass")
    ap.add_argument("--cache-share", default="5 %", help="GIDS page cache, share of the store")
    ap.add_argument("--cpu-buffer-share", default="10 %", help="GIDS CPU buffer, share")
    ap.add_argument("--queue-depth", type=int, default=128)
    ap.add_argument("--fio-runtime", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the rounds here")
    args = ap.parse_args()
    ready = bench_folder(args.target)
    if ready is None:
        return 2
    folder, target = ready
    table = family_table(gnn.FAMILY, {"size": args.size, "scale": args.scale,
                                    "cache_share": args.cache_share,
                                    "cpu_buffer_share": args.cpu_buffer_share,
                                    "queue_depth": args.queue_depth, "memory_budget": "cgroup"})
    strict = {**table, "max_coalesce": 1, "cpu_buffer_share": 0.0}
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    t0 = time.perf_counter()
    dataset = gnn.dataset_of(target, table, progress=say)
    store = build(dataset, folder, page_size=table["page_size"])
    graph, labels = Graph.of(dataset), dataset.labels(CLASSES)
    size = store.rows * store.row_stride
    memory = gnn.feature_memory(table, store)  # the same for both loaders
    say(f"store: {store.rows} rows, {size / 1e9:.2f} GB; host memory for either loader "
        f"{memory / 1e6:.0f} MB; ready in {time.perf_counter() - t0:.0f} s")
    train_ids, _ = splits(dataset.counts["paper"])
    rounds = []
    for i in range(args.rounds):
        seeds = np.random.default_rng(i).permutation(train_ids)[:args.batches * table["batch_size"]]
        order = ("gids", "mmap") if i % 2 == 0 else ("mmap", "gids")
        row = {name: gather(name, table, store, graph, labels, seeds, i + 1) for name in order}
        row["gids_4k"] = gather("gids", strict, store, graph, labels, seeds, i + 1)
        row["fio_iops"] = fio_randread(store.path, size, args.queue_depth, args.fio_runtime)
        c = row["gids_4k"]["cache"]
        row["gids_4k_iops"] = c["reads"] / c["io_s"]
        rounds.append(row)
        say(f"round {i + 1}: gids {row['gids']['bw'] / 1e6:.0f} MB/s, mmap "
            f"{row['mmap']['bw'] / 1e6:.0f} MB/s, gids 4 KiB {row['gids_4k_iops']:.0f} reads/s, "
            f"fio 4k randread {row['fio_iops']:.0f} IOPS")

    med = lambda xs: statistics.median(xs)  # noqa: E731
    gids_bw = [r["gids"]["bw"] for r in rounds]
    mmap_bw = [r["mmap"]["bw"] for r in rounds]
    speed = [g / m for g, m in zip(gids_bw, mmap_bw)]
    rate = [r["gids_4k_iops"] / r["fio_iops"] for r in rounds]
    cache = rounds[-1]["gids"]["cache"]
    print(f"\nfeature gathering, cold, {args.batches} batches of {table['batch_size']} seeds, "
          f"fanouts {table['fanouts']}; store {size / 1e9:.2f} GB, host memory "
          f"{memory / 1e6:.0f} MB ({size / memory:.1f}x "
          f"smaller); {args.rounds} rounds (median, min-max)")
    print(f"  mmap budget: {rounds[-1]['mmap']['setup']['detail']}")
    print(f"  gids gather        {med(gids_bw) / 1e6:8.0f} MB/s  (hit rate {cache['hit_rate'] * 100:.0f} %, "
          f"{cache['reads']} reads, {cache['read_bytes'] / 1e6:.0f} MB from the SSD)")
    print(f"  mmap gather        {med(mmap_bw) / 1e6:8.0f} MB/s")
    print(f"  gids / mmap        {med(speed):8.2f}x  ({min(speed):.2f}-{max(speed):.2f})")
    print(f"  gids 4 KiB reads   {med(r['gids_4k_iops'] for r in rounds):8.0f} /s at depth {args.queue_depth}")
    print(f"  fio 4k randread    {med(r['fio_iops'] for r in rounds):8.0f} IOPS at depth {args.queue_depth}")
    print(f"  gids / fio         {med(rate):8.2f}   ({min(rate):.2f}-{max(rate):.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "speedup": speed,
                                               "read_rate": rate}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

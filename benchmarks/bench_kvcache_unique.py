"""Does stamping every 4 KiB cost the KV cache throughput? The same users' conversations served
through the engine's store twice a round, its writes unique in every 4 KiB (as a run writes
them) and from one repeated random buffer (as before), alternating which goes first, on one
folder. It prints each round's bytes written and read per second of storage time of both, the
device's bytes written against each side's, and the medians' ratio unique / repeated with
both spreads.

    python benchmarks/bench_kvcache_unique.py --target /mnt/ram/bench --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from qual import engine, honesty
from qual.targets import Target
from qual.thresholds import family_table
from qual.workloads import kvcache
from qual.workloads.kvcache.spec import drive_bytes
from qual.workloads.kvcache.workload import open_store, serve


def one(target: Target, store: Path, table: dict, unique: bool) -> dict:
    """One run of the stream; the device's counters around it."""
    with open(store, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, drive_bytes(table))
    before = target.device_stat()
    if unique:
        kv = open_store(str(store), table)
    else:
        kv = engine.KvStore(str(store), block_size=table["block_size"],
                            queue_depth=table["queue_depth"], backend=table["backend"])
    with kv:
        r = serve(table, kv, seed=7)
    seen = honesty.between(before, target.device_stat())
    store.unlink()
    return {"bw": (r["written"] + r["read"]) / r["storage_s"], "written": r["written"],
            "device_written": seen and seen["write_bytes"]}


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=".qual/bench", help="folder on the drive")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--users", type=int, default=6)
    args = ap.parse_args()
    folder = Path(args.target)
    folder.mkdir(parents=True, exist_ok=True)
    target = Target(folder)
    table = family_table(kvcache.FAMILY, {
        "users": args.users, "requests": 4, "context_tokens": [1024, 4096], "turn_tokens": 256,
        "generation_tokens": 64, "block_size": "1 MiB", "model": "llama3.1-8b"})
    sides: dict[str, list[dict]] = {"unique": [], "repeated": []}
    for i in range(args.rounds):
        order = ("unique", "repeated") if i % 2 == 0 else ("repeated", "unique")
        for side in order:
            got = one(target, folder / f"bench-{side}.bin", table, side == "unique")
            sides[side].append(got)
            print(f"round {i + 1} {side:8s} {got['bw'] / 2**30:6.2f} GiB/s  device/written "
                  f"{(got['device_written'] or 0) / got['written']:.3f}")
    for key in ("bw",):
        u = [r[key] for r in sides["unique"]]
        p = [r[key] for r in sides["repeated"]]
        print(f"bytes written and read per second of storage time: unique median {statistics.median(u) / 2**30:.2f} GiB/s (spread "
              f"{spread(u):.0%}), repeated {statistics.median(p) / 2**30:.2f} GiB/s (spread "
              f"{spread(p):.0%}); ratio unique / repeated "
              f"{statistics.median(u) / statistics.median(p):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

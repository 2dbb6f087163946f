"""qual's KV cache beside the release's own reference (MLPerf Storage v3.0
`kv_cache_benchmark/kv-cache.py`, a checkout the user supplies: nothing is downloaded), on one
folder, in alternating rounds: option 1's shape (llama3.1-8b, no memory tier, 16 concurrent
allocations, seed 42) shortened to the same duration and users on both. Each round prints both
tools' scored figures side by side under the release's names (storage and average throughput,
the storage tier's read and write bandwidth) and each tool's reported bytes against the
device's own counters; then the medians and both spreads.

    python benchmarks/bench_kvcache_vs_reference.py --reference ~/storage/kv_cache_benchmark \\
        --target /mnt/ram/bench --users 8 --duration 60 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from qual import honesty
from qual.targets import Target

GIB = 1 << 30
FIGURES = ("storage_throughput_tokens_per_sec", "avg_throughput_tokens_per_sec",
           "tier_storage_read_bandwidth_gbps", "tier_storage_write_bandwidth_gbps")


def counted(target: Target, run) -> tuple[dict, dict | None]:
    """run()'s figures, and what the device counted meanwhile."""
    before = target.device_stat()
    got = run()
    return got, honesty.between(before, target.device_stat())


def reference_round(script: Path, folder: Path, users: int, duration: int) -> dict:
    """One run of the reference: its summary's scored figures and its own byte counts."""
    cache, out = folder / "reference-cache", folder / "reference.json"
    cache.mkdir()
    try:
        subprocess.run([sys.executable, str(script), "--model", "llama3.1-8b",
                        "--num-users", str(users), "--duration", str(duration),
                        "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
                        "--max-concurrent-allocs", "16", "--generation-mode", "none",
                        "--cache-dir", str(cache), "--seed", "42", "--output", str(out)],
                       check=True, cwd=script.parent, stdout=subprocess.DEVNULL,
                       timeout=duration * 4 + 600)
        summary = json.loads(out.read_text())["summary"]
    finally:
        shutil.rmtree(cache)
        out.unlink(missing_ok=True)
    stats = summary["cache_stats"]
    return {**{k: summary[k] for k in FIGURES[:2]}, **{k: stats[k] for k in FIGURES[2:]},
            "read_bytes": stats["tier_storage_kv_bytes_read_gb"] * GIB,
            "write_bytes": stats["tier_storage_kv_bytes_written_gb"] * GIB}


def qual_round(folder: Path, users: int, duration: int) -> dict:
    """One run of qual on the reference's draw, the same shape."""
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "kvcache", "--target", str(folder),
                           "--draw", "reference", "--model", "llama3.1-8b", "--users",
                           str(users), "--duration", f"{duration}s", "--cpu-mem", "0",
                           "--allocations", "16", "--seed", "42", "--json", "-q"],
                          check=True, capture_output=True, text=True, timeout=duration * 4 + 600)
    doc = json.loads(proc.stdout)
    return {**doc["mlperf"], "read_bytes": doc["read"], "write_bytes": doc["written"]}


def spread(values: list[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", required=True, type=Path,
                    help="the reference's folder (mlcommons/storage kv_cache_benchmark/)")
    ap.add_argument("--target", default=".qual/bench", type=Path, help="folder on the drive")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--duration", type=int, default=60, help="seconds a run")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    script = args.reference / "kv-cache.py"
    if not script.is_file():
        print(f"no {script}: give --reference the reference's kv_cache_benchmark folder "
              "(github.com/mlcommons/storage, tag v3.0)", file=sys.stderr)
        return 2
    args.target.mkdir(parents=True, exist_ok=True)
    target = Target(args.target)
    sides: dict[str, list[dict]] = {"qual": [], "reference": []}
    for i in range(args.rounds):
        order = ("qual", "reference") if i % 2 == 0 else ("reference", "qual")
        for side in order:
            run = (lambda: qual_round(args.target, args.users, args.duration)) \
                if side == "qual" else \
                (lambda: reference_round(script, args.target, args.users, args.duration))
            got, seen = counted(target, run)
            sides[side].append(got)
            device = "no device counters" if seen is None else (
                f"reported/device reads {got['read_bytes'] / max(1, seen['read_bytes']):.4f}, "
                f"writes {got['write_bytes'] / max(1, seen['write_bytes']):.4f}")
            print(f"round {i + 1} {side:9s} " + "  ".join(f"{k} {got[k]:,.2f}" for k in FIGURES)
                  + f"  ({device})")
    for k in FIGURES:
        q = [r[k] for r in sides["qual"]]
        ref = [r[k] for r in sides["reference"]]
        ratio = statistics.median(q) / statistics.median(ref) if statistics.median(ref) else 0
        print(f"{k}: qual median {statistics.median(q):,.2f} (spread {spread(q):.0%}), "
              f"reference {statistics.median(ref):,.2f} (spread {spread(ref):.0%}), "
              f"qual / reference {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Is an MLPerf KV-cache option repeatable here? Its three trials (seed 42) beside fio's own
spread on the same stand-in in the same minutes.

Each round runs `qual kvcache --mlperf-option 1 --clients 2` (the reference's draw, shortened
with --duration and its templates' contexts and generations divided by --scale, which the
record lists among its departures) and fio's 256 KiB O_DIRECT writes on the same folder,
alternating. It prints every trial's aggregate storage tokens/s
and read bandwidth and every fio run's bandwidth, each side's spread ((max - min) / median)
and coefficient of variation: the option is as repeatable as the stand-in allows when its
spread is no wider than fio's.

    python benchmarks/bench_kvcache_trials.py --target /mnt/ram/bench --rounds 3 --scale 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench_io_vs_fio import run_fio
from peer import bench_folder

from qual.workloads.kvcache.spec import TEMPLATES


def scaled(scale: int) -> list[str]:
    """The templates' flags with contexts and generations divided by `scale`."""
    out = []
    for name, (ctx, gen, _) in TEMPLATES.items():
        for what, (lo, hi) in (("context", ctx), ("generation", gen)):
            out += [f"--templates-{name}-{what}", f"{max(1, lo // scale)},{hi // scale}"]
    return out


def option_trials(folder: Path, duration: str, scale: int) -> list[dict]:
    """One command: the option's three trials; each trial's aggregate figures."""
    cmd = [sys.executable, "-m", "qual.cli", "kvcache", "--target", str(folder),
           "--mlperf-option", "1", "--clients", "2", "--duration", duration,
           *(scaled(scale) if scale > 1 else []), "--block-size", "256K", "--json", "-q"]
    doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return [{"storage_tokens_per_s": sum(c["storage_tokens_per_s"] for c in t["clients"]),
             "read_bw": sum(c["read"] / c["wall_s"] for c in t["clients"])}
            for t in doc["trials"]]


def spread(values: list[float]) -> tuple[float, float]:
    """(max - min) / median and the coefficient of variation."""
    med = statistics.median(values)
    cv = statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0
    return (max(values) - min(values)) / med, cv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=".qual/bench", help="folder on the drive")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the option and of fio")
    ap.add_argument("--duration", default="10s", help="each trial's duration")
    ap.add_argument("--scale", type=int, default=16, help="divide the reference templates' "
                    "contexts and generations by this (1: as released)")
    args = ap.parse_args()
    found = bench_folder(args.target)
    if found is None:
        return 2
    folder, _ = found
    trials, fio = [], []
    for r in range(args.rounds):
        trials += option_trials(folder, args.duration, args.scale)
        fio.append(run_fio(folder / "fio.dat", "write", "256k", 16, "1G", 10.0)["bw"])
        (folder / "fio.dat").unlink()
        print(f"round {r + 1}: trials {[round(t['storage_tokens_per_s']) for t in trials[-3:]]}"
              f" tokens/s, fio {fio[-1] / 1e9:.2f} GB/s", flush=True)
    tok = [t["storage_tokens_per_s"] for t in trials]
    bw = [t["read_bw"] for t in trials]
    for name, values, unit in (("option 1 storage tokens/s", tok, 1.0),
                               ("option 1 read bandwidth GB/s", bw, 1e9),
                               ("fio 256K write GB/s", fio, 1e9)):
        s, cv = spread(values)
        print(f"{name}: median {statistics.median(values) / unit:.4g}, range "
              f"{min(values) / unit:.4g}..{max(values) / unit:.4g}, spread {s * 100:.1f} %, "
              f"CV {cv * 100:.1f} % ({len(values)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

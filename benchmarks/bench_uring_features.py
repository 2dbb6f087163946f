"""Each io_uring feature of the engine measured on its own against the one before, beside fio's
best flags, in CPU per I/O.

On a raw RAM-backed loop device (the host, not the flash, is the limit, as on a Gen5 drive),
each round runs fio (io_uring with --fixedbufs --registerfiles --iodepth_batch_submit=16)
and `qual io` (the same --iodepth_batch_submit=16) with the engine's features added one at
a time (QUAL_URING_WITHOUT names those left out): none, + the file registered, + the buffers
registered, + deferred task work on a single-issuer ring, + the ring's own descriptor
registered, + the ring's tick (a multishot timeout that bounds the waits, so that a wait needs
no timer of its own). The order alternates round by round. It prints each configuration's
median IOPS and CPU microseconds per I/O (qual's is its process's over the job's run, its interpreter's
start-up left out) and the median over rounds of its ratio to fio's.

`--target DIR` runs them on a file in DIR instead (written once with random blocks, removed
after): a drive whose completions arrive by interrupt, as an NVMe drive's do, where the loop
device's reads are done by a kernel worker whose placement the scheduler chooses.

    python benchmarks/bench_uring_features.py --rounds 3 --runtime 5
    python benchmarks/bench_uring_features.py --target /mnt/nvme0/bench --size 1G
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from bench_io_vs_fio import run_fio, run_qual
from peer import shared_file
from standin import raw_stand_in

CASES = [("randread", "4k", 1), ("randread", "4k", 64), ("read", "128k", 16)]
FEATURES = ["fixed_files", "fixed_buffers", "defer_taskrun", "registered_ring", "tick"]
STEPS = [("none", FEATURES + ["coop_taskrun"]), ("+ fixed files", FEATURES[1:] + ["coop_taskrun"]),
         ("+ fixed buffers", FEATURES[2:] + ["coop_taskrun"]),
         ("+ deferred task work", FEATURES[3:]), ("+ registered ring", FEATURES[4:]),
         ("+ tick", [])]
FIO_FEATURES = ("--fixedbufs", "--registerfiles")


def batch(depth: int) -> tuple[str, ...]:
    """Both tools: up to 16 I/Os per submission call (qual refuses a batch above the depth,
    which fio lowers to it)."""
    return (f"--iodepth_batch_submit={min(16, depth)}",)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every configuration")
    ap.add_argument("--runtime", type=float, default=5.0, help="seconds per run")
    ap.add_argument("--size", default="2G", help="the stand-in's (or the file's) size")
    ap.add_argument("--target", default=None,
                    help="a folder on a drive: a file there instead of the RAM stand-in")
    args = ap.parse_args()
    where = shared_file(args.target, args.size) if args.target else raw_stand_in(args.size)
    with where as dev:
        for rw, bs, depth in CASES:
            runs: dict[str, list[dict]] = {"fio": [], **{name: [] for name, _ in STEPS}}
            for r in range(args.rounds):
                order = ["fio"] + [name for name, _ in STEPS]
                for name in (order if r % 2 == 0 else order[::-1]):
                    if name == "fio":
                        got = run_fio(dev, rw, bs, depth, args.size, args.runtime,
                                      FIO_FEATURES + batch(depth))
                    else:
                        off = ",".join(dict(STEPS)[name])
                        got = run_qual(dev, rw, bs, depth, args.size, args.runtime,
                                       env={**os.environ, "QUAL_URING_WITHOUT": off},
                                       extra=batch(depth))
                    runs[name].append(got)
            print(f"\n{rw} {bs} qd{depth} ({args.rounds} rounds of {args.runtime:g} s, medians)")
            fio_cpu = [g["cpu_per_io"] for g in runs["fio"]]
            for name, got in runs.items():
                iops = statistics.median(g["iops"] for g in got)
                cpu = [g["cpu_per_io"] for g in got]
                ratio = statistics.median(c / f for c, f in zip(cpu, fio_cpu))
                print(f"  {name:<22} {iops / 1e3:8.1f} kIOPS  {statistics.median(cpu) * 1e6:6.2f}"
                      f" us/IO cpu  x{ratio:.2f} fio's", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

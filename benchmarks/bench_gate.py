"""Does the firmware gate know its noise? The A/A and planted-regression study of `qual compare`
on the RAM stand-in (root: a loop device over /dev/shm, ext4 on it).

- A/A: `--pairs` pairs of runs of the bandwidth suite on the same device, each compared with
  `qual compare --tolerance 10%`: how many say "regressed" (and how many "inconclusive").
- Planted: the same device made slower by the kernel's block throttle (cgroup v1
  blkio.throttle.read_bps_device and read_iops_device on the loop device, reads only) at 75 %
  of the reads' median over a first round of runs; each throttled run is compared with the
  unthrottled run just before it: how many call the read metrics regressed, and whether any
  write metric is called regressed.

Runs are taken in triples, back to back (A, B, then throttled T; A/A compares A with B, the
planted study B with T), so that the host's drift over the minutes of the study lands in
neither comparison.

    python benchmarks/bench_gate.py [--pairs 20] [--repeats 5] [--runtime 0.5s]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from standin import ram_stand_in

BLKIO = Path("/sys/fs/cgroup/blkio")
PROFILE = """[profile]
description = "gate study: 1M sequential reads and writes at depth 8"
tolerance = "10 %"
repeats = {repeats}

[bandwidth]
size = "256 MiB"
runtime = "{runtime}"
block_sizes = ["1M"]
depths = [8]
patterns = ["seq_read", "seq_write"]
""" + "".join(f"""
[[bandwidth.criteria]]
metric = "{metric}"
params = {{{{ bs = "1M", qd = 8 }}}}
min = 1
unit = "MiB/s"
source = "gate study: judged, so gated"
""" for metric in ("seq_read_bw", "seq_write_bw"))


def run(point: Path, profile: Path, results: Path, cgroup: Path | None = None) -> dict:
    """One run of the bandwidth cells (the scratch file kept between runs), in `cgroup`."""
    cmd = [sys.executable, "-m", "qual.cli", "run", "--target", str(point), "--profile",
           str(profile), "--results", str(results), "-k", "test_cell", "--qual-keep-scratch",
           "-q"]
    enter = (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup else None
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=enter)
    if proc.returncode != 0:
        sys.exit(f"a run failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads((results / "qual-run.json").read_text())


def compare(a: Path, b: Path) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "compare", str(a), str(b),
                           "--tolerance", "10%", "--json", "--all"], capture_output=True,
                          text=True)
    return {m["id"]: m["answer"] for m in json.loads(proc.stdout)["metrics"] if m["gated"]}


def median_of(record: dict, mid: str) -> float:
    return next(m["value"] for t in record["tests"] for m in t["measurements"]
                if m["id"] == mid and m["context"].get("repetition", [1, 1])[0] ==
                m["context"].get("repetition", [1, 1])[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runtime", default="0.5s")
    args = p.parse_args()
    if os.geteuid() != 0 or not (BLKIO / "blkio.throttle.read_bps_device").exists():
        sys.exit("needs root and cgroup v1's blkio controller")
    work = Path(tempfile.mkdtemp(prefix="qual-bench-gate-"))
    profile = work / "gate.toml"
    profile.write_text(PROFILE.format(repeats=args.repeats, runtime=args.runtime))
    cgroup = BLKIO / f"qual-gate-{os.getpid()}"
    with ram_stand_in(1 << 30) as (point, dev):
        read = "seq_read_bw[bs=1M,qd=8]"
        first = [run(point, profile, work / f"calibrate{i}") for i in range(5)]
        reads = sorted(median_of(r, read) for r in first)
        bps = int(0.75 * reads[len(reads) // 2])
        major, minor = os.major(os.stat(dev).st_rdev), os.minor(os.stat(dev).st_rdev)
        cgroup.mkdir()
        aa, planted = [], []
        try:
            (cgroup / "blkio.throttle.read_bps_device").write_text(f"{major}:{minor} {bps}")
            (cgroup / "blkio.throttle.read_iops_device").write_text(
                f"{major}:{minor} {max(1, bps >> 20)}")
            for i in range(args.pairs):
                a_, b_, t_ = (work / f"{k}{i}" for k in "abt")
                run(point, profile, a_)
                run(point, profile, b_)
                run(point, profile, t_, cgroup)
                aa.append(compare(a_ / "qual-run.json", b_ / "qual-run.json"))
                planted.append(compare(b_ / "qual-run.json", t_ / "qual-run.json"))
        finally:
            cgroup.rmdir()
    print(f"stand-in {dev}; {args.pairs} pairs; {args.repeats} repetitions a run; tolerance 10 %")
    print(f"reads' median {reads[len(reads) // 2] / 2**20:.0f} MiB/s (runs: "
          f"{reads[0] / 2**20:.0f}..{reads[-1] / 2**20:.0f}); throttle {bps / 2**20:.0f} MiB/s")
    said = Counter(a for c in aa for a in c.values())
    print(f"A/A: {sum('regressed' in c.values() for c in aa)} of {args.pairs} comparisons say "
          f"regressed, {sum('inconclusive' in c.values() for c in aa)} inconclusive; answers "
          f"per metric: {dict(said)}")
    hit = sum(all(c.get(m) == "regressed" for m in (read, "seq_read_iops[bs=1M,qd=8]"))
              for c in planted)
    hit_bw = sum(c.get(read) == "regressed" for c in planted)
    writes = sum(any(a == "regressed" for m, a in c.items() if "write" in m) for c in planted)
    print(f"planted (reads at 75 %): {hit_bw} of {args.pairs} call {read} regressed "
          f"({hit} with its IOPS too); {writes} call a write metric regressed")
    print(f"records and the profile: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Is the ci profile a pipeline gate on a busy host? `--runs` consecutive `qual run --profile ci`
(the default target, a scratch file on this machine's disk), each beside a CPU hog pinned to
one core (a busy-looping process, as another CI job would be). A pipeline gate may say PASS,
INCONCLUSIVE (exit 5) or INCOMPLETE (exit 6: on a target without device counters, as tmpfs);
it must never FAIL where a rerun would pass.

    python benchmarks/bench_busy_host.py [--runs 10] [--core 0] [--out DIR]

Prints one line per run (exit status, verdict, the judged figures nearest their bounds) and a
tally; exit status 1 when any run failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def nearest(record: dict, n: int = 3) -> list[str]:
    """The judged figures with the least margin: where a busy host would show first. Those
    exactly at their bound (no bad block where the bound is none, every checkpoint intact)
    are named apart: their margin is 0 in every run that passes."""
    verdicts = sorted((v for t in record["tests"] for v in t.get("verdicts", [])),
                      key=lambda v: v["margin"])
    at = [v["id"] for v in verdicts if v["margin"] == 0]
    graded = [f"{v['id']} {v['margin'] * 100:+.1f} %" for v in verdicts if v["margin"]][:n]
    return ([f"at their bound: {' '.join(at)}"] if at else []) + graded


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--core", type=int, default=0, help="the core the hog spins on")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs' results here")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="qual-busy-"))
    out.mkdir(parents=True, exist_ok=True)
    hog = subprocess.Popen(["taskset", "-c", str(args.core), sys.executable, "-c",
                            "while True: pass"])
    tally: Counter = Counter()
    try:
        for i in range(1, args.runs + 1):
            results = out / f"run{i}"
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "qual.cli", "run", "--profile", "ci",
                                   "--results", str(results), "-q"], cwd=out,
                                  capture_output=True, text=True, timeout=3600)
            try:
                record = json.loads((results / "qual-run.json").read_text())
                verdict = record["summary"]["verdict"]
                close = ", ".join(nearest(record))
            except (OSError, ValueError, KeyError):
                verdict, close = "NO RECORD", proc.stdout[-300:] + proc.stderr[-300:]
            tally[verdict] += 1
            print(f"run {i}: exit {proc.returncode}, {verdict}, {time.monotonic() - t0:.0f} s; "
                  f"least margin: {close}", flush=True)
    finally:
        hog.kill()
        hog.wait()
    print("tally: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
          + f" (results in {out})")
    return 1 if tally["FAIL"] or tally["NO RECORD"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""How good are the plan's estimates? `qual run --plan --json`, then the same `qual run`, on a
target (default: a folder in the current directory, the ci profile), `--runs` times in one
results folder: the first plan is the model alone, later ones are scaled by the run before. It
prints every test's estimate beside its measured duration, and the total.

A test's estimate counts as within ±50 % when |estimate - measured| <= 50 % of the measured
seconds, or 0.5 s for tests shorter than a second (pytest's own overhead is that coarse).

    python benchmarks/bench_plan.py [--target DIR] [--profile ci] [--runs 2] [qual run args]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TEST_SHARE, TOTAL_SHARE, SHORT_S = 0.50, 0.30, 0.5


def qual(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qual.cli", *args], cwd=cwd,
                          capture_output=True, text=True)


def within(estimate: float, measured: float) -> bool:
    return abs(estimate - measured) <= max(TEST_SHARE * measured, SHORT_S if measured < 1 else 0)


def one(cwd: Path, args: list[str]) -> dict:
    plan = qual("run", *args, "--plan", "--json", cwd=cwd)
    if plan.returncode != 0:
        sys.exit(f"the plan was refused:\n{plan.stdout}{plan.stderr}")
    planned = {t["id"]: t for t in json.loads(plan.stdout)["tests"]}
    basis = json.loads(plan.stdout)["basis"]
    run = qual("run", *args, cwd=cwd)
    record = json.loads((cwd / "qual-results" / "qual-run.json").read_text())
    rows = [(t["nodeid"], planned[t["nodeid"]]["estimate_s"], t["duration_s"])
            for t in record["tests"] if t["nodeid"] in planned]
    return {"rows": rows, "basis": basis, "exit": run.returncode}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=None)
    p.add_argument("--profile", default="ci")
    p.add_argument("--runs", type=int, default=2)
    args, extra = p.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="qual-bench-plan-", dir=".") as scratch:
        cwd = Path(scratch).resolve()
        run_args = ["--profile", args.profile, *extra]
        run_args += ["--target", args.target or str(cwd / "target")]
        (cwd / "target").mkdir()
        for i in range(args.runs):
            got = one(cwd, run_args)
            print(f"run {i + 1} (exit {got['exit']}), estimates from: {got['basis']}")
            print(f"{'test':<72} {'estimate':>9} {'measured':>9}  ratio")
            ok = 0
            for nodeid, est, took in got["rows"]:
                good = within(est, took)
                ok += good
                print(f"{nodeid[:72]:<72} {est:>8.2f}s {took:>8.2f}s  "
                      f"{est / took if took else float('nan'):5.2f} {'' if good else 'OUTSIDE'}")
            total_e = sum(e for _, e, _ in got["rows"])
            total_m = sum(m for _, _, m in got["rows"])
            near = abs(total_e - total_m) <= TOTAL_SHARE * total_m
            print(f"total: estimate {total_e:.1f} s, measured {total_m:.1f} s, ratio "
                  f"{total_e / total_m:.2f} ({'within' if near else 'OUTSIDE'} "
                  f"±{TOTAL_SHARE:.0%}); {ok}/{len(got['rows'])} tests within ±{TEST_SHARE:.0%}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""qual io against fio (io_uring engine) on the same file with the same parameters.

Each case runs fio and `qual io` alternately, several times, on one pre-written file with
O_DIRECT; the table shows the medians and the ratios qual / fio for bandwidth, IOPS and CPU
seconds per I/O. Both tools are timed for the same duration; writes end with a flush in both
(fio end_fsync=1, qual's fdatasync inside its timing).

    python benchmarks/bench_io_vs_fio.py [--target DIR] [--runs 5] [--runtime 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from peer import shared_file

CASES = [  # (rw, block size, depth)
    ("read", "1M", 32),
    ("write", "1M", 32),
    ("randread", "4k", 1),
    ("randread", "4k", 64),
    ("randread", "128k", 16),
]


def run_fio(path: Path, rw: str, bs: str, depth: int, size: str, runtime: float,
            extra: tuple[str, ...] = ()) -> dict:
    cmd = ["fio", "--name=bench", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={depth}", "--numjobs=1", f"--size={size}", f"--runtime={runtime}",
           "--time_based=1", "--direct=1", "--ioengine=io_uring", "--randrepeat=0",
           "--output-format=json", *extra]  # the engine's own options after --ioengine
    if "write" in rw:
        cmd.append("--end_fsync=1")
    doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    job = doc["jobs"][0]
    side = job["write" if "write" in rw else "read"]
    seconds = job["job_runtime"] / 1000
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * seconds
    return {"bw": side["bw_bytes"], "iops": side["iops"], "cpu_per_io": cpu / side["total_ios"]}


def run_qual(path: Path, rw: str, bs: str, depth: int, size: str, runtime: float,
             env: dict | None = None, extra: tuple[str, ...] = ()) -> dict:
    cmd = [sys.executable, "-m", "qual.cli", "io", f"--target={path}", f"--rw={rw}",
           f"--bs={bs}", f"--iodepth={depth}", "--numjobs=1", f"--size={size}",
           f"--runtime={runtime}", "--direct=1", "--engine=io_uring", "--json",
           "--keep", *extra]  # the file written once stays for the next runs of both tools
    doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                    env=env).stdout)
    if not Path(path).exists():  # fio would lay out a new file of its own for the next run
        raise RuntimeError(f"qual io removed {path}, which both tools must read")
    return {"bw": doc["bw_bytes"], "iops": doc["iops"], "cpu_per_io": doc["cpu_s"] / doc["ops"]}


def compare(path: Path, args) -> tuple[list, list]:
    """Every case, fio and qual alternately on the file: the table's rows and the JSON."""
    rows, results = [], []
    for rw, bs, depth in CASES:
        runs = {"fio": [], "qual": []}
        ratios = {"bw": [], "iops": [], "cpu_per_io": []}
        for i in range(args.runs):
            order = [("fio", run_fio), ("qual", run_qual)]
            if i % 2:
                order.reverse()  # alternate who goes first: drift hits both alike
            pair = {}
            for name, fn in order:
                pair[name] = fn(path, rw, bs, depth, args.size, args.runtime)
                runs[name].append(pair[name])
            for k in ratios:
                ratios[k].append(pair["qual"][k] / pair["fio"][k])
        med = {name: {k: statistics.median(r[k] for r in rs) for k in ratios}
               for name, rs in runs.items()}
        ratio = {k: statistics.median(v) for k, v in ratios.items()}
        results.append({"case": f"{rw} {bs} qd{depth}", "runs": args.runs, "median": med,
                        "ratio_median_of_pairs": ratio, "raw": runs})
        rows.append((f"{rw} {bs} qd{depth}", med["fio"]["bw"] / 2**20, med["qual"]["bw"] / 2**20,
                     ratio["bw"], ratio["iops"], med["fio"]["cpu_per_io"] * 1e6,
                     med["qual"]["cpu_per_io"] * 1e6, ratio["cpu_per_io"]))
        print(f"{rows[-1][0]:<20} done", file=sys.stderr)
    return rows, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=".qual/bench", help="folder for the test file")
    ap.add_argument("--size", default="1G", help="file size (both tools use the whole file)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each tool per case")
    ap.add_argument("--runtime", type=float, default=5.0, help="seconds per run")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    with shared_file(args.target, args.size) as path:
        rows, results = compare(path, args)
    print(f"\nqual io vs fio {subprocess.run(['fio', '--version'], capture_output=True, text=True).stdout.strip()}"
          f" (io_uring, O_DIRECT, {args.runtime:g} s x {args.runs} runs each, medians; ratio = "
          "median over paired runs of qual / fio)")
    head = ("case", "fio MiB/s", "qual MiB/s", "bw ratio", "iops ratio", "fio us/IO cpu",
            "qual us/IO cpu", "cpu/IO ratio")
    print("  ".join(f"{h:>14}" for h in head))
    for r in rows:
        print(f"{r[0]:>14}  " + "  ".join(f"{v:>14.3f}" for v in r[1:]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training-data ingestion of the simulated accelerators against fio, on the same sample files.

With no compute per step the accelerators read as fast as their loaders can: every read thread
of every accelerator reads whole sample files with O_DIRECT, `--iodepth` reads of `--bs` in
flight (io_uring). fio then reads the same files with the same shape: one job per read thread
(accelerators x read threads), each job its share of the files one after another
(file_service_type=sequential), the same block size and depth per job, O_DIRECT, io_uring. So
both see the same block size and the same total depth. Bandwidth is sample bytes per second of
wall time; CPU is user + system seconds per GiB read (qual: the whole process, Python threads
and all; fio: every job). Rounds alternate which goes first; the table shows medians.

    python benchmarks/bench_training.py [--target DIR] [--accelerators 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pairing import GIB, cpu_s
from peer import bench_folder
from qual.targets import Target
from qual.thresholds import family_table
from qual.workloads import training
from qual.workloads.training import dataset



def qual_round(target: Target, table: dict, seed: int) -> dict:
    cpu = cpu_s()
    result = training.run(target, table, seed=seed)
    cpu = cpu_s() - cpu
    (r,) = result.result["runs"]
    return {"bw": r["bw_bytes"], "bytes": r["bytes"], "backend": r["backend"],
            "cpu_per_gib": cpu / (r["bytes"] / GIB),
            "device_share": r["device_read_bytes"] / r["bytes"]
            if r["device_read_bytes"] is not None else None}


def fio_round(paths: list[str], jobs: int, bs: int, depth: int) -> dict:
    lines = ["[global]", "rw=read", f"bs={bs}", f"iodepth={depth}", "direct=1",
             "ioengine=io_uring", "file_service_type=sequential", "thread"]
    for j in range(jobs):
        lines += [f"[reader{j}]", "filename=" + ":".join(paths[j::jobs])]
    with tempfile.NamedTemporaryFile("w", suffix=".fio", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        doc = json.loads(subprocess.run(["fio", "--output-format=json", f.name], check=True,
                                        capture_output=True, text=True).stdout)
    finally:
        Path(f.name).unlink()
    done = sum(job["read"]["io_bytes"] for job in doc["jobs"])
    # fio counts whole milliseconds: a smoke run's tiny files can take less than one
    wall = max(1, max(job["job_runtime"] for job in doc["jobs"])) / 1000
    cpu = sum((job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
              for job in doc["jobs"])
    return {"bw": done / wall, "bytes": done, "cpu_per_gib": cpu / (done / GIB)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=".qual/bench-train", help="a folder on the drive")
    ap.add_argument("--workload", default="unet3d-h100")
    ap.add_argument("--files", type=int, default=224)
    ap.add_argument("--record-scale", type=float, default=0.2, help="of the record length")
    ap.add_argument("--accelerators", type=int, default=2)
    ap.add_argument("--read-threads", type=int, default=4)
    ap.add_argument("--bs", default="1M")
    ap.add_argument("--iodepth", type=int, default=8, help="reads in flight per read thread")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the sample files")
    ap.add_argument("--json", default=None, help="also write the rounds here")
    args = ap.parse_args()
    ready = bench_folder(args.target)
    if ready is None:
        return 2
    _, target = ready
    table = family_table(training.FAMILY, {
        "workload": args.workload, "files": args.files, "record_scale": args.record_scale,
        "computation_time": 0, "read_threads": args.read_threads,
        "accelerators": [args.accelerators], "epochs": [1], "block_size": args.bs,
        "queue_depth": args.iodepth, "calibrate": False})
    data = dataset.prepare(target, training.workload_of(table), seed=table["data_seed"])
    # fio reads the files one epoch reads: the steps of every accelerator, whole batches only
    plan = training.plan_of(data.workload, table, args.accelerators)
    files = -(-plan.steps * plan.batch // plan.samples_per_file) * args.accelerators
    paths = [data.path(i) for i in range(files)]
    jobs = args.accelerators * args.read_threads
    print(f"{data.files} files, {data.bytes / 1e9:.2f} GB; an epoch reads {files}; "
          f"{args.accelerators} accelerator(s) x {args.read_threads} read threads x depth "
          f"{args.iodepth}, {args.bs} reads; fio: {jobs} jobs x depth {args.iodepth}")
    rounds = []
    try:
        for i in range(args.rounds):
            runs = [("qual", lambda: qual_round(target, table, seed=i)),
                    ("fio", lambda: fio_round(paths, jobs, table["block_size"], args.iodepth))]
            row = {}
            for name, fn in runs[::-1] if i % 2 else runs:
                row[name] = fn()
            row["bw_ratio"] = row["qual"]["bw"] / row["fio"]["bw"]
            rounds.append(row)
            print(f"round {i + 1}: qual {row['qual']['bw'] / 2**20:.0f} MiB/s "
                  f"({row['qual']['cpu_per_gib']:.2f} CPU s/GiB), fio "
                  f"{row['fio']['bw'] / 2**20:.0f} MiB/s ({row['fio']['cpu_per_gib']:.2f} CPU "
                  f"s/GiB): {row['bw_ratio']:.2f}x")
    finally:
        if not args.keep:
            training.remove(target)

    def med(f):
        return statistics.median(f(r) for r in rounds)

    print(f"\nmedians of {len(rounds)} rounds ({rounds[0]['qual']['backend']}, O_DIRECT):")
    print(f"  ingestion bandwidth  qual {med(lambda r: r['qual']['bw']) / 2**20:8.0f} MiB/s   "
          f"fio {med(lambda r: r['fio']['bw']) / 2**20:8.0f} MiB/s   qual/fio "
          f"{med(lambda r: r['bw_ratio']):.2f}x")
    print(f"  CPU per GiB read     qual {med(lambda r: r['qual']['cpu_per_gib']):8.2f} s       "
          f"fio {med(lambda r: r['fio']['cpu_per_gib']):8.2f} s")
    share = [r["qual"]["device_share"] for r in rounds if r["qual"]["device_share"] is not None]
    if share:
        print(f"  device read / sample bytes (qual): {statistics.median(share):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

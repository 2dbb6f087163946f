"""Acceptance on a population, end to end on this host (docs/store.md, "Acceptance"): four
RAM-backed loop devices as four drives of one model (a loop device's serial is its backing
file), the `ci` qualification on each, stored in a PostgreSQL server of the machine's own and
imported into an SQLite store; one drive's reads throttled to 60 % of the first drive's read
bandwidth with the block-I/O cgroup (v1 blkio.throttle.read_bps_device). `qual accept` on both
stores: REJECT naming the throttled drive (and which figures); the throttle lifted and the
drive run again: ACCEPT. Needs root and cgroup v1's blkio controller.

    python benchmarks/accept_rig.py [--size 2G] [--share 0.6]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pgserver import PostgresServer  # noqa: E402 (the tests' own server)

from qual.units import parse_size  # noqa: E402

BLKIO = Path("/sys/fs/cgroup/blkio")
READ = "seq_read_bw[bs=1M,qd=16]"
MODEL = "Linux loop device"


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def qual(*args: str, cgroup: Path | None = None) -> subprocess.CompletedProcess:
    enter = (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup else None
    return subprocess.run([sys.executable, "-m", "qual.cli", *args], capture_output=True,
                          text=True, preexec_fn=enter, timeout=3600)


def qualify(dev: str, backing: Path, results: Path, store: str, cgroup=None) -> dict:
    t0 = time.monotonic()
    proc = qual("run", "--target", dev, "--profile", "ci", "--results", str(results), "--store",
                store, "--qual-allow-destructive", f"--qual-confirm-serial={backing}", "-q",
                cgroup=cgroup)
    record = json.loads((results / "qual-run.json").read_text())
    stored = [x for x in proc.stdout.splitlines() if "stored" in x]
    print(f"  {dev}: {record['summary']['verdict']} in {time.monotonic() - t0:.0f} s, "
          f"{READ} {median_of(record, READ) / 2**30:.2f} GiB/s; {stored[-1] if stored else ''}",
          file=sys.stderr)
    return record


def median_of(record: dict, mid: str) -> float:
    return next(m["value"] for t in record["tests"] for m in t["measurements"]
                if m["id"] == mid and m["context"].get("repetition", [1, 1])[0] ==
                m["context"].get("repetition", [1, 1])[1])


def accept(store: str) -> dict:
    proc = qual("accept", "--store", store, "--model", MODEL, "--firmware", "", "--profile",
                "ci", "--json")
    doc = json.loads(proc.stdout)
    return {"exit": proc.returncode, "answer": doc["answer"], "reasons": doc["reasons"],
            "outliers": {f["id"]: f["outliers"] for f in doc["figures"] if f["outliers"]}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="2G", help="each drive's size (ci needs 2 GiB)")
    p.add_argument("--share", type=float, default=0.6, help="the throttled drive's read share")
    args = p.parse_args()
    if os.geteuid() != 0 or not (BLKIO / "blkio.throttle.read_bps_device").exists():
        sys.exit("needs root and cgroup v1's blkio controller")
    work = Path(tempfile.mkdtemp(prefix="qual-accept-rig-"))
    shm = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="qual-accept-rig-"))
    drives = []
    server = PostgresServer(root="/dev/shm").start()
    cgroup = BLKIO / f"qual-accept-{os.getpid()}"
    out = {}
    try:
        pg, lite = server.new_database(), f"sqlite:///{work / 'store.sqlite'}"
        for i in range(4):
            backing = shm / f"drive{i}.img"
            with open(backing, "wb") as f:
                f.truncate(parse_size(args.size))
            drives.append((sh("losetup", "--find", "--show", "--direct-io=on", str(backing)),
                           backing))
        slow_dev, slow_backing = drives[3]
        print("the plain drives:", file=sys.stderr)
        first = [qualify(dev, b, work / f"d{i}", pg) for i, (dev, b) in enumerate(drives[:3])]
        bps = int(args.share * median_of(first[0], READ))
        st = os.stat(slow_dev)
        cgroup.mkdir()
        (cgroup / "blkio.throttle.read_bps_device").write_text(
            f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)} {bps}")
        print(f"the throttled drive (reads at {bps / 2**30:.2f} GiB/s):", file=sys.stderr)
        qualify(slow_dev, slow_backing, work / "d3", pg, cgroup)
        qual("store", "import", "--store", lite, str(work))
        out["throttled"] = {"throttle_bps": bps, "serial": str(slow_backing),
                            "postgresql": accept(pg), "sqlite": accept(lite)}
        print("the throttle lifted, the drive run again:", file=sys.stderr)
        qualify(slow_dev, slow_backing, work / "d3-again", pg)
        qual("store", "import", "--store", lite, str(work / "d3-again"))
        out["lifted"] = {"postgresql": accept(pg), "sqlite": accept(lite)}
    finally:
        if cgroup.exists():
            cgroup.rmdir()
        for dev, _ in drives:
            subprocess.run(["losetup", "--detach", dev], capture_output=True)
        shutil.rmtree(shm, ignore_errors=True)
        server.stop()
    print(json.dumps(out, indent=2))
    print(f"records: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

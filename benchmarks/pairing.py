"""Pairing qual with its peer round by round: each side's bytes, seconds and CPU seconds, the
device's own count of the bytes, and the summary a benchmark stores in extra_info."""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
from pathlib import Path

from qual import honesty
from qual.targets import Target

GIB = 1 << 30


def cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Pairing:
    def __init__(self, target: Target):
        self.target = target
        self.rounds: dict[str, list[dict]] = {"qual": [], "fio": []}

    def run(self, side: str, fn) -> None:
        """One round of `side`: fn() -> (bytes, seconds, cpu seconds)."""
        before = self.target.device_stat()
        moved, seconds, cpu = fn()
        seen = honesty.between(before, self.target.device_stat())
        self.rounds.setdefault(side, []).append({
            "bytes": moved, "seconds": seconds, "cpu_s": cpu,
            "device_share": None if seen is None else
            max(seen["read_bytes"], seen["write_bytes"]) / moved if moved else None})

    def timed(self, side: str, fn):
        """fn as pytest-benchmark's timed callable, recorded as one round of `side`."""
        return lambda: self.run(side, fn)

    def summary(self) -> dict:
        """Medians per side, and the median of the paired ratios qual / peer."""
        out = {}
        for side, rounds in self.rounds.items():
            if not rounds:
                continue
            out[f"{side}_bw_bytes"] = statistics.median(r["bytes"] / r["seconds"] for r in rounds)
            out[f"{side}_cpu_s_per_gib"] = statistics.median(r["cpu_s"] / r["bytes"] * GIB
                                                             for r in rounds)
            shares = [r["device_share"] for r in rounds if r["device_share"] is not None]
            out[f"{side}_device_share_min"] = min(shares) if shares else None
        bw, cpu = _ratios(self.rounds["qual"], self.rounds["fio"])
        if bw is not None:
            out.update(bw_ratio=bw, cpu_per_gib_ratio=cpu,
                       rounds=min(len(self.rounds["qual"]), len(self.rounds["fio"])))
        for other, rounds in self.rounds.items():  # a third tool: both measured against it
            if other in ("qual", "fio") or not rounds:
                continue
            for side in ("qual", "fio"):
                bw, cpu = _ratios(self.rounds[side], rounds)
                if bw is not None:
                    out[f"{side}_bw_ratio_vs_{other}"] = bw
                    out[f"{side}_cpu_per_gib_ratio_vs_{other}"] = cpu
        return out


def _ratios(mine: list[dict], theirs: list[dict]) -> tuple[float | None, float | None]:
    """Medians over paired rounds of bandwidth mine / theirs and of CPU seconds per byte."""
    pairs = list(zip(mine, theirs))
    if not pairs:
        return None, None
    bw = lambda r: r["bytes"] / r["seconds"]  # noqa: E731
    per_byte = lambda r: r["cpu_s"] / r["bytes"]  # noqa: E731
    cpu = [per_byte(a) / per_byte(b) for a, b in pairs
           if b["cpu_s"] > 0]  # a run too short for a tool to count its CPU has none
    return (statistics.median(bw(a) / bw(b) for a, b in pairs),
            statistics.median(cpu) if cpu else None)


def fio(path: Path, rw: str, bs: int, depth: int, *, size: int, runtime: float | None = None,
        rwmixread: int | None = None, verify: bool = False):
    """fio with io_uring and O_DIRECT: (bytes, seconds, CPU seconds), reads and writes together.
    A job that writes (write, randwrite, randrw with rwmixread) syncs at the end (end_fsync,
    inside fio's time); a pure write lays down a fresh, preallocated file. With verify, every
    block carries a CRC32C (--verify=crc32c): a write stamps it, a read checks it."""
    cmd = ["fio", "--name=bench", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={depth}", f"--size={size}", "--direct=1", "--ioengine=io_uring",
           "--randrepeat=0", "--output-format=json"]
    if verify:
        cmd += ["--verify=crc32c", "--verify_state_save=0",  # no state file in the cwd
                "--do_verify=0" if "write" in rw else "--verify_fatal=1"]
    if runtime:
        cmd += [f"--runtime={runtime}", "--time_based=1"]
    if rwmixread is not None:
        cmd += [f"--rwmixread={rwmixread}", "--end_fsync=1"]
    elif "write" in rw:
        cmd += ["--fallocate=native", "--end_fsync=1"]
    job = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    job = job["jobs"][0]
    sides = [job[d] for d in ("read", "write") if job[d]["io_bytes"]]
    seconds = max((d["io_bytes"] / d["bw_bytes"] for d in sides if d["bw_bytes"]),
                  default=job["job_runtime"] / 1e3)
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1e3
    return sum(d["io_bytes"] for d in sides), seconds, cpu

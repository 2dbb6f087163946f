"""The native checkpoint engine against torch.save / torch.load and against fio, on one target.

Each round writes one checkpoint with the native engine and restores it (O_DIRECT, CRC32C,
fdatasync before the clock stops), and times torch.save (+ fsync) and torch.load (cold cache:
the file's pages are evicted first) of the same tensors, in the same process layout. fio then
writes a fresh, preallocated file of the same size with 1 MiB sequential writes at depth 32
(end_fsync, as the checkpoint syncs) and reads it back with O_DIRECT. Rounds alternate which
goes first; the table shows medians over rounds of each ratio.

    python benchmarks/bench_checkpoint.py [--target DIR] [--size 2G] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from pairing import fio
from peer import bench_folder
from qual.targets import Target
from qual.thresholds import family_table
from qual.units import parse_size
from qual.workloads import checkpoint
from qual.workloads.checkpoint.plan import MODELS, RECIPES


def native(target: Target, size: int, seed: int) -> dict:
    """One checkpoint of `size` bytes by one rank, restored, with torch on the same tensors."""
    params = MODELS["llama3.1-8b"].parameters() * RECIPES["mixed-adam"].bytes_per_param()
    table = family_table(checkpoint.FAMILY, {
        "model": "llama3.1-8b", "recipe": "mixed-adam", "scale": size / params, "passes": 1,
        "per_pass": 1, "retention": 1, "restore": True, "baseline": True,
        "baseline_bytes": 2 * size, "pool": 2 * size, "chunk_size": "8 MiB", "queue_depth": 8})
    r = checkpoint.run(target, table, seed=seed).result
    c, rs, t = r["checkpoints"][0], r["restore"], r["torch"]
    assert rs["intact"] and t["round_trip_equal"], "a round trip changed the data"
    cold = t["load_device"]["read_bytes"] / t["file_bytes"] if t["load_device"] else None
    restored = rs["device"]["read_bytes"] / rs["bytes"] if rs["device"] else None
    return {"bytes": c["bytes"], "write_bw": c["bytes"] / c["seconds"],
            "restore_bw": rs["bytes"] / rs["seconds"], "torch_save_bw": t["bytes"] / t["save_s"],
            "torch_load_bw": t["bytes"] / t["load_s"], "torch_load_device_share": cold,
            "restore_device_share": restored}


def fio_pair(folder: Path, size: int) -> dict:
    """fio's 1M write of a fresh, preallocated file (end_fsync) and its O_DIRECT read back."""
    path = folder / "fio-bench.bin"
    path.unlink(missing_ok=True)
    out = {}
    for rw in ("write", "read"):
        moved, seconds, _ = fio(path, rw, 1 << 20, 32, size=size)
        out[f"fio_{rw}_bw"] = moved / seconds
    path.unlink()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=".qual/bench-ckpt", help="a folder on the drive")
    ap.add_argument("--size", default="2G", help="bytes per checkpoint (default 2G)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the rounds here")
    args = ap.parse_args()
    ready = bench_folder(args.target)
    if ready is None:
        return 2
    folder, target = ready
    size = parse_size(args.size)
    rounds = []
    try:
        for i in range(args.rounds):
            if i % 2:
                row = {**fio_pair(folder, size), **native(target, size, i + 1)}
            else:
                row = {**native(target, size, i + 1), **fio_pair(folder, size)}
            rounds.append(row)
            print(f"round {i + 1}: " + ", ".join(f"{k} {v / 2**20:.0f} MiB/s" for k, v in row.items()
                                                 if k.endswith("_bw")), file=sys.stderr)
    finally:
        checkpoint.remove(target)
    ratios = {
        "write / torch.save+fsync": [r["write_bw"] / r["torch_save_bw"] for r in rounds],
        "write / fio 1M seq write": [r["write_bw"] / r["fio_write_bw"] for r in rounds],
        "restore / torch.load (cold)": [r["restore_bw"] / r["torch_load_bw"] for r in rounds],
        "restore / fio 1M seq read": [r["restore_bw"] / r["fio_read_bw"] for r in rounds],
    }
    print(f"\nnative checkpoint vs peers, {size / 2**30:.2f} GiB per checkpoint, one rank, "
          f"{args.rounds} rounds (median, min-max over rounds)")
    for k in ("write_bw", "torch_save_bw", "fio_write_bw", "restore_bw", "torch_load_bw",
              "fio_read_bw"):
        print(f"  {k:<16} {statistics.median(r[k] for r in rounds) / 2**20:8.0f} MiB/s")
    for name, values in ratios.items():
        print(f"  {name:<30} {statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})")
    for key, what in (("restore_device_share", "native restore"),
                      ("torch_load_device_share", "torch.load")):
        shares = [r[key] for r in rounds if r[key] is not None]
        if shares:  # proof that the reads came from the device, not the page cache
            print(f"  {what} read from the device: {min(shares) * 100:.0f} % of its bytes or more")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

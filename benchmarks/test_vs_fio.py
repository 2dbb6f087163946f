"""qual's engine against fio on the same target, as pytest-benchmark tests.

Each test times qual's operation (pytest-benchmark's statistics, so --benchmark-autosave and
--benchmark-compare-fail gate qual's own speed across commits) and runs fio's equivalent in the
round's set-up, so that every qual round sits between two of fio's. extra_info holds the
median ratio qual / fio, CPU seconds per GiB of each, and the share of each tool's bytes the
block device counted (proof that neither was served by a cache).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from qual import engine
from qual.targets import Target

from pairing import Pairing, cpu_s, fio


MIX = 70  # a mixed job's read share, as in the and PTS's 70/30


def _io(target: Target, rw: str, bs: int, depth: int, size: int, runtime: float):
    op, pattern = {"read": ("read", "sequential"), "randread": ("read", "random"),
                   "randrw": ("mixed", "random")}[rw]
    job = target.prepare(target.job(op=op, pattern=pattern, block_size=bs, queue_depth=depth,
                                    size=size, runtime=runtime, rwmixread=MIX))

    def run():
        r = engine.run_job(job)
        return r.bytes, r.elapsed, r.cpu
    return run


@pytest.mark.parametrize("rw, bs, depth", [("randread", 4096, 64), ("read", 1 << 20, 32),
                                           ("randrw", 4096, 64)])
def test_io(benchmark, bench_folder, bench_size, bench_rounds, rw, bs, depth):
    """`qual io`'s engine against fio (io_uring, O_DIRECT) on the same pre-written file; the
    mixed job 70/30 (fio's --rw=randrw --rwmixread=70), both syncing at the end."""
    target = Target(bench_folder)
    target.ensure_data(bench_size)
    runtime = 2.0 if bench_rounds > 1 else 0.2
    pair = Pairing(target)
    qual_round = pair.timed("qual", _io(target, rw, bs, depth, bench_size, runtime))
    benchmark.pedantic(qual_round, rounds=bench_rounds, iterations=1, setup=lambda: pair.run(
        "fio", lambda: fio(target.path, rw, bs, depth, size=bench_size, runtime=runtime,
                           rwmixread=MIX if rw == "randrw" else None)))
    benchmark.extra_info.update(pair.summary())
    target.cleanup()


@pytest.fixture(scope="module")
def tensors(bench_size):
    """A checkpoint's bytes: incompressible, in one page-aligned buffer (as a trainer's pinned
    state is), so that qual writes and restores them with no staging copy."""
    out = engine.aligned_empty(bench_size)
    engine.fill_random(out, 7)
    return out


def test_checkpoint_write(benchmark, bench_folder, bench_size, bench_rounds, tensors):
    """A checkpoint file (8 MiB chunks, CRC32C each, fdatasync inside the clock) against fio's
    1M writes of a fresh, preallocated file of the same size with end_fsync."""
    path, peer = bench_folder / "qual-ckpt.bin", bench_folder / "fio-ckpt.bin"
    pair = Pairing(Target(bench_folder))

    def write():
        _, r = engine.write_checkpoint_file(str(path), [(0, tensors)], len(tensors))
        assert r.zero_copy_bytes == r.bytes
        return r.bytes, r.elapsed, r.cpu_user + r.cpu_sys

    def between():
        path.unlink(missing_ok=True)
        peer.unlink(missing_ok=True)
        pair.run("fio", lambda: fio(peer, "write", 1 << 20, 32, size=len(tensors)))
        peer.unlink()

    benchmark.pedantic(pair.timed("qual", write), setup=between, rounds=bench_rounds,
                       iterations=1)
    benchmark.extra_info.update(pair.summary())
    path.unlink(missing_ok=True)


def test_checkpoint_restore(benchmark, bench_folder, bench_size, bench_rounds, tensors):
    """Reading a checkpoint file back (CRC32C of every chunk checked, into the destination)
    against fio's 1M O_DIRECT reads of a file of the same size; and, as "fio_verify", fio's
    same reads checking a CRC32C of every block (--verify=crc32c), the like-for-like CPU cost
    of a verified read."""
    path, peer, stamped = (bench_folder / n for n in ("qual-ckpt.bin", "fio-ckpt.bin",
                                                      "fio-verify.bin"))
    path.unlink(missing_ok=True)
    crcs, _ = engine.write_checkpoint_file(str(path), [(0, tensors)], len(tensors))
    fio(peer, "write", 1 << 20, 32, size=len(tensors))
    fio(stamped, "write", 1 << 20, 32, size=len(tensors), verify=True)
    into = engine.aligned_empty(len(tensors))
    into.fill(0)
    pair = Pairing(Target(bench_folder))

    def restore():
        r = engine.read_checkpoint_file(str(path), [(0, into)], len(tensors), crcs)
        return r.bytes, r.elapsed, r.cpu_user + r.cpu_sys

    def between():
        pair.run("fio", lambda: fio(peer, "read", 1 << 20, 32, size=len(tensors)))
        pair.run("fio_verify", lambda: fio(stamped, "read", 1 << 20, 32, size=len(tensors),
                                           verify=True))

    benchmark.pedantic(pair.timed("qual", restore), rounds=bench_rounds, iterations=1,
                       setup=between)
    assert np.array_equal(into, tensors)
    benchmark.extra_info.update(pair.summary())
    for p in (path, peer, stamped):
        p.unlink()


def test_training_reader(benchmark, bench_folder, bench_size, bench_rounds):
    """The simulated accelerators at zero compute (2 accelerators x 4 read threads, 1 MiB reads,
    depth 8 each) against fio reading the same files with the same shape: one job per read
    thread, its share of the files one after another, the same block size and total depth."""
    from bench_training import fio_round, qual_round
    from pairing import GIB
    from qual.thresholds import family_table
    from qual.workloads import training
    from qual.workloads.training import dataset

    target, accelerators, threads, depth = Target(bench_folder), 2, 4, 8
    files = 64 if bench_size >= 1 << 30 else 32  # a smoke run: 32, two steps each
    record = training.configs.WORKLOADS["unet3d-h100"].record_length
    bs = 1 << 20 if bench_size // files >= 4 << 20 else 64 << 10  # several blocks a file
    table = family_table(training.FAMILY, {
        "workload": "unet3d-h100", "files": files, "record_scale": bench_size / files / record,
        "computation_time": 0, "read_threads": threads, "accelerators": [accelerators],
        "epochs": [1], "block_size": bs, "queue_depth": depth, "calibrate": False})
    data = dataset.prepare(target, training.workload_of(table), seed=table["data_seed"])
    plan = training.plan_of(data.workload, table, accelerators)
    read = -(-plan.steps * plan.batch // plan.samples_per_file) * accelerators  # one epoch's
    paths = [data.path(i) for i in range(read)]
    pair = Pairing(target)

    def side(r: dict):
        return r["bytes"], r["bytes"] / r["bw"], r["cpu_per_gib"] * r["bytes"] / GIB

    try:
        benchmark.pedantic(
            pair.timed("qual", lambda: side(qual_round(target, table, seed=1))),
            rounds=bench_rounds, iterations=1, setup=lambda: pair.run(
                "fio", lambda: side(fio_round(paths, accelerators * threads, bs, depth))))
        benchmark.extra_info.update(pair.summary())
    finally:
        training.remove(target)


def test_gids_gather(benchmark, bench_folder, bench_size, bench_rounds):
    """GIDS's page cache gathering 4 KiB rows at random (nearly every one a miss: a cache of 16,384
    pages over the whole store, no coalescing, depth 64) against fio's 4K random reads at
    depth 64 of the same file. qual's clock covers the whole call, reads and the copies of
    every row into the batch (which fio does not make)."""
    path = bench_folder / "qual-store.bin"
    rows = bench_size // 4096
    with open(path, "wb") as f:
        block = engine.aligned_empty(1 << 20)
        engine.fill_random(block, 3)
        for _ in range(bench_size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())  # settled: no writeback under the reads
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    cache = engine.FeatureCache(str(path), rows=rows, row_bytes=4096, row_stride=4096,
                                capacity_pages=16384, queue_depth=64, max_coalesce=1)
    want = np.random.default_rng(5).integers(0, rows, min(rows, 1 << 18))
    out = np.empty((len(want), 1024), np.float32)
    out.fill(0)  # faulted in once, before the clock, as a trainer's GPU buffer is
    pair = Pairing(Target(bench_folder))

    def gather():  # the whole call: scan, reads, copies
        cache.stats(reset=True)
        cpu, t0 = cpu_s(), time.perf_counter()
        cache.gather(want, out)
        seconds = time.perf_counter() - t0
        return cache.stats().read_bytes, seconds, cpu_s() - cpu

    runtime = 2.0 if bench_rounds > 1 else 0.2
    try:
        benchmark.pedantic(pair.timed("qual", gather), rounds=bench_rounds, iterations=1,
                           setup=lambda: pair.run("fio", lambda: fio(
                               path, "randread", 4096, 64, size=bench_size, runtime=runtime)))
        benchmark.extra_info.update(pair.summary())
    finally:
        cache.close()
        path.unlink()


def test_checkpoint_write_vs_torch_save(benchmark, bench_folder, bench_size, bench_rounds,
                                        tensors):
    """The checkpoint write against torch.save + fsync of the same bytes, with fio's 1M write
    beside it: where fio / torch.save is about qual / torch.save, the device, not qual, is the
    limit (a slow disk); where qual is far above it, qual's engine is what gains."""
    import torch

    path, peer, saved = (bench_folder / n for n in ("qual-ckpt.bin", "fio-ckpt.bin", "torch.pt"))
    state = {"weights": torch.from_numpy(tensors)}
    pair = Pairing(Target(bench_folder))

    def write():
        _, r = engine.write_checkpoint_file(str(path), [(0, tensors)], len(tensors))
        return r.bytes, r.elapsed, r.cpu_user + r.cpu_sys

    def torch_save():
        cpu, t0 = cpu_s(), time.perf_counter()
        with open(saved, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        return len(tensors), time.perf_counter() - t0, cpu_s() - cpu

    def between():
        for p in (path, peer, saved):
            p.unlink(missing_ok=True)
        pair.run("fio", lambda: fio(peer, "write", 1 << 20, 32, size=len(tensors)))
        pair.run("torch", torch_save)
        peer.unlink()
        saved.unlink()

    benchmark.pedantic(pair.timed("qual", write), setup=between, rounds=bench_rounds,
                       iterations=1)
    benchmark.extra_info.update(pair.summary())
    path.unlink(missing_ok=True)

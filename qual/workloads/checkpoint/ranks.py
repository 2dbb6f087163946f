"""One checkpoint rank as a process: joins its ranks' group (qual.workloads.checkpoint.group),
writes its share of every checkpoint from a common barrier, restores and verifies it, and
times torch.save and torch.load of the same tensors; rank 0 commits each checkpoint and writes
the results.

Started by torchrun, or by the workload's launcher through `local_ranks`: one process that
forks each local rank from itself, the ranks meeting through pipes it made (no port, no torch:
eight ranks importing torch each took 8 x 1.7 s of CPU, and one import 1.6 s of a 4 s ci
checkpoint run). A rank reads RANK and WORLD_SIZE as torchrun sets them; torchrun's ranks meet
in a gloo group at its MASTER_ADDR:MASTER_PORT.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from qual import engine, honesty, watchdog
from qual.errors import DataMismatch, QualError
from qual.targets import device_stat
from qual.targets.scratch import drop_cache
from qual.workloads.checkpoint.group import ForkedGroup, TorchGroup
from qual.workloads.checkpoint.plan import RankPlan, plan_from
from qual.workloads.checkpoint.store import (CheckpointStore, IncompleteCheckpoint, load,
                                             rank_file)

TENSOR_ALIGN = 64  # every tensor starts on a 64-byte boundary in its file
PAGE = 4096  # the pool is page-aligned; a tensor congruent with its file offset copies nothing


def file_layout(rank: RankPlan, align: int) -> tuple[list[int], int]:
    """Offset of every tensor in the rank's file, and the file's size (a multiple of align)."""
    offsets, end = [], 0
    for t in rank.tensors:
        end = -(-end // TENSOR_ALIGN) * TENSOR_ALIGN
        offsets.append(end)
        end += t.nbytes
    return offsets, max(align, -(-end // align) * align)


def pool_positions(rank: RankPlan, offsets: list[int], pool_bytes: int) -> list[int]:
    """Where each tensor's bytes live in a rank's pool of random data. When the rank's state
    is larger than the pool, tensors share pool bytes (the data repeats with that period)."""
    positions = []
    for t, off in zip(rank.tensors, offsets):
        room = pool_bytes - t.nbytes + 1
        if off + t.nbytes <= pool_bytes:
            positions.append(off)
            continue
        # congruent with the file offset modulo the page, so that its chunks move with no
        # copy from (the page-aligned) pool, when the room allows
        pos = off % room // PAGE * PAGE + off % PAGE
        pos = pos if pos < room else pos - PAGE
        positions.append(pos if pos >= 0 else off % room)
    return positions


@dataclass
class RankJob:
    """What every rank process of one checkpoint run is told (job.json, written by the
    launcher, read by each rank; torchrun's ranks get it in-process): the plan (its summary,
    `plan_from`), how to write and read, what to run and where the results go. `root`: the
    store the checkpoints go into (None where a set is read back from wherever it lies,
    `restore_path`); `device`: "major:minor" of the target's block device where every rank runs
    on this host (its counters are then the checkpoint's), else None; `progress`: the file rank
    0's progress lines go to."""

    plan: dict
    chunk_size: int
    queue_depth: int
    align: int
    backend: str
    pool: int
    seed: int | None
    timeout_s: float
    result: str
    errors: str
    root: str | None = None
    restore_path: str | None = None
    passes: int = 0
    per_pass: int = 0
    retention: int = 0
    procedure: str = "passes"
    runs: int = 0
    restore: bool = False
    baseline: bool = False
    baseline_bytes: int = 0
    direct: bool = True
    faults: list[dict] = field(default_factory=list)  # tests: engine.Fault fields, every rank
    device: str | None = None
    progress: str | None = None

    @property
    def times_torch(self) -> bool:
        """Whether the ranks time torch.save and torch.load (the passes procedure's baseline)."""
        return self.baseline and self.procedure != "mlperf-v2" and self.root is not None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RankJob":
        return cls(**json.loads(text))


class Rank:
    def __init__(self, job: RankJob, rank: int, world: int, group):
        self.group = group  # ForkedGroup or TorchGroup: barrier, gather, broadcast
        self.job, self.rank, self.world = job, rank, world
        self.plan = plan_from(job.plan)
        if world > len(self.plan.ranks):
            raise QualError(errno.EINVAL, f"{world} processes for a {len(self.plan.ranks)}-rank layout")
        self.me = self.plan.ranks[rank]
        self.offsets, self.file_size = file_layout(self.me, job.align)
        self.image = max((off + t.nbytes for t, off in zip(self.me.tensors, self.offsets)),
                         default=1)
        largest = max((t.nbytes for t in self.me.tensors), default=0)
        self.pool_bytes = max(min(self.image, job.pool), largest, 1)
        self.positions = pool_positions(self.me, self.offsets, self.pool_bytes)
        self.src = engine.aligned_empty(self.pool_bytes)
        # a set read back by a later run regenerates the bytes from the seed its manifest holds
        # (none in a manifest from before it did: then only the CRCs verify it)
        self.compare = job.seed is not None
        engine.fill_random(self.src, (job.seed or 0) * 1_000_003 + rank)
        self.spans = [(off, self.src[pos:pos + t.nbytes])
                      for t, off, pos in zip(self.me.tensors, self.offsets, self.positions)]
        # no store when a set is read back from wherever it lies (`restore_path`)
        self.store = CheckpointStore(job.root) if job.root else None
        self.dev = job.device  # "major:minor" of the target's block device, or None

    # ---- helpers

    def io(self) -> dict:
        j = self.job
        return {"chunk_size": j.chunk_size, "queue_depth": j.queue_depth, "align": j.align,
                "backend": j.backend, "direct": j.direct,
                "faults": tuple(engine.Fault(**f) for f in j.faults)}

    def device(self):
        if self.dev is None or self.rank != 0:
            return None
        major, minor = map(int, self.dev.split(":"))
        return device_stat(os.makedev(major, minor))

    def say(self, text: str) -> None:
        if self.rank != 0:
            return
        print(f"[checkpoint] {text}", file=sys.stderr, flush=True)
        if self.job.progress:  # the launcher shows these lines as they come
            with open(self.job.progress, "a") as f:
                f.write(text + "\n")

    # ---- the phases

    def write(self, name: str) -> dict | None:
        """One checkpoint: from a barrier to the commit; rank 0 returns its record."""
        partial = self.store.root / f"{name}.partial"
        if self.rank == 0:
            self.store.begin(name)
        before = self.device()
        self.group.barrier()
        t0 = time.monotonic()
        crcs, res = engine.write_checkpoint_file(str(partial / rank_file(self.rank)), self.spans,
                                                 self.file_size, **self.io())
        seconds = time.monotonic() - t0
        table = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "offset": off,
                  "nbytes": t.nbytes} for t, off in zip(self.me.tensors, self.offsets)]
        info = {"rank": self.rank, "file": rank_file(self.rank), "file_size": self.file_size,
                "crcs": crcs, "tensors": table, "seconds": seconds, "bytes": self.me.nbytes,
                "backend": res.backend, "sync_s": res.sync, "cpu_s": res.cpu_user + res.cpu_sys,
                "zero_copy_bytes": res.zero_copy_bytes}
        everyone = self.group.gather(info)
        if self.rank != 0:
            return None
        timing = [{k: r.pop(k) for k in ("seconds", "bytes", "backend", "sync_s", "cpu_s",
                                          "zero_copy_bytes")} for r in everyone]
        self.store.commit(partial, {"name": name, "plan": self.plan.summary(),
                                    "chunk_size": self.job.chunk_size,
                                    "align": self.job.align, "seed": self.job.seed,
                                    "pool": self.job.pool, "ranks": everyone})
        seconds = time.monotonic() - t0
        after = self.device()
        return {"name": name, "seconds": seconds, "bytes": sum(t["bytes"] for t in timing),
                "rank_seconds": [t["seconds"] for t in timing],
                "rank_bytes": [t["bytes"] for t in timing],
                "backend": timing[0]["backend"], "sync_s": max(t["sync_s"] for t in timing),
                "zero_copy_bytes": sum(t["zero_copy_bytes"] for t in timing),
                "device": honesty.between(before, after)}

    def restore(self, path: str | None = None) -> dict | None:
        """Read back a committed checkpoint (`path`, the job's restore_path, else the newest)
        into fresh memory and compare."""
        found = None
        if self.rank == 0:
            given = path or self.job.restore_path
            done = [Path(given)] if given else self.store.complete()
            try:
                if not done:
                    raise IncompleteCheckpoint(errno.ENODATA, "no committed checkpoint to restore",
                                               target=str(self.store.root))
                found = {"path": str(done[-1]), "manifest": load(done[-1])}
            except (DataMismatch, IncompleteCheckpoint) as e:
                found = {"error": str(e)}
        found = self.group.broadcast(found)
        # the tensors restored into exist before the restore (a model in memory): their pages
        # are touched here, not inside the timed read
        dst = engine.aligned_empty(self.pool_bytes)
        dst.fill(0)
        outcome = {"rank": self.rank, "seconds": 0.0, "bytes": 0, "zero_copy_bytes": 0,
                   "intact": False, "error": found.get("error")}
        spans = [(off, dst[pos:pos + t.nbytes])
                 for t, off, pos in zip(self.me.tensors, self.offsets, self.positions)]
        mine = path = None
        if outcome["error"] is None:
            mine = found["manifest"]["ranks"][self.rank]
            expected = [(t["name"], t["offset"]) for t in mine["tensors"]]
            if expected != [(t.name, off) for t, off in zip(self.me.tensors, self.offsets)]:
                outcome["error"] = f"{mine['file']} was written for another plan"
            else:
                path = Path(found["path"]) / mine["file"]
                drop_cache(path)
        before = self.device()
        self.group.barrier()
        t0 = time.monotonic()
        if path is not None:
            try:
                read = engine.read_checkpoint_file(str(path), spans, mine["file_size"],
                                                   mine["crcs"], **self.io())
                outcome["bytes"] = self.me.nbytes
                outcome["zero_copy_bytes"] = read.zero_copy_bytes
            except DataMismatch as e:
                outcome["error"] = str(e)
        outcome["seconds"] = time.monotonic() - t0  # the restore: reads and CRC checks
        if outcome["bytes"] and not self.compare:
            outcome["intact"] = True  # every chunk passed its CRC32C; no seed to compare with
        elif outcome["bytes"]:  # then, untimed, every restored byte against what was written
            outcome["intact"] = all(np.array_equal(dst[pos:pos + t.nbytes],
                                                   self.src[pos:pos + t.nbytes])
                                    for t, pos in zip(self.me.tensors, self.positions))
            if not outcome["intact"]:
                outcome["error"] = "restored bytes differ from the bytes written"
        everyone = self.group.gather(outcome)
        if self.rank != 0:
            return None
        after = self.device()
        return {"path": found.get("path"), "seconds": max(r["seconds"] for r in everyone),
                "bytes": sum(r["bytes"] for r in everyone),
                "rank_seconds": [r["seconds"] for r in everyone],
                "rank_bytes": [r["bytes"] for r in everyone],
                "zero_copy_bytes": sum(r["zero_copy_bytes"] for r in everyone),
                "intact": all(r["intact"] for r in everyone),
                "errors": [f"rank {r['rank']}: {r['error']}" for r in everyone if r["error"]],
                "verified_bytes": sum(min(self.pool_bytes, r["bytes"]) for r in everyone)
                if self.compare else 0,
                "device": honesty.between(before, after)}

    def torch_baseline(self) -> dict | None:
        """torch.save (+ fsync) and torch.load of this rank's first tensors, up to the
        baseline size, each tensor in its own storage as a model's state dict holds them."""
        import torch

        dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                  "float32": torch.float32, "uint8": torch.uint8, "int64": torch.int64}
        state, size = {}, 0
        for t, pos in zip(self.me.tensors, self.positions):
            if state and size + t.nbytes > self.job.baseline_bytes:
                break
            raw = torch.from_numpy(self.src[pos:pos + t.nbytes].copy())
            state[t.name] = raw.view(dtypes[t.dtype]).reshape(t.shape)
            size += t.nbytes
        folder = self.store.root / "torch-baseline"
        if self.rank == 0:
            folder.mkdir(exist_ok=True)
        path = folder / f"rank-{self.rank:05d}.pt"
        self.group.barrier()
        t0 = time.monotonic()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        save_s = time.monotonic() - t0
        drop_cache(path)
        before = self.device()
        self.group.barrier()
        t0 = time.monotonic()
        loaded = torch.load(path, weights_only=True)
        load_s = time.monotonic() - t0
        after = self.device()
        same = all(torch.equal(loaded[k].view(torch.uint8), v.view(torch.uint8))
                   for k, v in state.items())
        file_bytes = path.stat().st_size
        everyone = self.group.gather({"save_s": save_s, "load_s": load_s, "bytes": size,
                                      "file_bytes": file_bytes, "same": same})
        path.unlink()
        self.group.barrier()  # every rank's file is gone before rank 0 removes the folder
        if self.rank != 0:
            return None
        folder.rmdir()
        total = sum(r["bytes"] for r in everyone)
        return {"bytes": total, "save_s": max(r["save_s"] for r in everyone),
                "load_s": max(r["load_s"] for r in everyone),
                "file_bytes": sum(r["file_bytes"] for r in everyone),
                "load_device": honesty.between(before, after),
                "round_trip_equal": all(r["same"] for r in everyone)}

    def mlperf_runs(self, seq: int) -> list[dict]:
        """MLPerf Storage v2.0: per run, `per_pass` checkpoint writes, then every rank's files
        evicted from the page cache, then a read of each of them, verified; the set is pruned
        to the retention after each run."""
        runs = []
        for run in range(1, self.job.runs + 1):
            names = [f"ckpt-{seq + i:06d}" for i in range(self.job.per_pass)]
            seq += len(names)
            writes = [self.write(name) for name in names]
            self.say(f"run {run}/{self.job.runs}: {len(names)} checkpoints written; "
                     "reading them back from the device")
            reads = [self.restore(str(self.store.root / name)) for name in names]
            if self.rank == 0:
                runs.append({"run": run, "writes": writes, "reads": reads})
                self.store.prune(self.job.retention)
            self.group.barrier()
        return runs

    def run(self) -> dict | None:
        job = self.job
        if self.store is None:  # a set read back from wherever it lies: nothing written
            restore = self.restore()
            return self.results(restore=restore) if self.rank == 0 else None
        # rank 0 decides where numbering starts and how many checkpoints a pass holds: ranks
        # on other hosts may see the filesystem a moment later and count differently
        start, per_pass = self.group.broadcast((self.store.next_name(), job.per_pass)
                                               if self.rank == 0 else None)
        seq = int(start.split("-")[1])
        if job.procedure == "mlperf-v2":
            runs = self.mlperf_runs(seq)
            return self.results(mlperf=runs) if self.rank == 0 else None
        checkpoints = []
        total = job.passes * per_pass
        for p in range(1, job.passes + 1):
            for i in range(1, per_pass + 1):
                rec = self.write(f"ckpt-{seq:06d}")
                seq += 1
                if rec:
                    rec.update({"pass": p, "index": i})
                    checkpoints.append(rec)
                    self.say(f"{len(checkpoints)}/{total} (pass {p}): {rec['bytes'] / 1e9:.3f} GB "
                             f"in {rec['seconds']:.2f} s ({rec['bytes'] / rec['seconds'] / 1e9:.2f} GB/s)")
            if self.rank == 0:
                self.store.prune(job.retention)
            self.group.barrier()
        restore = self.restore() if job.restore else None
        baseline = self.torch_baseline() if job.times_torch else None
        if self.rank != 0:
            return None
        return self.results(checkpoints=checkpoints, restore=restore, torch=baseline)

    def results(self, *, checkpoints=(), restore=None, torch=None, mlperf=None) -> dict:
        """Rank 0's results document."""
        return {"plan": self.plan.summary(), "world": self.world,
                "rank_bytes": [r.nbytes for r in self.plan.ranks[:self.world]],
                "pool_bytes": self.pool_bytes,
                "data_period": self.pool_bytes if self.pool_bytes < self.image else None,
                "checkpoints": list(checkpoints), "restore": restore, "torch": torch,
                "mlperf": mlperf,
                "kept": [p.name for p in self.store.complete()] if self.store else []}


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def run_rank(job: RankJob, group: ForkedGroup | None = None) -> dict | None:
    """This process as the rank RANK of WORLD_SIZE (set by the launcher or by torchrun): joins
    the group (the launcher's, or torchrun's gloo group), runs every phase, leaves; rank 0
    returns the results, the others None."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    group = group.joined(rank) if group else TorchGroup(rank, world, job.timeout_s)
    try:
        return Rank(job, rank, world, group).run()
    finally:
        group.close()


def main(argv: list[str], group: ForkedGroup | None = None) -> int:
    """A rank started by the workload's launcher: results and errors go to files."""
    job = RankJob.from_json(Path(argv[0]).read_text())
    rank = int(os.environ["RANK"])
    try:
        result = run_rank(job, group)
        if result is not None:
            _write_json(Path(job.result), result)
        return 0
    except QualError as e:
        error = {"rank": rank, "errno": e.errno, "message": e.message, "op": e.op,
                 "offset": e.offset, "target": e.target, "class": type(e).__name__}
    except Exception as e:  # noqa: BLE001 - reported to the launcher, which re-raises it
        error = {"rank": rank, "errno": errno.EIO, "message": f"{type(e).__name__}: {e}",
                 "trace": traceback.format_exc(), "class": "QualError"}
    error["at"] = time.time()  # the launcher reports the first failure: the cause
    _write_json(Path(job.errors) / f"rank-{rank:05d}.json", error)
    return 1


# local_ranks' record of each rank's exit status, in the order they exited, in the launcher's
# workdir
EXITS = "exits.json"


def local_ranks(argv: list[str]) -> int:
    """The launcher's one child: `JOB.json PROCESSES WORKDIR`. Imports what a rank needs, then
    forks the ranks 0 .. PROCESSES-1, each bound to die with this process and writing its
    output to WORKDIR/rank-NNNNN.log, and waits for them. The first rank that fails ends the
    others (SIGKILL: a rank holds nothing that needs an orderly end; the launcher removes the
    partial checkpoints). Each rank's exit status goes to WORKDIR/exits.json; returns the first
    failure's, else 0. A SIGTERM ends this process, and its ranks with it."""
    job_path, processes, workdir = argv[0], int(argv[1]), Path(argv[2])
    job = RankJob.from_json(Path(job_path).read_text())
    if job.times_torch:
        import torch  # noqa: F401 - for torch.save's baseline: imported once, shared by every rank
    group = ForkedGroup(processes, job.timeout_s)
    me = os.getpid()
    children = {}
    for rank in range(processes):
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                watchdog.bind_to_parent(me)
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
                log = os.open(workdir / f"rank-{rank:05d}.log",
                              os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.close(log)
                status = main([job_path], group)
            except BaseException:  # noqa: BLE001 - said in the rank's log, then it exits 1
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        children[pid] = rank
    group.close()  # the ranks hold the pipes: one that dies is an end of file to rank 0
    exits, first = {}, 0
    while children:
        pid, status = os.wait()
        code = os.waitstatus_to_exitcode(status)
        exits[children.pop(pid)] = code
        if code and not first:
            first = code
            for other in children:
                os.kill(other, signal.SIGKILL)
    _write_json(workdir / EXITS, exits)
    return first

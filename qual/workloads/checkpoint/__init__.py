"""DLIO-style LLM checkpointing (seed 004): passes of checkpoints that fill the target, a
restore checked (every chunk's CRC32C against the write's; the bytes each rank's data pool
holds, byte for byte), and torch.save / torch.load of the same tensors for comparison.
Ranks are processes joined by torch.distributed (gloo)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qual import honesty
from qual.units import format_size
from qual.engine import NoSpace, QualError, TargetUnavailable, error_for
from qual.family import Field, Metric, Param, Rates, Work, measurement_id
from qual.record import Measurement, measure
from qual.target import Target
from qual.workloads.base import FIT_MARGIN, Family, Flags, ResultOutcome, backend_field
from qual.workloads.checkpoint import charts, ranks
from qual.workloads.checkpoint.plan import (MLPERF_LAYOUTS, MODELS, RECIPES, SUBSET_PROCESSES,
                                            Plan, describe, plan_from)
from qual.workloads.checkpoint.store import CheckpointStore, load as load_set

NAME = "checkpoint"
_PASS, _INDEX = Param("pass", "count"), Param("index", "count")
MLPERF_CHECKPOINTS = 10  # MLPerf Storage v2.0: 10 writes, then 10 reads, per run
GIB = 1 << 30  # DLIO's and mlpstorage's "GB" in these figures is GiB

METRICS = {m.name: m for m in (
    Metric("ckpt_write_s", "time", "lower", (_PASS,),
           "mean seconds per checkpoint in a pass, barrier to commit"),
    Metric("ckpt_write_bw", "bandwidth", "higher", (_PASS,),
           "checkpoint bytes over the mean seconds per checkpoint in a pass"),
    Metric("ckpt_rank_bw_min", "bandwidth", "higher", (_PASS,),
           "slowest rank's bytes per second, averaged over the pass (MLPerf Storage)"),
    Metric("ckpt_each_s", "time", "lower", (_PASS, _INDEX), "seconds of one checkpoint"),
    Metric("ckpt_size", "size", "higher", (), "bytes in one checkpoint"),
    Metric("ckpt_restore_s", "time", "lower", (), "restore of the last checkpoint, slowest rank"),
    Metric("ckpt_restore_bw", "bandwidth", "higher", (), "checkpoint bytes over restore seconds"),
    Metric("ckpt_restore_intact", "ratio", "higher", (),
           "1 when every restored byte equals what was written (CRC32C and comparison)"),
    Metric("torch_save_bw", "bandwidth", "higher", (), "torch.save + fsync of the same tensors"),
    Metric("torch_load_bw", "bandwidth", "higher", (), "torch.load from a cold cache"),
    Metric("ckpt_save_speedup", "ratio", "higher", (), "native write over torch.save bandwidth"),
    Metric("ckpt_load_speedup", "ratio", "higher", (), "native restore over torch.load bandwidth"),
    # MLPerf Storage v2.0's figures, named as DLIO's summary names them: per checkpoint the
    # slowest rank's seconds and the slowest rank's throughput, averaged over a run's
    # checkpoints, then over the runs (what MLPerf reports; each run's are in the context)
    Metric("save_checkpoint_duration", "time", "lower", (),
           "MLPerf: checkpoint write seconds, slowest rank, mean over checkpoints and runs"),
    Metric("save_checkpoint_io", "bandwidth", "higher", (),
           "MLPerf: checkpoint write throughput, slowest rank, mean over checkpoints and runs"),
    Metric("load_checkpoint_duration", "time", "lower", (),
           "MLPerf: checkpoint read seconds (cache cleared), slowest rank, mean over them"),
    Metric("load_checkpoint_io", "bandwidth", "higher", (),
           "MLPerf: checkpoint read throughput (cache cleared), slowest rank, mean over them"),
)}

FIELDS = (
    Field("model", "choice", required=True, choices=tuple(MODELS)),
    Field("recipe", "choice", default="mixed-adam", choices=tuple(RECIPES)),
    Field("tp", "count", default=1),
    Field("pp", "count", default=1),
    Field("dp", "count", default=1),
    Field("zero", "count", default=0, minimum=0, maximum=3),
    Field("scale", "number", default=1.0, help="shrinks every tensor (0 < scale <= 1)"),
    Field("ranks", "count", default=0, minimum=0,
          help="processes on this host (0: every rank of the layout; with subset, 8)"),
    Field("subset", "bool", default=False,
          help="MLPerf's subset mode for node-local storage: this host's processes write "
               "ranks/(tp x pp x dp) of the checkpoint, each the mean rank's share"),
    Field("passes", "count", default=3),
    Field("per_pass", "count", default=0, minimum=0, aliases=("--count",),
          help="checkpoints per pass (0: as many as fill the target to `utilisation`)"),
    Field("utilisation", "ratio", default="60 %"),
    Field("retention", "count", default=2, help="checkpoints kept after each pass"),
    Field("restore", "bool", default=True),
    Field("procedure", "choice", default="passes", choices=("passes", "mlperf-v2"),
          help="passes: seed 004's passes that fill the target; mlperf-v2: MLPerf Storage "
               "v2.0's runs of per_pass writes (10), cache cleared, then as many reads"),
    Field("runs", "count", default=5, help="mlperf-v2: runs (MLPerf: 5, averaged)"),
    Field("write_only", "bool", default=False,
          help="write the checkpoints and stop: a complete set for a later --read-only"),
    Field("read_only", "text", default=None,
          help="a checkpoint directory (the one holding manifest.json), written by an earlier "
               "run or another host, to restore and verify; nothing is written"),
    Field("baseline", "bool", default=True, help="torch.save and torch.load for comparison"),
    Field("baseline_bytes", "size", default="512 MiB", help="per rank, for the torch baseline"),
    Field("chunk_size", "size", default="8 MiB", minimum=4096),
    Field("queue_depth", "count", default=8, maximum=1024),
    Field("pool", "size", default="1 GiB",
          help="random data per rank; a larger rank state repeats it"),
    backend_field(),
    Field("timeout", "duration", default="2 h", help="longest wait at a rank barrier"),
)


def plan_of(table: dict) -> Plan:
    subset = (table["ranks"] or SUBSET_PROCESSES) if table["subset"] else 0
    return plan_from({**table, "subset": subset})


def _check(table: dict) -> list[tuple[str, str]]:
    problems = []
    if table["zero"] not in (0, 1, 3):
        problems.append(("zero", f"{table['zero']} is not a ZeRO stage qual models (0, 1, 3)"))
    if table["scale"] > 1:
        problems.append(("scale", f"{table['scale']} is above 1"))
    if table["chunk_size"] % 4096:
        problems.append(("chunk_size", "is not a multiple of 4 KiB"))
    if table["write_only"] and table.get("read_only"):
        problems.append(("read_only", "a run that only reads cannot also only write "
                                      "(write_only)"))
    layout_ranks = table["tp"] * table["pp"] * table["dp"]
    if table["ranks"] > layout_ranks:
        problems.append(("ranks", f"{table['ranks']} processes for a {layout_ranks}-rank layout"))
    elif table["subset"] and not table["ranks"] and layout_ranks < SUBSET_PROCESSES:
        problems.append(("subset", f"a subset of {SUBSET_PROCESSES} processes of a "
                                   f"{layout_ranks}-rank layout (give a larger layout, or ranks)"))
    if not problems:
        try:
            plan_of(table)
        except ValueError as e:
            problems.append(("tp", str(e)))
    return problems


def _cells(table: dict) -> list[str]:
    if table["procedure"] == "mlperf-v2":
        names = ("save_checkpoint_duration", "save_checkpoint_io", "load_checkpoint_duration",
                 "load_checkpoint_io")
        return [*names, "ckpt_restore_intact"]
    ids = []
    for p in range(1, table["passes"] + 1):
        for name in ("ckpt_write_s", "ckpt_write_bw", "ckpt_rank_bw_min"):
            ids.append(measurement_id(METRICS[name], {"pass": p}))
        for i in range(1, table["per_pass"] + 1):
            ids.append(measurement_id(METRICS["ckpt_each_s"], {"pass": p, "index": i}))
    ids.append("ckpt_size")
    if table["restore"]:
        ids += ["ckpt_restore_s", "ckpt_restore_bw", "ckpt_restore_intact"]
    if table["baseline"]:
        ids += ["torch_save_bw", "torch_load_bw", "ckpt_save_speedup"]
        if table["restore"]:
            ids.append("ckpt_load_speedup")
    return ids


# ------------------------------------------------------------------ running it


def checkpoints_per_pass(table: dict, folder: Path, checkpoint_bytes: int) -> int:
    """The profile's count, or as many as fill the filesystem to its utilisation (seed 004
    filled each drive to a similar utilisation); refused before any I/O if none fits."""
    if table["per_pass"]:
        return table["per_pass"]
    usage = shutil.disk_usage(folder)
    room = table["utilisation"] * usage.total - usage.used
    count = int(room // checkpoint_bytes)
    if count < 1:
        raise NoSpace(errno.ENOSPC, f"a {checkpoint_bytes / 1e9:.3g} GB checkpoint does not fit "
                      f"below {table['utilisation'] * 100:g} % of the filesystem "
                      f"({usage.used / 1e9:.3g} of {usage.total / 1e9:.3g} GB used)",
                      target=str(folder))
    return count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# a rank process; not `-m ...ranks`, which runpy warns about since this package imports it
RANK_MAIN = "import sys; from qual.workloads.checkpoint.ranks import main; sys.exit(main(sys.argv[1:]))"


def launch(job: ranks.RankJob, processes: int, workdir: Path, progress=None) -> dict:
    """Run the rank processes on this host (as torchrun would) and return rank 0's results.
    If one rank fails, the others are stopped and its error is raised here. Rank 0's progress
    lines go to `progress` as they come."""
    said = workdir / "progress.log"
    job = dataclasses.replace(job, progress=str(said) if progress else None)
    seen = 0
    job_path = workdir / "job.json"
    job_path.write_text(job.to_json())
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
            "WORLD_SIZE": str(processes), "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(processes):
        log = open(workdir / f"rank-{rank:05d}.log", "wb")
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        # rank 0's lines reach the user through the launcher, never its stdout or stderr: a rank
        # stuck on storage that stopped answering cannot exit, and would hold them open
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK_MAIN, str(job_path)], env=env, stdout=log, stderr=log))
        log.close()
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                break
            if progress and said.exists():
                text = said.read_text()
                done = text[seen:text.rfind("\n") + 1]
                seen += len(done)
                for line in done.splitlines():
                    count = re.match(r"(\d+)/(\d+) ", line)  # rank 0: "3/8 (pass 1): ..."
                    progress(f"checkpoint {line}",
                             int(count[1]) / int(count[2]) if count else None)
            time.sleep(0.1)
    finally:
        _stop(procs)
    # the cause: an engine error (ENOSPC, EIO, ...) before any other failure, since a rank
    # that lost its peer may catch that before the failing rank has caught its own
    errors = sorted((json.loads(p.read_text()) for p in Path(job.errors).glob("rank-*.json")),
                    key=lambda e: ("trace" in e, e["at"]))
    if errors:
        e = errors[0]
        cls = error_for(e["errno"])
        raise cls(e["errno"], f"rank {e['rank']}: {e['message']}", op=e.get("op"),
                  offset=e.get("offset"), target=e.get("target"))
    if any(p.returncode != 0 for p in procs):
        bad = next(i for i, p in enumerate(procs) if p.returncode != 0)
        tail = (workdir / f"rank-{bad:05d}.log").read_text(errors="replace")[-2000:]
        raise QualError(errno.EIO, f"rank {bad} exited with {procs[bad].returncode}: {tail}")
    return json.loads(Path(job.result).read_text())


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run(target: Target, table: dict, *, seed: int = 1, passes: int | None = None,
        per_pass: int | None = None, progress=None, faults=()) -> CheckpointOutcome | None:
    """The checkpoint workload on a target's folder; returns rank 0's results. Launched by
    torchrun (RANK and WORLD_SIZE set), this process is one rank and only rank 0 returns
    results; otherwise the ranks are started here, one process each."""
    if table.get("read_only"):
        return read_back(Path(table["read_only"]), table, seed=seed, progress=progress)
    folder = target.directory
    if folder is None:
        raise TargetUnavailable(errno.ENOTSUP, "checkpoints need a filesystem: give a "
                                "directory on the drive", target=target.spec)
    if table["write_only"]:
        table = {**table, "restore": False, "baseline": False}
    plan = plan_of(table)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    leader = not torchrun or os.environ["RANK"] == "0"
    processes = int(os.environ["WORLD_SIZE"]) if torchrun else table["ranks"] or len(plan.ranks)
    store = CheckpointStore(folder)
    if leader:  # with torchrun the other ranks wait for rank 0 inside the process group
        folder.mkdir(parents=True, exist_ok=True)
        store.create()
        store.remove_partials()  # what an interrupted earlier run left
    passes = table["passes"] if passes is None else passes
    mlperf = table["procedure"] == "mlperf-v2"
    if mlperf:
        per_pass = per_pass or table["per_pass"] or MLPERF_CHECKPOINTS
        need = per_pass * sum(r.nbytes for r in plan.ranks[:processes])
        if leader and shutil.disk_usage(folder).free < need:  # all of a run's writes stay
            raise NoSpace(errno.ENOSPC, f"a run of {per_pass} checkpoints needs "
                          f"{need / 1e9:.3g} GB, and {folder} has "
                          f"{shutil.disk_usage(folder).free / 1e9:.3g} GB free",
                          target=str(folder))
    elif per_pass is None:
        per_pass = checkpoints_per_pass(table, folder, plan.nbytes) if leader else 0
    st = os.stat(folder)
    one_host = processes == len(plan.ranks) and \
        (not torchrun or os.environ.get("LOCAL_WORLD_SIZE") == os.environ["WORLD_SIZE"])
    workdir = Path(tempfile.mkdtemp(prefix="qual-ckpt-"))
    (workdir / "errors").mkdir()
    job = ranks.RankJob(
        root=str(folder), plan=plan.keys(), passes=passes, per_pass=per_pass,
        retention=table["retention"], procedure=table["procedure"], runs=table["runs"],
        restore=table["restore"], baseline=table["baseline"],
        baseline_bytes=table["baseline_bytes"], chunk_size=table["chunk_size"],
        queue_depth=table["queue_depth"], align=max(4096, target.align),
        backend=table["backend"], pool=table["pool"], seed=seed, timeout_s=table["timeout"],
        result=str(workdir / "result.json"), errors=str(workdir / "errors"),
        faults=[dataclasses.asdict(f) for f in faults],
        # device counters are only the checkpoint's when every rank runs on this host
        device=(f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
                if one_host and os.major(st.st_dev) else None))
    try:
        if torchrun:
            result = ranks.run_rank(job)
            if result is None:  # not rank 0: rank 0 reports
                return None
        else:
            result = launch(job, processes, workdir, progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if leader:
            store.remove_partials()
    result["per_pass"] = per_pass
    result["passes"] = 0 if mlperf else passes
    result["store"] = str(store.root)
    return CheckpointOutcome(result, target=str(target.path))


def read_back(ckpt: Path, table: dict, *, seed: int = 1, progress=None) -> CheckpointOutcome:
    """Restore and verify one committed checkpoint that an earlier run (or another host)
    wrote: its plan, chunking, alignment and data seed come from its manifest, which is
    checked first (committed, intact, every rank file present); nothing is written."""
    manifest = load_set(ckpt)  # refuses before any rank starts
    p = manifest["plan"]
    processes = table["ranks"] or len(manifest["ranks"])
    st = os.stat(ckpt)
    workdir = Path(tempfile.mkdtemp(prefix="qual-ckpt-"))
    (workdir / "errors").mkdir()
    job = ranks.RankJob(
        restore_path=str(ckpt),  # the set alone: no store around it
        plan=p,  # the manifest's plan summary names the plan (plan_from)
        restore=True, chunk_size=manifest["chunk_size"], queue_depth=table["queue_depth"],
        align=manifest["align"], backend=table["backend"],
        pool=manifest.get("pool", table["pool"]), seed=manifest.get("seed"),
        timeout_s=table["timeout"], result=str(workdir / "result.json"),
        errors=str(workdir / "errors"),
        device=f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        if processes == len(manifest["ranks"]) and os.major(st.st_dev) else None)
    try:
        result = launch(job, processes, workdir, progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result.update(per_pass=0, passes=0, store=str(ckpt))
    return CheckpointOutcome(result, target=str(ckpt))


def remove(target: Target) -> None:
    """Every checkpoint qual made on the target."""
    if target.directory is not None:
        CheckpointStore(target.directory).remove_all()


# ------------------------------------------------------------------ results into measurements


def pass_measurements(result: dict, target: str) -> list[Measurement]:
    """Per pass: mean seconds per checkpoint, that as bandwidth, slowest rank's bandwidth;
    per checkpoint: its seconds (informational)."""
    out = []
    size = result["checkpoints"][0]["bytes"] if result["checkpoints"] else 0
    common = {"target": target, "backend": result["checkpoints"][0]["backend"] if size else None,
              "world": result["world"], "plan": result["plan"], "per_pass": result["per_pass"],
              "data_period": result["data_period"]}
    out.append(measure(NAME, METRICS["ckpt_size"], {}, size, context=common))
    for p in range(1, result["passes"] + 1):
        mine = [c for c in result["checkpoints"] if c["pass"] == p]
        truths = []
        for c in mine:
            checked = honesty.check_device(c["device"], "write_bytes", c["bytes"],
                                           "checkpoint writes", target)
            truths.append(checked["device_truth"])
            out.append(measure(NAME, METRICS["ckpt_each_s"], {"pass": p, "index": c["index"]},
                               c["seconds"], context={**common, "name": c["name"],
                                                      "rank_seconds": c["rank_seconds"],
                                                      "device": c["device"], **checked}))
        seconds = [c["seconds"] for c in mine]
        mean = sum(seconds) / len(seconds)
        slowest = [min(b / s for b, s in zip(c["rank_bytes"], c["rank_seconds"])) for c in mine]
        ctx = {**common, "checkpoints": len(mine),  # proven only if every checkpoint is
               "device_truth": next((t for t in truths if t != honesty.COUNTED),
                                    honesty.COUNTED)}
        out.append(measure(NAME, METRICS["ckpt_write_s"], {"pass": p}, mean, context=ctx,
                           samples=seconds))
        out.append(measure(NAME, METRICS["ckpt_write_bw"], {"pass": p}, size / mean, context=ctx,
                           samples=[size / s for s in seconds]))
        out.append(measure(NAME, METRICS["ckpt_rank_bw_min"], {"pass": p},
                           sum(slowest) / len(slowest), context=ctx, samples=slowest))
    return out


def restore_measurements(result: dict, target: str) -> list[Measurement]:
    r = result["restore"]
    ctx = {"target": target, "checkpoint": r["path"], "errors": r["errors"],
           "verified_bytes": r["verified_bytes"], "device": r["device"]}
    out = [measure(NAME, METRICS["ckpt_restore_intact"], {}, 1.0 if r["intact"] else 0.0,
                   context=ctx)]
    if r["bytes"]:
        ctx = {**ctx, **honesty.check_device(r["device"], "read_bytes", r["bytes"],
                                             "restore reads", target)}
        out += [measure(NAME, METRICS["ckpt_restore_s"], {}, r["seconds"], context=ctx),
                measure(NAME, METRICS["ckpt_restore_bw"], {}, r["bytes"] / r["seconds"],
                        context=ctx)]
    return out


def baseline_measurements(result: dict, target: str) -> list[Measurement]:
    t = result["torch"]
    seen = t["load_device"]
    cold = None if seen is None else \
        seen["read_bytes"] >= honesty.DEVICE_SHARE * t["file_bytes"]  # None: nobody counted
    ctx = {"target": target, "bytes": t["bytes"], "file_bytes": t["file_bytes"],
           "save_s": t["save_s"], "load_s": t["load_s"], "load_from_device": cold,
           "round_trip_equal": t["round_trip_equal"],
           "device_truth": honesty.NO_DEVICE if cold is None else honesty.COUNTED if cold
           else "not from the device: torch.load was served by the page cache"}
    save_bw, load_bw = t["bytes"] / t["save_s"], t["bytes"] / t["load_s"]
    out = [measure(NAME, METRICS["torch_save_bw"], {}, save_bw, context=ctx),
           measure(NAME, METRICS["torch_load_bw"], {}, load_bw, context=ctx)]
    passes = [m for m in pass_measurements(result, target) if m.metric == "ckpt_write_bw"]
    if passes:
        native = sum(m.value for m in passes) / len(passes)
        out.append(measure(NAME, METRICS["ckpt_save_speedup"], {}, native / save_bw,
                           context={**ctx, "native_write_bw": native}))
    if result["restore"] and result["restore"]["bytes"]:
        native = result["restore"]["bytes"] / result["restore"]["seconds"]
        out.append(measure(NAME, METRICS["ckpt_load_speedup"], {}, native / load_bw,
                           context={**ctx, "native_restore_bw": native}))
    return out


def _slowest(rec: dict) -> tuple[float, float]:
    """MLPerf's figures of one checkpoint: the slowest rank's seconds and the slowest rank's
    throughput (the minimum over ranks of its bytes over its seconds)."""
    return max(rec["rank_seconds"]), min(b / s for b, s in zip(rec["rank_bytes"],
                                                              rec["rank_seconds"]) if s > 0)


def mlperf_summary(result: dict) -> dict:
    """Per run and over the runs, the four figures under DLIO's summary names (GB = GiB)."""
    runs = []
    for r in result["mlperf"]:
        w = [_slowest(c) for c in r["writes"]]
        rd = [_slowest(c) for c in r["reads"] if c["bytes"]]
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        runs.append({
            "run": r["run"], "checkpoints_written": len(w), "checkpoints_read": len(rd),
            "verified": all(c["intact"] for c in r["reads"]),
            "read_bytes": sum(c["bytes"] for c in r["reads"]),
            # the cache clear's proof: what the device itself counted (None: no device to ask)
            "device_read_bytes": None if any(c["device"] is None for c in r["reads"])
            else sum(c["device"]["read_bytes"] for c in r["reads"]),
            "save_checkpoint_duration_mean_seconds": mean([d for d, _ in w]),
            "save_checkpoint_io_mean_GB_per_second": mean([t for _, t in w]) / GIB,
            "load_checkpoint_duration_mean_seconds": mean([d for d, _ in rd]),
            "load_checkpoint_io_mean_GB_per_second": mean([t for _, t in rd]) / GIB,
            "errors": [e for c in r["reads"] for e in c["errors"]]})
    keys = [k for k in runs[0] if k.endswith(("_seconds", "_second"))] if runs else []
    return {"runs": runs, "verified": bool(runs) and all(r["verified"] for r in runs),
            **{k: sum(r[k] for r in runs) / len(runs) for k in keys}}


def mlperf_measurements(result: dict, target: str) -> list[Measurement]:
    """The MLPerf figures per run and over the runs; every write and every read checked
    against the device's own counters (a read the page cache served is not a read)."""
    summary = mlperf_summary(result)
    common = {"target": target, "world": result["world"], "plan": result["plan"],
              "checkpoints_per_run": result["per_pass"], "procedure": "mlperf-v2"}
    truths = []
    for r in result["mlperf"]:
        for c in r["writes"]:
            truths.append(honesty.check_device(c["device"], "write_bytes", c["bytes"],
                                               "checkpoint writes", target)["device_truth"])
        for c in r["reads"]:
            if c["bytes"]:
                truths.append(honesty.check_device(c["device"], "read_bytes", c["bytes"],
                                                   "checkpoint reads (cache cleared)",
                                                   target)["device_truth"])
    ctx = {**common, "device_truth": next((t for t in truths if t != honesty.COUNTED),
                                          honesty.COUNTED)}
    names = {"save_checkpoint_duration": "save_checkpoint_duration_mean_seconds",
             "save_checkpoint_io": "save_checkpoint_io_mean_GB_per_second",
             "load_checkpoint_duration": "load_checkpoint_duration_mean_seconds",
             "load_checkpoint_io": "load_checkpoint_io_mean_GB_per_second"}
    out = []
    for metric, key in names.items():
        scale = GIB if key.endswith("_second") else 1  # GiB/s to bytes/s
        out.append(measure(NAME, METRICS[metric], {}, summary[key] * scale,
                           context={**ctx, "mlperf_name": key,
                                    "runs": [r[key] for r in summary["runs"]]},
                           samples=[r[key] * scale for r in summary["runs"]]))
    out.append(measure(NAME, METRICS["ckpt_restore_intact"], {},
                       1.0 if summary["verified"] else 0.0,
                       context={**common, "errors": [e for r in summary["runs"]
                                                     for e in r["errors"]]}))
    return out


SECTIONS = {"mlperf": mlperf_measurements, "passes": pass_measurements,
            "restore": restore_measurements, "baseline": baseline_measurements}


class CheckpointOutcome(ResultOutcome):
    """Rank 0's results (a dict, as the ranks report them) and the protocol's views of them."""

    def measurements(self, section: str | None = None) -> list[Measurement]:
        """All, or one section: mlperf (the MLPerf procedure's runs), passes, restore, baseline
        (torch.save and torch.load)."""
        if section is not None:
            return SECTIONS[section](self, self.target)
        if self.get("mlperf") is not None:
            return mlperf_measurements(self, self.target)
        out = pass_measurements(self, self.target)
        if self["restore"]:
            out += restore_measurements(self, self.target)
        if self["torch"]:
            out += baseline_measurements(self, self.target)
        return out

    def document(self) -> dict:
        if self.get("mlperf") is not None:
            summary = mlperf_summary(self)
            plan = self["plan"]
            return {"procedure": "mlperf-v2", "bytes": sum(self["rank_bytes"]),
                    # MLPerf's checkpoint.mode: subset writes this host's share (node-local)
                    "mode": "subset" if plan.get("subset") else "default",
                    "full_bytes": plan.get("full_bytes", sum(self["rank_bytes"])),
                    "ranks": self["world"], "plan": plan,
                    "checkpoints_per_run": self["per_pass"], **summary,
                    "store": self["store"], "kept": self["kept"]}
        cps, r = self["checkpoints"], self["restore"]
        size = cps[0]["bytes"] if cps else r["bytes"] if r else 0  # read-only: what it restored
        seconds = [c["seconds"] for c in cps]
        doc = {"bytes": size, "ranks": self["world"], "plan": self["plan"],
               "backend": cps[0]["backend"] if cps else None, "write_s": seconds,
               "write_bw_bytes": size * len(seconds) / sum(seconds) if seconds else 0.0,
               "zero_copy_bytes": [c["zero_copy_bytes"] for c in cps],
               "store": self["store"], "kept": self["kept"]}
        if r:
            doc.update(restore_s=r["seconds"], restore_bw_bytes=r["bytes"] / r["seconds"]
                       if r["bytes"] else 0.0, verified=r["intact"], restore_errors=r["errors"],
                       crc_checked_bytes=r["bytes"], byte_compared_bytes=r["verified_bytes"],
                       restore_zero_copy_bytes=r["zero_copy_bytes"])
        t = self["torch"]
        if t:
            doc.update(torch_save_bw_bytes=t["bytes"] / t["save_s"],
                       torch_load_bw_bytes=t["bytes"] / t["load_s"])
        return doc

    def lines(self) -> list[str]:
        doc = self.document()
        if self.get("mlperf") is not None:
            return [f"run {r['run']}: {r['checkpoints_written']} writes "
                    f"{r['save_checkpoint_duration_mean_seconds']:.2f} s "
                    f"({r['save_checkpoint_io_mean_GB_per_second']:.2f} GiB/s), "
                    f"{r['checkpoints_read']} reads {r['load_checkpoint_duration_mean_seconds']:.2f} s "
                    f"({r['load_checkpoint_io_mean_GB_per_second']:.2f} GiB/s), verified: "
                    f"{r['verified']}" for r in doc["runs"]] + [
                f"MLPerf Storage v2.0 ({doc['mode']} mode, {doc['bytes'] / 2**30:.3f} of "
                f"{doc['full_bytes'] / 2**30:.3f} GiB; {len(doc['runs'])} runs, slowest rank): write "
                f"{doc['save_checkpoint_duration_mean_seconds']:.2f} s, "
                f"{doc['save_checkpoint_io_mean_GB_per_second']:.2f} GiB/s; read "
                f"{doc['load_checkpoint_duration_mean_seconds']:.2f} s, "
                f"{doc['load_checkpoint_io_mean_GB_per_second']:.2f} GiB/s; verified: "
                f"{doc['verified']}"]
        gb = doc["bytes"] / 1e9
        out = [f"checkpoint {i}: {gb:.3f} GB in {s:.2f} s ({gb / s:.2f} GB/s) [{doc['backend']}]"
               for i, s in enumerate(doc["write_s"], 1)]
        if self["restore"]:
            out.append(f"restore: {doc['restore_s']:.2f} s ({doc['restore_bw_bytes'] / 1e9:.2f} "
                       f"GB/s), intact: {doc['verified']} (CRC32C of every chunk, "
                       f"{doc['crc_checked_bytes'] / 1e9:.3f} GB; "
                       f"{doc['byte_compared_bytes'] / 1e9:.3f} GB of it byte for byte)")
            out += [f"  {e}" for e in doc["restore_errors"]]
        if self["torch"]:
            out.append(f"torch.save + fsync: {doc['torch_save_bw_bytes'] / 1e9:.2f} GB/s, "
                       f"torch.load: {doc['torch_load_bw_bytes'] / 1e9:.2f} GB/s")
        if doc["kept"]:
            out.append(f"kept in {doc['store']}: {', '.join(doc['kept'])}")
        if self["checkpoints"] and not self["restore"]:
            out.append(f"read it back (here or on another host) with: qual checkpoint "
                       f"--read-only {Path(doc['store']) / doc['kept'][-1]}")
        return out

    def charts(self) -> dict[str, bytes]:
        return {"seconds per checkpoint": charts.seconds_chart(self)} if self["checkpoints"] \
            else {}

    def exit_status(self) -> int:
        if self.get("mlperf") is not None:
            return 0 if mlperf_summary(self)["verified"] else 1
        return 1 if self["restore"] and not self["restore"]["intact"] else 0


def _plan_document(table: dict) -> tuple[dict, list[str]]:
    """`qual checkpoint --plan`: every rank's size and the arithmetic, nothing written."""
    plan = plan_of(table)
    text = describe(plan)
    return {**plan.summary(), "derivation": text}, text.splitlines()


def _defaults(given: dict) -> dict:
    """A quick run without a profile: the 8B model, one pass of one checkpoint (ten a run with
    the MLPerf procedure), no restore or torch baseline unless asked for. The MLPerf procedure
    or its subset mode, with no layout given, runs the model in MLPerf's layout."""
    mlperf = given.get("procedure") == "mlperf-v2"
    out = {"model": "llama3.1-8b", "passes": 1,
           "per_pass": MLPERF_CHECKPOINTS if mlperf else 1,
           "restore": False, "baseline": False}
    layout = MLPERF_LAYOUTS.get(given.get("model", out["model"]))
    if (mlperf or given.get("subset")) and layout and \
            not any(k in given for k in ("tp", "pp", "dp", "zero")):
        out.update(zip(("tp", "pp", "dp", "zero"), layout))
    return out


# CPU seconds a rank process takes to start on qual's reference host (2 cores, KVM): Python,
# numpy, torch and the engine imported (`python3 -c "import torch"`: 2.3 s)
RANK_START_CPU_S = 2.3
RUN_TESTS = ("test_mlperf_v2", "test_passes", "test_restore", "test_torch_baseline")


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one workload run (its module's `outcome`): the rank processes
    started, the checkpoints written and read back, the torch baseline."""
    if test not in RUN_TESTS or table.get("read_only"):
        return []
    plan = plan_of(table)
    processes = table["ranks"] or len(plan.ranks)
    one = sum(r.nbytes for r in plan.ranks[:processes])
    if table["procedure"] == "mlperf-v2":
        per_pass = table["per_pass"] or MLPERF_CHECKPOINTS
        written = read = table["runs"] * per_pass * one
    else:
        fits = int(table["utilisation"] * rates.room // one) if rates.room else 1
        per_pass = table["per_pass"] or max(1, fits)
        written = table["passes"] * per_pass * one
        read = one if table["restore"] and not table["write_only"] else 0
        if table["baseline"] and not table["write_only"]:
            torch_bytes = min(table["baseline_bytes"], max(r.nbytes for r in plan.ranks))
            written += torch_bytes * processes
            read += torch_bytes * processes
    start = RANK_START_CPU_S * rates.cpu * processes / min(processes, os.cpu_count() or 1)
    return [Work("checkpoint run", start + written / rates.write_bw + read / rates.read_bw,
                 bytes_written=written, bytes_read=read, space=per_pass * one, repeated=True,
                 what=f"{per_pass} checkpoint(s) of {format_size(one)} ({table['model']}, "
                      f"{processes} rank(s))")]


FAMILY = Family(name=NAME, description="DLIO-style LLM checkpoint write, restore and torch.save",
                fields=FIELDS, metrics=METRICS, check=_check, cells=_cells, run=run,
                remove=remove, plan=_plan, filesystem=True,
                reads_from=lambda table: table.get("read_only"),
                fit=lambda table, room, need: {"scale": table["scale"] * room / need * FIT_MARGIN},
                flags=Flags(defaults=_defaults, keeps=True, explain=_plan_document,
                            shared_target=lambda: "RANK" in os.environ and
                            "WORLD_SIZE" in os.environ))

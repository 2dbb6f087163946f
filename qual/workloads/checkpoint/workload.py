"""A checkpoint run: the rank processes started on this host (or this process as one of
torchrun's ranks), every pass or MLPerf run written and read back, rank 0's results gathered;
a committed set read back from wherever it lies; what qual made removed."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from qual import watchdog
from qual.engine import error_for
from qual.errors import NoSpace, QualError, TargetUnavailable
from qual.targets import Target
from qual.targets.scratch import own_tempdir
from qual.workloads.checkpoint import ranks
from qual.workloads.checkpoint.store import CheckpointStore, load as load_set
from qual.workloads.checkpoint.spec import MLPERF_CHECKPOINTS, plan_of
from qual.workloads.checkpoint.results import CheckpointOutcome


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


# the ranks' parent (ranks.local_ranks); not `-m ...ranks`, which runpy warns about since this
# package imports it
RANKS_MAIN = ("import sys; from qual.workloads.checkpoint.ranks import local_ranks; "
              "sys.exit(local_ranks(sys.argv[1:]))")


def launch(job: ranks.RankJob, processes: int, workdir: Path, progress=None) -> dict:
    """Run the rank processes on this host (as torchrun would) and return rank 0's results.
    If one rank fails, the others are stopped and its error is raised here. Rank 0's progress
    lines go to `progress` as they come."""
    said = workdir / "progress.log"
    job = dataclasses.replace(job, progress=str(said) if progress else None)
    seen = 0
    job_path = workdir / "job.json"
    job_path.write_text(job.to_json())
    base = {**os.environ, "WORLD_SIZE": str(processes), "OMP_NUM_THREADS": "1"}
    # rank 0's lines reach the user through the launcher, never its stdout or stderr: a rank
    # stuck on storage that stopped answering cannot exit, and would hold them open
    with open(workdir / "ranks.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", RANKS_MAIN, str(job_path), str(processes), str(workdir)],
            env=base, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            preexec_fn=watchdog.dies_with_me())
    try:
        while proc.poll() is None:
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
        _stop(proc)
    exits = workdir / ranks.EXITS
    exits = json.loads(exits.read_text()) if exits.exists() else {}
    rank, e = culprit([json.loads(p.read_text()) for p in Path(job.errors).glob("rank-*.json")],
                      exits)
    if e:
        cls = error_for(e["errno"])
        raise cls(e["errno"], f"rank {e['rank']}: {e['message']}", op=e.get("op"),
                  offset=e.get("offset"), target=e.get("target"))
    if rank is not None:  # a rank that died without a word: its log says why, if it had one
        log = workdir / f"rank-{rank:05d}.log"
        tail = (log if log.is_file() else workdir / "ranks.log").read_text(errors="replace")
        raise QualError(errno.EIO, f"rank {rank} exited with {exits[str(rank)]}: {tail[-2000:]}")
    if proc.returncode != 0:  # the ranks' parent itself failed, before or while it forked them
        tail = (workdir / "ranks.log").read_text(errors="replace")[-2000:]
        raise QualError(errno.EIO, f"the ranks' parent exited with {proc.returncode}: {tail}")
    return json.loads(Path(job.result).read_text())


def _lost_a_peer(error: dict) -> bool:
    """A rank that lost its peer (PeerLost, or a trace from gloo) may say so before the rank
    that failed has said why: its error is an effect, not the cause."""
    return "trace" in error or error["class"] == "PeerLost"


def culprit(errors: list[dict], exits: dict[str, int]) -> tuple[int | None, dict | None]:
    """Which rank's failure to report, and the error it wrote (None: it died without writing
    one), from the ranks' errors and their exit statuses in the order they exited (EXITS).
    The first engine error (ENOSPC, EIO, ...) comes first; then the first rank that exited
    with a failure and no error written (it failed before it could write one, or a signal
    ended it): the peers that lost it say only that; then the first error written.
    (None, None) when no rank failed."""
    said = sorted(errors, key=lambda e: (_lost_a_peer(e), e["at"]))
    if said and not _lost_a_peer(said[0]):
        return said[0]["rank"], said[0]
    wrote = {e["rank"] for e in errors}
    silent = next((int(r) for r, code in exits.items() if code and int(r) not in wrote), None)
    if silent is not None:
        return silent, None
    return (said[0]["rank"], said[0]) if said else (None, None)


def _stop(proc: subprocess.Popen) -> None:
    """End the ranks' parent (its ranks die with it), SIGKILL where SIGTERM has not within 10 s."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
    workdir = own_tempdir("ckpt")
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
    workdir = own_tempdir("ckpt")
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

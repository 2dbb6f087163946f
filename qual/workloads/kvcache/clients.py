"""Several KV-cache clients at once, as MLPerf Storage v3.0 scores its closed options (its
Rules §6.3): `clients` client processes (the release's MPI ranks), each with its own users and its
own store in a folder of its own on the target, started together; `trials` such runs, one
after the other. Each client's figures are its own run's; the release aggregates them: read
and write bandwidth and storage throughput summed over clients within a trial and averaged
over trials, the device p95s the worst client's over all clients and trials (not a pooled
percentile). The drive's counters must show every byte all clients moved in a trial.

    python -m qual.workloads.kvcache.clients JOB.json     (one client: qual starts it)
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean

from qual import honesty, units, watchdog
from qual.errors import InvalidJob, QualError
from qual.targets import Target
from qual.targets.scratch import own_folder
from qual.workloads.kvcache.spec import CLOSED, OPTIONS, TEMPLATE_DEFAULTS
from qual.workloads.kvcache.workload import FOLDER, MANIFEST, settled

CLIENT = "qual.workloads.kvcache.clients"
STARTUP_S = 120.0  # the most a client may take to start and lay out its store
DEPARTURES = (
    "entries move as O_DIRECT pieces of block_size through one store file per client, not as "
    "one .npy file per entry (np.save + fsync; fadvise DONTNEED + np.load): so the drive's own "
    "counters account for every byte, and no host copy is in the device latency",
    "a request's storage I/O time is its entries' write (with its batch's fdatasync) and "
    "read, each its slowest entry's, as the server moves a batch's entries at once; the "
    "reference's threads move a request's entries one after another",
    "clients are processes on this host (the release's MPI ranks may span hosts)",
)
# where qual's serving of the reference's draw differs from the reference's own
REFERENCE_DEPARTURES = (
    "a user waits for its answer before its think time (closed loop); the reference's users "
    "send on their timer whatever the server's backlog, so its queue can grow without bound",
    "the server serves the highest QoS class's arrived requests together (continuous "
    "batching, queue_depth I/Os in flight), not each on one of min(users, 500) threads; a run "
    "ends at the first batch done past its duration",
    "the drive tier is a ring that overwrites its oldest entries, where the reference evicts "
    "the least recently used",
    "the draw's random streams are numpy's, seeded per user and conversation: seed 42 draws "
    "what the reference draws from, not its same users",
)
# qual's own draw, where a run asks for it
QUAL_DRAW_DEPARTURES = (
    "the users' context lengths, turns and generated tokens are qual's draw (context_tokens, "
    "turn_tokens, generation_tokens, requests), not the reference's user templates",
    "decode reads each entry of the conversation once per request, not once plus once per 32 "
    "generated tokens",
)


def run(target: Target, table: dict, *, seed: int, progress=None) -> dict:
    """Every trial of `clients` clients; the release's aggregates and every client's figures."""
    if target.directory is None or target.kind == "block":
        raise InvalidJob(errno.ENOTSUP, "several clients, or an MLPerf option, keep one store "
                         "each in a folder of their own: give a directory on the drive",
                         target=target.spec)
    option = table["mlperf_option"]
    seed = CLOSED["seed"] if option else seed
    table = settled(target, table, seed)  # one store each, in what the target offers
    trials = []
    for t in range(table["trials"]):
        if progress:
            progress(f"trial {t + 1} of {table['trials']}: {table['clients']} clients x "
                     f"{table['users']} users", t / table["trials"])
        before = target.device_stat()
        clients = _launch(target, table, seed, t)
        seen = honesty.between(before, target.device_stat())
        read = sum(c["read"] for c in clients)
        written = sum(c["written"] for c in clients)
        trials.append({
            "clients": clients, "device": seen,
            "read_truth": honesty.check_device(seen, "read_bytes", read, "the clients' KV "
                                               "entries read back", target.spec) if read else {},
            "write_truth": honesty.check_device(seen, "write_bytes", written, "the clients' KV "
                                                "entries written", target.spec) if written else {}})
    departures = list(DEPARTURES) + list(REFERENCE_DEPARTURES if table["draw"] == "reference"
                                         else QUAL_DRAW_DEPARTURES)
    changed = [k for k, v in table["templates"].items() if v != TEMPLATE_DEFAULTS[k]]
    if option and changed:
        departures.insert(0, f"templates changed from the reference's: {', '.join(changed)}")
    if option and table["duration"] != CLOSED["duration"]:
        departures.insert(0, f"duration {units.format_duration(table['duration'])}, not the "
                          f"option's {units.format_duration(CLOSED['duration'])}")
    return {"option": option, "option_name": OPTIONS[option]["name"] if option else None,
            "model": table["model"], "users": table["users"], "clients": table["clients"],
            "trials": trials, "seed": seed, "duration": table["duration"],
            "cpu_mem": table["cpu_mem"], "allocations": table["allocations"],
            "draw": table["draw"], "store_size": table["store_size"],
            "store_short": table.get("store_short"), "departures": departures,
            **aggregate(trials)}


def aggregate(trials: list[dict]) -> dict:
    """The release's aggregation (MLPerf Storage v3.0 Rules §6.3.4): sums over clients within
    a trial, their mean over trials; the worst client's p95 over all clients and trials."""
    every = [c for t in trials for c in t["clients"]]
    summed = {k: fmean(sum(c[k] for c in t["clients"]) for t in trials)
              for k in ("read_bw", "write_bw", "tokens_per_s", "storage_tokens_per_s")}
    wanted = sum(c["misses"] + c["decode_hits"] for c in every)
    return {
        **summed,
        "overwritten_share": sum(c["misses"] for c in every) / wanted if wanted else 0.0,
        "served_by_class": {k: sum(c["served_by_class"][k] for c in every)
                            for k in every[0]["served_by_class"]},
        "worst_read_p95": max(c["entry_read_p95"] for c in every),
        "worst_write_p95": max(c["entry_write_p95"] for c in every)}


def _launch(target: Target, table: dict, seed: int, trial: int) -> list[dict]:
    """One trial: every client started, released together once all are up, waited for (at
    most the run's duration and a startup allowance, else stopped), their figures read."""
    work = own_folder(target.directory / FOLDER) / f"clients-{os.getpid()}-{trial}"
    work.mkdir()
    (work / MANIFEST).write_text(json.dumps({"created_by": "qual"}))  # qual clean's, if left
    procs = []
    try:
        for c in range(table["clients"]):
            job = work / f"client-{c}.json"
            job.write_text(json.dumps({"target": str(target.directory), "client": c,
                                       "seed": seed + c, "table": table,
                                       "out": str(work / f"client-{c}.out.json")}))
            log = open(work / f"client-{c}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, "-m", CLIENT, str(job)],
                                          stdin=subprocess.PIPE, stdout=log, stderr=log,
                                          preexec_fn=watchdog.dies_with_me()))
            log.close()
        for p in procs:  # all started: go
            p.stdin.write(b"go\n")
            p.stdin.close()
        limit = (table["duration"] or 600.0) * 2 + STARTUP_S
        deadline = time.monotonic() + limit
        for c, p in enumerate(procs):
            try:
                status = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise QualError(errno.ETIMEDOUT, f"client {c} did not end within "
                                f"{units.format_duration(limit)}", target=target.spec) from None
            if status:
                tail = (work / f"client-{c}.log").read_text(errors="replace")[-2000:]
                raise QualError(errno.EIO, f"client {c} exited with {status}: {tail}",
                                target=target.spec)
        return [json.loads((work / f"client-{c}.out.json").read_text())
                for c in range(len(procs))]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in work.iterdir():  # the trial's own folder: made above, by it
            f.unlink()
        work.rmdir()


def client(job: dict) -> dict:
    """One client's run (its own store, its users), once qual says go; its figures."""
    from qual.workloads.kvcache.workload import _trial  # noqa: PLC0415 (the client's own)

    sys.stdin.readline()
    table = {**job["table"], "clients": 1, "trials": 1}
    r = _trial(Target(job["target"]), table, job["seed"], None)
    lat = r["latency"]
    return {"client": job["client"], "seed": job["seed"], "backend": r["backend"],
            **{k: r[k] for k in ("read", "written", "wall_s", "storage_s", "request_io_s",
                                 "tokens", "served", "served_by_class", "misses",
                                 "tokens_per_s", "storage_tokens_per_s", "read_bw",
                                 "write_bw")},
            "decode_hits": sum(r["hits"].values()),
            "entry_read_p95": lat["entry_read"].percentile(95.0) / 1e9
            if lat["entry_read"].count else 0.0,
            "entry_write_p95": lat["entry_write"].percentile(95.0) / 1e9
            if lat["entry_write"].count else 0.0,
            "e2e": r["e2e"]}


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(spec["out"]).write_text(json.dumps(client(spec)))

"""KV-cache offload (MLPerf Storage v3.0's KV-cache benchmark, with the drive's own evidence):
users' conversations whose attention KV entries an inference server keeps in host memory and
on the drive; prefill writes, decode reads back, each request timed, every byte the drive moved
checked against its counters. The store is a file in a folder of qual's, or the first bytes of
a block device that passes the guard."""

from __future__ import annotations

import math

from qual import units
from qual.family import Family, Flags, Rates, SuiteTest, Work, declares
from qual.targets import Target
from qual.thresholds import family_table
from qual.workloads.kvcache.results import ClosedOutcome, KvCacheOutcome
from qual.workloads.kvcache.spec import (CLOSED, FIELDS, LOCKED, METRICS, MODELS, NAME, cells,
                                         check_table, drive_bytes, option_table, prefix_bytes,
                                         templates, turn_entries)
from qual.workloads.kvcache import clients, workload

TESTS = (
    SuiteTest("storage", "KV-cache storage", "Prefill-write and decode-read latency on the drive, "
              "decode bytes read, hits per tier.", section="storage"),
    SuiteTest("service", "KV-cache service", "End-to-end latency per QoS class, queue wait, "
              "tokens per second (a search's answer); the per-request latency chart, and a "
              "search's trials.", section="service",
              charts=("KV-cache latency per request", "KV-cache qos search",
                      "KV-cache capacity search")),
)


def run(target: Target, table: dict, *, seed: int = 1,
        progress=None) -> KvCacheOutcome | ClosedOutcome:
    """One server (a user count, or a search), or several clients' trials: an MLPerf option,
    `clients` above 1 or `trials` above 1."""
    if table["mlperf_option"] or table["clients"] > 1 or table["trials"] > 1:
        return ClosedOutcome(clients.run(target, table, seed=seed, progress=progress),
                             str(target.path))
    return KvCacheOutcome(workload.run(target, table, seed=seed, progress=progress),
                          str(target.path))


def explain(table: dict) -> tuple[dict, list[str]]:
    """`qual kvcache --plan`: the model's bytes per token and the arithmetic, the entries a
    run writes, nothing touched."""
    m = MODELS[table["model"]]
    lo, hi = table["context_tokens"]
    mib = m.bytes_per_token / 2**20
    if table["draw"] == "reference":
        lines = [m.derivation()] + [
            f"{name} users: context {c[0]:,}..{c[1]:,} tokens = {c[0] * mib:,.1f}.."
            f"{c[1] * mib:,.1f} MiB of KV, {g[0]:,}..{g[1]:,} generated, think "
            f"{units.format_duration(t[0])}..{units.format_duration(t[1])}"
            for name, (c, g, t) in templates(table).items()]
        lines.append(f"{table['users']} users, each request a new entry of a quarter of its "
                     "user's context up to all of it, turns going on with p 0.8; the drive "
                     "tier a ring of " + (f"{table['store_size']:,} B" if table["store_size"]
                                          else "95 % of the room the target offers"))
    else:
        lines = [m.derivation(),
                 f"first turn: {lo:,}..{hi:,} tokens = {lo * mib:,.1f}..{hi * mib:,.1f} MiB "
                 f"of KV; each later turn {table['turn_tokens'] + table['generation_tokens']:,}"
                 " tokens", f"{table['users']} users x {table['requests']} requests"]
    lines.append(f"host-memory tier {table['cpu_mem']:,} B, GPU tier {table['gpu_mem']:,} B")
    if table["prefixes"]:
        lines.append(f"{table['prefixes']} shared prefixes of {table['prefix_tokens']:,} tokens = "
                     f"{prefix_bytes(table) / 2**20:,.1f} MiB each, written once, read by "
                     "every decode of the conversations that share them")
    doc = {"model": m.name, "bytes_per_token": m.bytes_per_token,
           "derivation": m.derivation(), "source": "MLPerf Storage v3.0, kv_cache_benchmark"}
    if table["mlperf_option"] or table["clients"] > 1 or table["trials"] > 1:
        store = drive_bytes(table) * table["clients"]
        seconds = table["duration"] * table["trials"]
        lines.append(f"{table['clients']} client(s) at once, each its own store of "
                     f"{drive_bytes(table):,} B ({store:,} B on the target); "
                     f"{table['trials']} trial(s) of {table['duration']:g} s: "
                     + (f"{seconds:g} s of serving" if seconds else "each until its requests "
                        "are served"))
        doc.update(clients=table["clients"], trials=table["trials"], store_bytes=store,
                   serving_s=seconds, mlperf_option=table["mlperf_option"])
    locked, changed = _settings(table)
    doc.update(settings=dict(table), locked=locked, changed=changed)
    if locked:
        lines.append("the option locks: " + ", ".join(f"{k} {v}" for k, v in locked.items()))
    lines.append("changed from " + ("the option's" if locked else "the defaults") + ": "
                 + (", ".join(f"{k} {v}" for k, v in changed.items()) or "nothing"))
    return doc, lines


def _settings(table: dict) -> tuple[dict, dict]:
    """(what an MLPerf option locks, at its values; every setting that differs from the
    option's, or without an option from the defaults): what the plan says and its JSON
    carries, so that a run's settings can be read before it starts."""
    option = table["mlperf_option"]
    given = {**option_table({"mlperf_option": option}), "mlperf_option": option} \
        if option else {}
    base = family_table(FAMILY, given)
    locked = {**{k: table[k] for k in LOCKED}, "seed": CLOSED["seed"],
              "duration": CLOSED["duration"]} if option else {}
    changed = {k: v for k, v in table.items() if v != base[k]}
    return locked, changed


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one run: a request-bound one writes every entry once and each
    turn's decode reads its conversation so far back (where host memory holds none of it); a
    duration-bound one lasts its duration; a search runs one trial per user count it tries
    (doubling up to max_users, then halving the gap: at most twice log2 of the range)."""
    if not declares(TESTS, test):
        return []
    users = table["users"] if table["mode"] == "fixed" else table["max_users"]
    clients, trials = table["clients"], table["trials"]
    if table["draw"] == "reference":  # its duration, moving at most what the drive can
        seconds = table["duration"]
        return [Work("kvcache run", seconds * trials,
                     bytes_written=seconds * rates.write_bw * trials,
                     bytes_read=seconds * rates.read_bw * trials,
                     space=table["store_size"] * clients, repeated=True,
                     what=f"the KV store ({users} users x {clients} client(s), "
                          f"{table['model']}, the reference's draw)")]
    first, later = turn_entries(table)
    read = users * sum(first + t * later + prefix_bytes(table)
                       for t in range(table["requests"]))
    written = drive_bytes(table, users)
    seconds = table["duration"] or written / rates.write_bw + read / rates.read_bw
    if table["mode"] != "fixed":
        seconds *= 2 * max(1, math.ceil(math.log2(table["max_users"] / table["users"]))) + 1
    # clients run at once, each its own store; trials one after the other
    return [Work("kvcache run", seconds * trials, bytes_written=written * clients * trials,
                 bytes_read=read * clients * trials, space=written * clients, repeated=True,
                 what=f"the KV store ({users} users x {clients} client(s), {table['model']})")]


FAMILY = Family(name=NAME, description="MLPerf Storage v3.0 KV-cache offload: prefill writes, "
                "decode reads, per request, with device truth", fields=FIELDS, metrics=METRICS,
                check=check_table, cells=cells, run=run, remove=workload.remove,
                plan=_plan, flags=Flags(defaults=option_table, explain=explain), tests=TESTS)

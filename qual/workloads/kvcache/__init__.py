"""KV-cache offload (MLPerf Storage v3.0's KV-cache benchmark, with the drive's own evidence):
users' conversations whose attention KV entries an inference server keeps in host memory and
on the drive; prefill writes, decode reads back, each request timed, every byte the drive moved
checked against its counters."""

from __future__ import annotations

from qual.family import Family, Flags, Rates, Work
from qual.target import Target
from qual.workloads.kvcache.results import KvCacheOutcome
from qual.workloads.kvcache.spec import (FIELDS, METRICS, MODELS, NAME, cells, check_table,
                                         drive_bytes, turn_entries)
from qual.workloads.kvcache import workload

RUN_TESTS = ("test_storage", "test_service")


def run(target: Target, table: dict, *, seed: int = 1, progress=None) -> KvCacheOutcome:
    return KvCacheOutcome(workload.run(target, table, seed=seed, progress=progress),
                          str(target.path))


def explain(table: dict) -> tuple[dict, list[str]]:
    """`qual kvcache --plan`: the model's bytes per token and the arithmetic, the entries a
    run writes, nothing touched."""
    m = MODELS[table["model"]]
    lo, hi = table["context_tokens"]
    lines = [m.derivation(),
             f"first turn: {lo:,}..{hi:,} tokens = {lo * m.bytes_per_token / 2**20:,.1f}.."
             f"{hi * m.bytes_per_token / 2**20:,.1f} MiB of KV; each later turn "
             f"{table['turn_tokens'] + table['generation_tokens']:,} tokens",
             f"{table['users']} users x {table['requests']} requests; host-memory tier "
             f"{table['cpu_mem']:,} B, GPU tier {table['gpu_mem']:,} B"]
    return {"model": m.name, "bytes_per_token": m.bytes_per_token,
            "derivation": m.derivation(), "source": "reference/mlperf-storage-v3.md"}, lines


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one run: at most every entry written once and every turn's
    decode reading its conversation so far back (where host memory holds none of it)."""
    if test not in RUN_TESTS:
        return []
    first, later = turn_entries(table)
    read = table["users"] * sum(first + t * later for t in range(table["requests"]))
    written = drive_bytes(table)
    return [Work("kvcache run", written / rates.write_bw + read / rates.read_bw,
                 bytes_written=written, bytes_read=read, space=written, repeated=True,
                 what=f"the KV store ({table['users']} users, {table['model']})")]


FAMILY = Family(name=NAME, description="MLPerf Storage v3.0 KV-cache offload: prefill writes, "
                "decode reads, per request, with device truth", fields=FIELDS, metrics=METRICS,
                check=check_table, cells=cells, run=run, remove=workload.remove,
                plan=_plan, filesystem=True, flags=Flags(explain=explain))

"""The KV cache's figures as MLPerf Storage v3.0 scores them, and a store that holds what it
serves: the release's storage and average throughput and tier bandwidths computed again from
a served run's per-request log, a store too small for what its users hold at once refused
before any I/O (or run with a CAVEAT), the share of decode reads the ring left nothing for,
the requests each QoS class was served, the plan's settings in JSON, and entries whose every
4 KiB differs from every other."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from qual.units import format_size
from qual.thresholds import family_table
from qual.workloads import kvcache
from qual.workloads.kvcache import draw, spec, workload
from qual.workloads.kvcache.results import KvCacheOutcome

from testbed import needs_root

SMALL = {"templates": {"chatbot_context": [64, 256], "coding_context": [128, 512],
                       "document_context": [128, 384]}}


def table(**given):
    base = {"users": 6, "block_size": "256 KiB", "model": "gpt-oss-20b", "draw": "reference",
            "duration": "1.5 s", **SMALL}
    return family_table(kvcache.FAMILY, {**base, **given})


def qual(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qual.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def served(tmp_path, t, seed=42) -> dict:
    """One run through the engine's store in a file of its own, as a run serves it."""
    store = tmp_path / "store.bin"
    with open(store, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, t["store_size"])
    with workload.open_store(str(store), t) as kv:
        return {**workload.serve(t, kv, seed=seed), "mode": "fixed", "store": str(store),
                "write_truth": {}, "read_truth": {}}


def test_the_scored_figures_are_the_releases_from_the_per_request_log(tmp_path):
    """kv_cache/benchmark.py's definitions, from every request the run served (fewer than
    the log keeps): storage throughput = tokens / the sum of each request's storage I/O time
    (from its first entry handed over to its last back, write and read; requests served
    together each counted), average throughput = tokens / the run's duration, the tier
    bandwidths = the drive tier's bytes / the duration. qual's own figure (tokens per second
    the drive was busy) is another, and is labelled so."""
    t = table(store_size="256 MiB")
    r = served(tmp_path, t)
    log = r["requests"]
    assert r["served"] == len(log) > 6
    tokens = sum(q["generated"] for q in log)
    io = sum((q["write_s"] or 0.0) + (q["read_s"] or 0.0) for q in log)
    assert r["tokens"] == tokens
    assert r["storage_tokens_per_s"] == pytest.approx(tokens / io, rel=1e-9)
    assert r["tokens_per_s"] == pytest.approx(tokens / r["wall_s"], rel=1e-9)
    assert r["read_bw"] == pytest.approx(r["read"] / r["wall_s"], rel=1e-9)
    assert r["write_bw"] == pytest.approx(r["written"] / r["wall_s"], rel=1e-9)
    assert r["drive_busy_tokens_per_s"] == pytest.approx(tokens / r["storage_s"], rel=1e-9)
    outcome = KvCacheOutcome(r, r["store"])
    got = {m.id: m.value for m in outcome.measurements()}
    assert got["kv_storage_tokens_per_s"] == r["storage_tokens_per_s"]
    assert got["kv_tokens_per_s"] == r["tokens_per_s"]
    assert got["kv_tier_bw[op=read]"] == r["read_bw"]
    assert got["kv_tier_bw[op=write]"] == r["write_bw"]
    doc = outcome.document()["mlperf"]
    assert doc == {"storage_throughput_tokens_per_sec": pytest.approx(tokens / io),
                   "avg_throughput_tokens_per_sec": r["tokens_per_s"],
                   "tier_storage_read_bandwidth_gbps": r["read_bw"] / 2**30,
                   "tier_storage_write_bandwidth_gbps": r["write_bw"] / 2**30}


def test_the_command_prints_the_scored_figures_and_records_them(tmp_path):
    """`qual kvcache --json` carries the release's names; with --profile the run record
    stored holds them as measurements."""
    folder = tmp_path / "drive"
    folder.mkdir()
    proc = qual("kvcache", "--target", str(folder), "--draw", "reference", "--duration", "1s",
                "--users", "4", "--model", "gpt-oss-20b", "--store-size", "128M",
                *[a for k, (lo, hi) in SMALL["templates"].items()
                  for a in (f"--templates-{k.replace('_', '-')}", f"{lo},{hi}")],
                "--block-size", "256K", "--json", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert set(doc["mlperf"]) == {"storage_throughput_tokens_per_sec",
                                  "avg_throughput_tokens_per_sec",
                                  "tier_storage_read_bandwidth_gbps",
                                  "tier_storage_write_bandwidth_gbps"}
    assert doc["mlperf"]["storage_throughput_tokens_per_sec"] == doc["storage_tokens_per_s"] > 0
    assert doc["storage_tokens_per_s"] == pytest.approx(doc["tokens"] / doc["request_io_s"])
    assert doc["mlperf"]["avg_throughput_tokens_per_sec"] == pytest.approx(
        doc["tokens"] / doc["wall_s"])


def test_a_store_that_cannot_hold_what_its_users_keep_in_flight_is_refused(tmp_path):
    """Before any I/O: 40 users' largest entries (the draw's own, seed 1) take more than a
    64 MiB store, so the run is refused (exit 4) with both figures and nothing made; with
    --accept-misses it runs, says the shortfall as a CAVEAT, and reports the share of decode
    reads that found their entry overwritten as a figure of its own."""
    folder = tmp_path / "drive"
    folder.mkdir()
    t = table(users=40, store_size="64 MiB")
    need = draw.held_at_once(t, 1)
    assert need > 64 << 20
    args = ["kvcache", "--target", str(folder), "--draw", "reference", "--duration", "1s",
            "--users", "40", "--model", "gpt-oss-20b", "--store-size", "64M",
            *[a for k, (lo, hi) in SMALL["templates"].items()
              for a in (f"--templates-{k.replace('_', '-')}", f"{lo},{hi}")],
            "--block-size", "256K", "-q"]
    refused = qual(*args, cwd=tmp_path)
    assert refused.returncode == 4, refused.stderr
    assert refused.stderr.startswith("qual kvcache: refused: "), refused.stderr
    assert "the store of 64 MiB cannot hold what the 40 users keep in flight at once " \
           f"({format_size(need)}" in refused.stderr, refused.stderr
    assert "--accept-misses" in refused.stderr
    assert not list(folder.iterdir())
    ran = qual(*args, "--accept-misses", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    caveats = [line for line in ran.stdout.splitlines() if line.startswith("CAVEAT: ")]
    assert caveats[0].startswith("CAVEAT: the store of 64 MiB cannot hold"), ran.stdout
    assert any(line.startswith("kv_overwritten_reads = ") for line in ran.stdout.splitlines())


def test_the_overwritten_share_is_said_above_a_tenth_and_not_below(tmp_path):
    """The share of decode's reads that found nothing (the ring overwrote their entry) is
    misses / (misses + reads served): a ring of 24 MiB for six users loses many, and the run
    says so on its scored figures; a store that holds the run loses none and says nothing."""
    small = served(tmp_path, table(store_size="24 MiB"))
    wanted = small["misses"] + sum(small["hits"].values())
    assert small["overwritten_share"] == small["misses"] / wanted > 0.10
    scored = {m.id: m for m in KvCacheOutcome(small, "x").measurements()}
    assert scored["kv_overwritten_reads"].value == small["overwritten_share"]
    assert any("overwritten by the ring" in c for c in scored["kv_storage_tokens_per_s"].caveats)
    roomy = served(tmp_path, table(store_size="1 GiB"))
    assert roomy["misses"] == 0 and roomy["overwritten_share"] == 0.0
    scored = {m.id: m for m in KvCacheOutcome(roomy, "x").measurements()}
    assert not any("overwritten" in c for c in scored["kv_storage_tokens_per_s"].caveats)


def test_each_class_s_requests_served_are_a_figure_and_none_is_said(tmp_path):
    """Requests served per QoS class, each class of the draw named even at 0; the classes
    add up to every request served."""
    r = served(tmp_path, table(users=12, store_size="512 MiB"))
    got = {m.id: m.value for m in KvCacheOutcome(r, "x").measurements()
           if m.metric == "kv_requests_served"}
    assert set(got) == {f"kv_requests_served[class={c}]" for c in spec.QOS}
    assert sum(got.values()) == r["served"]
    assert {c: n for c, n in r["served_by_class"].items()} == {
        c: sum(q["qos"] == c for q in r["requests"]) for c in spec.QOS}


def test_the_plan_in_json_carries_what_the_option_locks_and_what_was_changed(tmp_path):
    proc = qual("kvcache", "--mlperf-option", "1", "--plan", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["locked"] == {"model": "llama3.1-8b", "users": 200, "cpu_mem": 0, "gpu_mem": 0,
                             "allocations": 16, "trials": 3, "mode": "fixed",
                             "draw": "reference", "seed": 42, "duration": 300.0}
    assert doc["changed"] == {}
    assert doc["settings"]["templates"]["coding_context"] == [4096, 25000]
    assert doc["settings"]["cpu_mem"] == 0 and doc["settings"]["gpu_mem"] == 0
    proc = qual("kvcache", "--mlperf-option", "1", "--duration", "60s", "--block-size", "256K",
                "--plan", "--json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert doc["changed"] == {"duration": 60.0, "block_size": 256 << 10}
    proc = qual("kvcache", "--users", "3", "--plan", "--json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert doc["locked"] == {} and doc["changed"] == {"users": 3}


@needs_root
def test_every_4_kib_the_run_writes_differs_from_every_other(tmp_path, ram_device,
                                                              loop_device):
    """Entries of 156 MiB (499 or 500 tokens of llama3.1-70b), longer than the engine's 64 MiB
    buffer: two 64 MiB stretches of the first entry and one of the second, read back from
    the store after the run, hold no 4 KiB block twice (each is stamped with the run's mark
    and a counter over random bytes). Repeating one buffer, as before, repeated every block."""
    folder = loop_device.mount(ram_device(1 << 30), options="noatime")
    t = family_table(kvcache.FAMILY, {"users": 2, "requests": 1, "context_tokens": [499, 500],
                                      "model": "llama3.1-70b", "block_size": "1 MiB"})
    entry = spec.entry_bytes(500, spec.MODELS["llama3.1-70b"].bytes_per_token)
    assert entry >= 2 * workload.POOL
    store = folder / "store.bin"
    with open(store, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, spec.drive_bytes(t))
    with workload.open_store(str(store), t) as kv:
        r = workload.serve(t, kv, seed=1)
    assert r["written"] >= 2 * (entry - 2 * workload.POOL)
    region = spec.conversation_bytes(t)
    seen: set[bytes] = set()
    blocks = 0
    fd = os.open(store, os.O_RDONLY)
    try:
        for start in (0, workload.POOL, region):
            os.posix_fadvise(fd, start, workload.POOL, os.POSIX_FADV_DONTNEED)
            stretch = os.pread(fd, workload.POOL, start)
            assert len(stretch) == workload.POOL
            for at in range(0, len(stretch), 4096):
                seen.add(hashlib.blake2b(stretch[at:at + 4096], digest_size=16).digest())
                blocks += 1
    finally:
        os.close(fd)
    assert blocks == 3 * workload.POOL // 4096 == len(seen)

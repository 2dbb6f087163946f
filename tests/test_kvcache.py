"""The KV-cache family (MLPerf Storage v3.0's KV-cache workload): the model table's bytes per
token as the reference gives them, a fixed-user run whose drive bytes match the device's own
counters, the host-memory tier in front of the drive, a duration-bound run whose users start
new conversations in the room of their last, the qos and capacity searches, a block-device
store behind the guard, a profile judging the search's answer, and refusals before any I/O."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from qual.errors import ImplausibleMeasurement, TargetUnavailable
from qual.targets.guard import UnsafeTarget
from qual.targets import Target
from qual.thresholds import ProfileError, family_table
from qual.workloads import kvcache
from qual.workloads.kvcache import draw, spec
from qual.workloads.kvcache.spec import MODELS, conversation_bytes, prefix_bytes
from qual.workloads.kvcache import workload
from qual.workloads.kvcache.tally import KEPT, Tally
from qual.workloads.kvcache.workload import (Request, Tiers, holds, search_capacity, serve,
                                             search_qos)

from testbed import detach_loop, needs_root, sh, sha256_of


def table(**given):
    base = {"users": 4, "requests": 3, "context_tokens": [16, 64], "turn_tokens": 16,
            "generation_tokens": 8, "store_size": "256 MiB", "block_size": "256 KiB"}
    return family_table(kvcache.FAMILY, {**base, **given})


@pytest.mark.parametrize("model, per_token", [
    ("llama3.1-8b", 131_072), ("llama3.1-70b", 327_680), ("deepseek-v3", 70_272),
    ("mistral-7b", 131_072), ("llama2-7b", 524_288), ("qwen3-32b", 262_144)])
def test_plan_prints_the_bytes_per_token(tmp_path, model, per_token):
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "kvcache", "--plan", "--model",
                           model, "--json"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["bytes_per_token"] == per_token == MODELS[model].bytes_per_token
    assert f"= {per_token:,} B/token" in doc["derivation"]
    assert not list(tmp_path.iterdir())  # nothing made


@needs_root
def test_a_fixed_user_run_moves_what_the_device_counts(tmp_path, loop_device):
    """Every prefill write and decode read goes to the drive (no host-memory tier): the bytes
    written and read equal the device's counters within 2 %, each request is timed."""
    folder = loop_device.mount(loop_device(512 << 20), options="noatime")
    t = table()
    outcome = kvcache.run(Target(folder), t, seed=3)
    r = outcome.result
    dev = r["device"]
    assert r["written"] > 0 and r["read"] > 0
    assert abs(dev["write_bytes"] - r["written"]) <= 0.02 * r["written"]
    assert abs(dev["read_bytes"] - r["read"]) <= 0.02 * r["read"]
    assert r["served"] == len(r["requests"]) == 4 * 3 and r["tokens"] == 4 * 3 * 8
    assert all(q["write_s"] > 0 and q["read_s"] > 0 for q in r["requests"])
    assert r["hits"] == {"cpu": 0, "drive": 4 * (1 + 2 + 3)}  # each turn reads its whole past
    found = {m.id: m for m in outcome.measurements()}
    assert found["kv_decode_bytes_read"].value == r["read"]
    assert found["kv_decode_bytes_read"].device_truth == "counted"
    kvcache.FAMILY.remove(Target(folder))
    assert not (folder / "qual-kvcache").exists()


@needs_root
def test_decode_reads_a_cache_served_are_refused(tmp_path, loop_device):
    """Device truth: the store is a loop device whose backing file lives on the qualified
    drive's filesystem, so each write batch's flush reaches the drive, but the decode reads
    come back from that file's page cache, never from the drive: the run is an error that
    says so."""
    drive = loop_device.mount(loop_device(256 << 20), options="noatime")
    backing = drive / "store.img"
    with open(backing, "wb") as f:
        f.truncate(128 << 20)
    store = sh("losetup", "--find", "--show", str(backing))
    try:
        with pytest.raises(ImplausibleMeasurement, match="of KV entries read back: they did "
                           "not reach the device"):
            workload._serve(Target(drive), table(store_size="128 MiB"), store, 3, None)
    finally:
        detach_loop(store, backing)


def test_host_memory_serves_what_it_holds(tmp_path):
    """A host-memory tier that holds every entry: nothing is written or read on the drive;
    one that holds a few: the least recently used go down to the drive."""
    everything = kvcache.run(Target(tmp_path), table(cpu_mem="1 GiB")).result
    assert everything["written"] == everything["read"] == 0
    assert everything["hits"]["drive"] == 0 and everything["hits"]["cpu"] == 4 * (1 + 2 + 3)
    some = kvcache.run(Target(tmp_path), table(cpu_mem="16 MiB")).result
    assert some["written"] > 0 and 0 < some["hits"]["cpu"] < 4 * (1 + 2 + 3)
    kvcache.FAMILY.remove(Target(tmp_path))


def test_a_gpu_tier_without_cuda_is_refused_before_any_io(tmp_path):
    with pytest.raises(TargetUnavailable, match="needs CUDA"):
        kvcache.run(Target(tmp_path), table(gpu_mem="1 GiB"))
    assert not (tmp_path / "qual-kvcache").exists()


def test_a_store_too_small_is_refused_with_its_arithmetic():
    with pytest.raises(ProfileError) as e:
        table(users=64, context_tokens=[512, 1024], store_size="1 GiB")
    assert any(k.endswith("store_size") and "cannot hold the run's KV entries" in p
               for _, k, p in e.value.problems)


@pytest.mark.slow
def test_a_duration_bound_run_starts_new_conversations_in_the_room_of_the_last(tmp_path):
    """Users keep talking for the duration: a user whose conversation ended starts its next
    one, whose entries take the ended one's place in the user's region of the store (a store
    of users x one conversation holds the whole run)."""
    t = table(duration="1 s", store_size=0, cpu_mem=0)
    r = kvcache.run(Target(tmp_path), t, seed=5).result
    assert r["served"] == len(r["requests"])  # few enough that every one is kept
    convs = {(q["user"], q["conversation"]) for q in r["requests"]}
    assert max(c for _, c in convs) >= 2  # every user went past its first conversation
    assert r["served"] > 4 * 3 and r["wall_s"] >= 1.0
    assert r["written"] > 4 * conversation_bytes(t)  # more than the store: its room reused
    # each request read back its own conversation's turns so far, not an ended one's
    assert r["hits"]["drive"] == sum(q["turn"] + 1 for q in r["requests"])
    # host memory for one conversation a user: an ended one leaves it, nothing goes down
    r = kvcache.run(Target(tmp_path), {**t, "cpu_mem": 4 * conversation_bytes(t)}).result
    assert r["written"] == r["read"] == r["hits"]["drive"] == 0
    assert max(q["conversation"] for q in r["requests"]) >= 2
    kvcache.FAMILY.remove(Target(tmp_path))


@pytest.mark.parametrize("limit, start, step, most, want", [
    (37, 8, 4, 256, (36, 40)),     # grows 8, 16, 32, 64; then halves 32..64 to one step
    (37, 1, 1, 256, (37, 38)),
    (3, 8, 1, 256, (3, 4)),        # the first fails: the search goes below it
    (0, 8, 2, 256, (0, 2)),        # nothing holds, not even one step
    (10 ** 6, 8, 8, 100, (96, None)),  # everything up to max_users (on the step's grid) holds
])
def test_the_qos_search_ends_between_a_count_that_held_and_one_step_more_that_did_not(
        limit, start, step, most, want):
    tried = []

    def held(users):
        tried.append(users)
        return users <= limit
    assert search_qos(held, start, step, most) == want
    lo, hi = want
    assert (not lo or lo in tried) and (hi is None or hi in tried)  # both answers were run
    assert len(tried) == len(set(tried)) <= 2 * 8 + 1  # no count twice, log2 many


def test_the_capacity_search_stops_where_doubling_users_no_longer_adds_throughput():
    curve = {2: 100.0, 4: 190.0, 8: 350.0, 16: 360.0, 32: 340.0}
    tried = []

    def throughput(users):
        tried.append(users)
        return curve[users]
    assert search_capacity(throughput, 2, 32) == 16  # 8 -> 16 grew under 5 %: the top
    assert tried == [2, 4, 8, 16]
    assert search_capacity(lambda n: 100.0 / n, 2, 32) == 2


@needs_root
def test_a_qos_search_on_a_drive_answers_with_a_run_that_held_and_one_that_did_not(
        tmp_path, loop_device):
    """The search's answer ran and held every class's targets; the count one step above it
    ran and did not: both runs are in the trials, as the judge's context shows them."""
    folder = loop_device.mount(loop_device(768 << 20), options="noatime")
    t = table(mode="qos", users=2, search_step=2, max_users=64, store_size=0,
              classes=["interactive"], qos={"interactive_p95": "30 ms", "interactive_p99": "30 ms"})
    outcome = kvcache.run(Target(folder), t, seed=2)
    r = outcome.result
    trials = {x["users"]: x for x in r["trials"]}
    assert r["failed_at"] is not None, "64 users held 30 ms: the test's drive is too fast"
    assert r["failed_at"] == r["max_users"] + 2 and not trials[r["failed_at"]]["held"]
    if r["max_users"]:
        assert trials[r["max_users"]]["held"] and holds(r, t) and r["users"] == r["max_users"]
    found = {m.id: m for m in outcome.measurements()}
    assert found["kv_max_users"].value == r["max_users"]
    assert found["kv_max_users"].context["failed_at"] == r["failed_at"]
    assert r["read_truth"]["device_truth"] == "counted"  # the answer's run, device-checked
    charts = outcome.charts()
    assert set(charts) == {"KV-cache latency per request", "KV-cache qos search"}
    assert all(png.startswith(b"\x89PNG") and len(png) > 10_000 for png in charts.values())
    kvcache.FAMILY.remove(Target(folder))


@needs_root
def test_a_block_device_store_is_refused_without_consent_and_counted_with_it(loop_device):
    """On a block device the store is its first bytes: nothing is written until the guard
    passes (the device's bytes unchanged after a refusal), and a run with consent moves what
    the device counts."""
    dev = loop_device(256 << 20)
    before = sha256_of(dev)
    with pytest.raises(UnsafeTarget):
        kvcache.run(Target(dev), table(store_size=0))
    assert sha256_of(dev) == before
    target = Target(dev, allow_destructive=True, confirm_serial=Target(dev).identity.serial)
    try:
        r = kvcache.run(target, table(store_size=0)).result
    finally:
        target.unlock()
    assert r["store"] == dev and r["written"] > 0 and r["read"] > 0
    assert abs(r["device"]["write_bytes"] - r["written"]) <= 0.02 * r["written"]
    assert abs(r["device"]["read_bytes"] - r["read"]) <= 0.02 * r["read"]


PROFILE = """
[profile]
description = "a drive must serve {least} users of the batch class"

[kvcache]
mode = "qos"
users = 2
max_users = 4
requests = 2
context_tokens = [16, 32]
turn_tokens = 16
generation_tokens = 8
block_size = "256 KiB"
classes = ["batch"]
qos = {{ batch_p95 = "60 s", batch_p99 = "60 s" }}

[[kvcache.criteria]]
metric = "kv_max_users"
min = {least}
unit = "count"
source = "the test's"
severity = "critical"
"""


@pytest.mark.parametrize("least, status", [(4, 0), (5, 1)])
def test_a_profile_judges_the_most_users_at_the_class_target(tmp_path, least, status):
    profile = tmp_path / "kv.toml"
    profile.write_text(PROFILE.format(least=least))
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "kvcache", "--target",
                           str(tmp_path), "--profile", str(profile), "--json", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["max_users"] == 4 and doc["failed_at"] is None  # 60 s holds everywhere
    assert [v["passed"] for v in doc["verdicts"]] == [status == 0]
    assert not (Path(tmp_path) / "qual-kvcache").exists()


@pytest.mark.slow
def test_the_command_says_what_it_ran_and_its_verdict_and_paces_its_progress(tmp_path):
    """`qual kvcache --profile ci`: the model, the users and the sizes it ran; a verdict line
    (the ci profile judges no kvcache figure: it says so rather than PASS); progress at most a
    line every 10 s, the last one held back shown at the end (the run's 400-odd requests
    printed 103 lines)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "kvcache", "--target",
                           str(tmp_path), "--profile", "ci", "--store", "off"],
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.splitlines()
    assert out[0].startswith(f"ran: kvcache on {tmp_path}: model=llama3.1-8b mode=fixed users=4")
    assert "block_size=256 KiB" in out[0] and "duration=2 s" in out[0]
    assert out[-1] == "verdict: measured (profile ci has no kvcache criteria: nothing judged)"
    paced = [x for x in proc.stderr.splitlines() if x.startswith("qual kvcache: [")]
    assert 1 <= len(paced) <= 2 + took // 10, proc.stderr
    assert paced[-1].startswith("qual kvcache: [100 %]")  # the last, held back, at the end


def test_the_higher_class_is_served_first_and_its_latency_shows_it(tmp_path):
    """The reference's queue serves interactive before responsive before batch: with every
    user ready at once, each batch serves its interactive requests first, so their end-to-end
    latency is the lowest and the batch class's the highest (every class had identical p95 and
    p99 when a batch was served as one)."""
    outcome = kvcache.run(Target(tmp_path), table(users=6, requests=4, context_tokens=[64, 128]),
                          seed=3)
    r = outcome.result
    e2e = {c: p95 for c, (p95, _) in r["e2e"].items()}
    assert e2e["interactive"] < e2e["responsive"] < e2e["batch"], e2e
    kept = {c: [q for q in r["requests"] if q["qos"] == c] for c in e2e}
    waits = {c: max(q["started"] - q["arrival"] for q in kept[c]) for c in kept}
    assert waits["interactive"] < waits["batch"]  # the lower class waited for the higher one


def test_a_class_the_higher_ones_starve_is_said_not_hidden(tmp_path):
    """With no pause between requests the interactive user, served first whenever it has a
    request waiting, keeps a duration-bound server busy: the other classes serve nothing, and
    the run says so on its throughput rather than report two classes fewer."""
    outcome = kvcache.run(Target(tmp_path), table(users=3, duration="1 s"), seed=3)
    assert set(outcome.result["e2e"]) == {"interactive"}
    (tokens,) = [m for m in outcome.measurements() if m.metric == "kv_tokens_per_s"]
    assert [c.split(":")[0] for c in tokens.caveats] == ["class responsive served no request",
                                                          "class batch served no request"]


class FileStore:
    """A store of the server's entries in a real file (pwrite + fdatasync, pread), which
    keeps the size of every write batch the server hands it."""

    backend = "pwrite"

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.batches: list[int] = []
        self.log: list[tuple[str, int, int]] = []  # (op, offset, bytes) of every entry moved

    def _moved(self, entries, op) -> SimpleNamespace:
        started, lat, starts, moved = time.perf_counter(), [], [], 0
        for offset, buf, *length in entries:
            nbytes = length[0] if length else len(buf)
            t = time.perf_counter()
            starts.append(t - started)
            for at in range(0, nbytes, len(buf)):  # a longer entry repeats its buffer
                piece = buf[:min(len(buf), nbytes - at)]
                if op == "write":
                    os.pwrite(self.fd, piece, offset + at)
                else:
                    os.preadv(self.fd, [piece], offset + at)
            lat.append(time.perf_counter() - t)
            self.log.append((op, offset, nbytes))
            moved += nbytes
        sync = 0.0
        if op == "write":
            t = time.perf_counter()
            os.fdatasync(self.fd)
            sync = time.perf_counter() - t
            self.batches.append(len(entries))
        return SimpleNamespace(bytes=moved, latencies=lat, starts=starts,
                               elapsed=time.perf_counter() - started, sync_s=sync)

    def write(self, entries):
        return self._moved(entries, "write")

    def read(self, entries):
        return self._moved(entries, "read")


def test_concurrent_allocations_bound_the_entries_a_round_writes_at_once(tmp_path):
    """The reference's max-concurrent-allocs: 16 users arrive together; with allocations = 3
    no write batch holds more than 3 entries, with 0 the round's entries go at once."""
    sizes = {}
    for allocations in (3, 0):
        store = FileStore(tmp_path / f"store-{allocations}.bin")
        serve(table(users=16, requests=2, allocations=allocations, classes=["batch"]), store,
              seed=1)
        sizes[allocations] = store.batches
        os.close(store.fd)
    assert max(sizes[3]) == 3 and sum(sizes[3]) == sum(sizes[0]) == 32
    assert max(sizes[0]) == 16


@needs_root
@pytest.mark.slow
def test_an_mlperf_option_with_two_clients_is_scored_as_the_release_scores_it(
        tmp_path, ram_device, loop_device):
    """`qual kvcache --mlperf-option 1 --clients 2` (2 s a trial, small templates): three
    trials of two clients of 200 users each, seed 42, the reference's draw; read and write
    bandwidth and storage throughput summed over clients and averaged over trials, the
    device p95s the worst client's; the drive counted every byte; the departures listed,
    the shortened duration first, the changed templates next."""
    folder = loop_device.mount(ram_device(4 << 30), options="noatime")
    small = [a for name in spec.TEMPLATES for a in (
        f"--templates-{name}-context", "16,32", f"--templates-{name}-generation", "8,32")]
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "kvcache", "--target",
                           str(folder), "--mlperf-option", "1", "--clients", "2",
                           "--duration", "2s", *small, "--block-size", "256K", "--json", "-q"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert (doc["option"], doc["users"], doc["clients"], doc["seed"]) == (1, 200, 2, 42)
    assert len(doc["trials"]) == 3 and all(len(t["clients"]) == 2 for t in doc["trials"])
    every = [c for t in doc["trials"] for c in t["clients"]]
    assert [c["seed"] for c in doc["trials"][0]["clients"]] == [42, 43]
    sums = [sum(c["read"] / c["wall_s"] for c in t["clients"]) for t in doc["trials"]]
    assert doc["read_bw"] == pytest.approx(sum(sums) / 3)
    assert doc["worst_read_p95"] == max(c["entry_read_p95"] for c in every) > 0
    assert doc["worst_write_p95"] == max(c["entry_write_p95"] for c in every) > 0
    assert doc["storage_tokens_per_s"] == pytest.approx(
        sum(sum(c["storage_tokens_per_s"] for c in t["clients"]) for t in doc["trials"]) / 3)
    for c in every:  # each client's, by the release's definitions
        assert c["storage_tokens_per_s"] == pytest.approx(c["tokens"] / c["request_io_s"])
        assert c["tokens_per_s"] == pytest.approx(c["tokens"] / c["wall_s"])
    assert doc["tokens_per_s"] == pytest.approx(
        sum(sum(c["tokens_per_s"] for c in t["clients"]) for t in doc["trials"]) / 3)
    assert doc["mlperf"]["storage_throughput_tokens_per_sec"] == doc["storage_tokens_per_s"]
    assert sum(doc["served_by_class"].values()) == sum(c["served"] for c in every)
    assert set(doc["served_by_class"]) == set(spec.QOS)
    for t in doc["trials"]:
        assert t["read_truth"]["device_truth"] == t["write_truth"]["device_truth"] == "counted"
    assert doc["departures"][0].startswith("duration 2 s, not the option's 5 min")
    assert doc["departures"][1] == "templates changed from the reference's: " + ", ".join(
        f"{name}_{what}" for name in spec.TEMPLATES for what in ("context", "generation"))
    assert doc["draw"] == "reference" and any("ring" in d for d in doc["departures"])
    assert not (folder / "qual-kvcache").exists()


def test_an_option_refuses_a_locked_value_before_any_io(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "kvcache", "--target",
                           str(tmp_path), "--mlperf-option", "2", "--cpu-mem", "1G"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--cpu-mem: option 2 fixes cpu_mem at 4294967296" in proc.stderr
    assert not (tmp_path / "qual-kvcache").exists()


def test_a_shared_prefix_is_written_once_and_read_by_every_decode(tmp_path):
    """Two system prompts shared by four users: each prefix's entry is written once, by the
    first request that needs it, and every decode of every conversation reads it back."""
    alone = kvcache.run(Target(tmp_path), table(), seed=4).result
    shared_t = table(prefixes=2, prefix_tokens=32)
    shared = kvcache.run(Target(tmp_path), shared_t, seed=4).result
    each = prefix_bytes(shared_t)
    assert each == 32 * MODELS["llama3.1-8b"].bytes_per_token
    assert shared["written"] - alone["written"] == 2 * each
    assert shared["read"] - alone["read"] == shared["served"] * each
    assert shared["hits"]["drive"] - alone["hits"]["drive"] == shared["served"]
    kvcache.FAMILY.remove(Target(tmp_path))


def test_memory_tiers_cascade_least_recently_used_entries_down_to_the_drive():
    """GPU memory first, then host memory, each evicting its least recently used entry to
    the next; what host memory evicts goes to the drive. A hit refreshes an entry."""
    t = Tiers([("gpu", 2), ("cpu", 2)], region=8, first=1, later=1, ring=16)
    assert t.place("a", 1) == t.place("b", 1) == []        # gpu: a b
    assert t.place("c", 1) == [] and t.where("a") == "cpu"  # a down to cpu
    assert t.where("b") == "gpu"                            # b refreshed: c is the oldest
    assert t.place("d", 1) == [] and t.where("c") == "cpu"  # c down; cpu: a c
    assert t.place("e", 1) == [("a", 1)]                    # b down, a off the end
    assert t.place("big", 3) == [("big", 3)]                # fits no tier: the drive
    assert t.offset_for("a", 1) == 0 and t.offset_for("big", 3) == 1  # the server writes them
    assert t.where("a") == t.where("big") == "drive"


def test_the_ring_overwrites_its_oldest_entries_and_forgets_them():
    """The reference draw's drive tier: entries one after another, from the start again where
    the next would pass the end; what it overlaps is no longer on the drive."""
    t = Tiers([], region=0, first=0, later=0, ring=10)
    assert [t.offset_for(k, 3) for k in "abc"] == [0, 3, 6]
    assert t.offset_for("d", 4) == 0                        # 6 + 4 > 10: back to the start
    assert t.where("a") is None and t.where("b") is None    # 0..4 took a and b
    assert t.where("c") == t.where("d") == "drive"
    assert t.offset_for("e", 6) == 4 and t.where("c") is None


@pytest.mark.parametrize("given, key", [
    ({"mode": "qos", "users": 64, "max_users": 32}, "users"),
    ({"mode": "capacity", "users": 64, "max_users": 32}, "users"),
    ({"mode": "qos", "search_step": 64, "max_users": 32}, "search_step"),
])
def test_a_search_that_cannot_run_is_refused_before_any_io(given, key):
    with pytest.raises(ProfileError) as e:
        table(**given)
    assert any(k.endswith(f"kvcache.{key}") for _, k, _ in e.value.problems), e.value.problems


def test_a_long_run_keeps_its_latencies_in_bounded_memory():
    """A run of days serves millions of requests: the tally keeps each latency in a histogram
    whose percentiles are those of every request (within its 0.78 % buckets), and a uniform
    sample of KEPT requests whole, never more."""
    rng = np.random.default_rng(7)
    tally = Tally(["interactive", "batch"], seed=1)
    e2e = {"interactive": [], "batch": []}
    for i in range(6 * KEPT):
        qos = "interactive" if i % 3 else "batch"
        r = Request(user=i % 8, conversation=0, turn=i, qos=qos, new_tokens=8,
                    arrival=i * 1e-3, started=i * 1e-3 + 1e-4,
                    done=i * 1e-3 + float(rng.lognormal(-6, 1)), write_s=2e-4, read_s=None)
        tally.add(r)
        e2e[qos].append(r.done - r.arrival)
    assert tally.served == 6 * KEPT and len(tally.kept) == KEPT
    assert len({q["turn"] for q in tally.kept}) == KEPT  # distinct requests
    assert max(q["turn"] for q in tally.kept) > 3 * KEPT  # drawn from the whole run
    for c, (p95, p99) in tally.e2e_tail().items():
        assert p95 == pytest.approx(np.percentile(e2e[c], 95), rel=0.01)
        assert p99 == pytest.approx(np.percentile(e2e[c], 99), rel=0.01)
    assert tally.storage["write"].count == 6 * KEPT and tally.storage["read"].count == 0


SMALL_TEMPLATES = {"templates": {"chatbot_context": [64, 256], "coding_context": [128, 512],
                                 "document_context": [128, 384]}}


def test_the_reference_draw_draws_what_the_reference_draws():
    """MLPerf's kv_cache_benchmark's users and requests: templates picked alike, QoS classes
    15 / 35 / 50 %, each user's lengths inside its template; a request's context from a
    quarter of its user's up to all of it, less a system prompt's tokens one time in five;
    conversations 5 turns long on average (going on with p 0.8), 50 at most; decode reading
    its entry 1 + ceil(generated / 32) times, and not at all from 10,000 tokens on; the same
    seed, the same draw."""
    t = table(draw="reference", duration="1 s", store_size=0)
    users = [draw.profile(t, 42, u) for u in range(3000)]
    assert users[:50] == [draw.profile(t, 42, u) for u in range(50)]
    assert users[:50] != [draw.profile(t, 43, u) for u in range(50)]
    # the shares as the reference writes them, not read back from qual's own constant
    shares = [("interactive", 0.15), ("responsive", 0.35), ("batch", 0.50)]
    for name, share in [(n, 1 / 3) for n in spec.TEMPLATES] + shares:
        got = sum(name in (p.template, p.qos) for p in users) / len(users)
        assert abs(got - share) < 0.03, (name, got)
    for p in users:
        (c_lo, c_hi), (g_lo, g_hi), (t_lo, t_hi) = spec.TEMPLATES[p.template]
        assert c_lo <= p.context <= c_hi and g_lo <= p.generation <= g_hi
        assert t_lo <= p.think <= t_hi
    turns, lengths = [], []
    for u, p in enumerate(users[:600]):
        for c in range(4):
            conv = draw.conversation(p, 42, u, c)
            lengths.append(len(conv))
            for turn in conv:
                whole = turn.tokens + turn.system_prompt
                assert max(1, p.context // 4) <= whole <= p.context
                assert max(1, p.generation // 4) <= turn.generated <= p.generation
                assert 0.8 * p.think <= turn.pause <= 1.2 * p.think
                assert turn.decode_reads == (0 if whole >= 10_000 else
                                             1 + -(-turn.generated // 32))
                turns.append(turn)
    assert 4.6 < np.mean(lengths) < 5.4 and max(lengths) <= 50
    assert any(t.decode_reads == 0 for t in turns) and any(t.decode_reads for t in turns)
    prompted = [t.system_prompt for t in turns if t.system_prompt]
    assert abs(len(prompted) / len(turns) - 0.2) < 0.03 and set(prompted) == {5, 9, 6}


def test_the_reference_draw_is_served_as_the_reference_serves_it(tmp_path):
    """Each request writes one whole new entry of its own tokens; decode reads each earlier
    turn of its conversation once and its own entry decode_reads times; the drive tier is a
    ring smaller than the run, so older entries are overwritten: a read never names bytes a
    later entry took (they count as misses instead), and every write lies inside the ring;
    tokens are each request's own generated tokens."""
    ring = 24 << 20
    t = table(draw="reference", duration="1.5 s", users=6, store_size=ring, **SMALL_TEMPLATES,
              model="gpt-oss-20b")
    store = FileStore(tmp_path / "store.bin")
    r = serve(t, store, seed=42)
    os.close(store.fd)
    served = r["requests"]
    assert r["served"] == len(served) > 6
    bpt = MODELS["gpt-oss-20b"].bytes_per_token
    assert r["written"] == sum(spec.entry_bytes(q["new_tokens"], bpt) for q in served)
    assert r["hits"]["drive"] + r["misses"] == sum(q["turn"] + q["decode_reads"]
                                                   for q in served)
    assert r["misses"] > 0 and any(q["turn"] > 0 for q in served)
    assert r["tokens"] == sum(q["generated"] for q in served)
    live: dict[int, int] = {}  # offset -> bytes of the entries the ring holds
    for op, offset, nbytes in store.log:
        if op == "write":
            assert offset + nbytes <= ring
            live = {o: n for o, n in live.items() if o + n <= offset or o >= offset + nbytes}
            live[offset] = nbytes
        else:
            assert live.get(offset) == nbytes, (offset, nbytes)
    assert sum(op == "read" for op, _, _ in store.log) == r["hits"]["drive"]


@needs_root
@pytest.mark.slow
def test_the_reference_draw_on_a_drive_moves_what_the_device_counts(tmp_path, ram_device,
                                                                    loop_device):
    """`qual kvcache --draw reference` with no store_size takes 95 % of the room the target
    offers, as the reference does; an entry larger than the engine's 64 MiB buffer moves by
    repeating it; the device's counters equal what the run says it wrote and read."""
    folder = loop_device.mount(ram_device(1 << 30), options="noatime")
    t = table(draw="reference", duration="2 s", users=4, store_size=0,
              templates={"chatbot_context": [600, 700], "coding_context": [600, 700],
                         "document_context": [600, 700]})
    assert spec.entry_bytes(700, MODELS["llama3.1-8b"].bytes_per_token) > workload.POOL
    target = Target(folder)
    offered = target.capacity
    r = kvcache.run(target, t, seed=42).result
    assert r["written"] > 0 and r["read"] > 0
    assert r["device"]["write_bytes"] == pytest.approx(r["written"], rel=0.02)
    assert r["device"]["read_bytes"] == pytest.approx(r["read"], rel=0.02)
    assert r["store_bytes"] == int(0.95 * offered) // 4096 * 4096
    kvcache.FAMILY.remove(target)


def test_a_reference_store_that_cannot_hold_its_largest_entry_is_refused_before_any_io(
        tmp_path):
    with pytest.raises(ProfileError, match=r"cannot hold the draw's largest entry \(3,276,800,"
                       r"000 B\)"):
        table(draw="reference", duration="1 s", store_size="1 GiB")
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "kvcache", "--target",
                           str(tmp_path), "--draw", "reference"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "--duration: draw reference serves for a duration" in \
        proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())

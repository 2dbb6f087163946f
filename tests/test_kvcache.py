"""The KV-cache family (MLPerf Storage v3.0's KV-cache workload): the model table's bytes per
token as the reference gives them, a fixed-user run whose drive bytes match the device's own
counters, the host-memory tier in front of the drive, and refusals before any I/O."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qual.errors import TargetUnavailable
from qual.target import Target
from qual.thresholds import ProfileError, family_table
from qual.workloads import kvcache
from qual.workloads.kvcache.spec import MODELS

from testbed import needs_root


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
    assert len(r["requests"]) == 4 * 3 and r["tokens"] == 4 * 3 * 8
    assert all(q["write_s"] > 0 and q["read_s"] > 0 for q in r["requests"])
    assert r["hits"] == {"cpu": 0, "drive": 4 * (1 + 2 + 3)}  # each turn reads its whole past
    found = {m.id: m for m in outcome.measurements()}
    assert found["kv_decode_bytes_read"].value == r["read"]
    assert found["kv_decode_bytes_read"].context["device_truth"] == "counted"
    kvcache.FAMILY.remove(Target(folder))
    assert not (folder / "qual-kvcache").exists()


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

"""The checkpoint workload: plan sizes against the published figures, the file engine on
known data, atomic commit and restore integrity, ENOSPC on a real small filesystem, and
ranks as real processes."""

import dataclasses
import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qual import engine
from qual.exits import Exit
from qual.engine import DataMismatch, Fault, NoSpace, QualError
from qual.targets import Target
from qual.thresholds import family_table
from qual.workloads import checkpoint
from qual.workloads.checkpoint import ranks
from qual.workloads.checkpoint.group import ForkedGroup, PeerLost
from qual.workloads.checkpoint.plan import (DTYPE_BYTES, MLPERF_LAYOUTS, REFERENCES, Layout,
                                            build_plan, describe)
from qual.workloads.checkpoint.store import MANIFEST, CheckpointStore, IncompleteCheckpoint
from qual.workloads.checkpoint.store import load as load_set
from testbed import TINY_ALL, load_record, needs_root, run_suite

GiB = 2**30


def tiny(**over):
    """A checkpoint table small enough for a test: 2 ranks, about 11 MB per checkpoint."""
    given = {"model": "llama3.1-8b", "tp": 2, "scale": 1e-4, "passes": 1, "per_pass": 1,
             "retention": 2, "restore": False, "baseline": False, "chunk_size": "256 KiB"}
    given.update(over)
    return family_table(checkpoint.FAMILY, given)


# ------------------------------------------------------------------ the plan


@pytest.mark.parametrize("model, recipe, layout, expect", [
    ("llama3.1-8b", "mixed-adam", Layout(1, 1, 8, 3), 105),
    ("llama3-70b-dlio", "mixed-adam", Layout(8, 1, 8, 3), 911),
    ("llama3.1-405b", "mixed-adam", Layout(8, 32, 2, 1), 5292),
])
def test_plan_sizes_match_dlio_and_mlperf(model, recipe, layout, expect):
    """14 B/param, in the layouts MLPerf Storage publishes (reference §1.5, GiB)."""
    plan = build_plan(model, layout, recipe)
    assert round(plan.nbytes / GiB) == expect
    assert REFERENCES[(model, recipe)][0] == expect * GiB


def test_mlperf_layouts_give_its_process_counts():
    counts = {m: Layout(*lay[:3]).ranks for m, lay in MLPERF_LAYOUTS.items()}
    assert counts == {"llama3.1-8b": 8, "llama3-70b-dlio": 64, "llama3.1-405b": 512,
                      "llama3-1t": 1024, "llama3-1t-dlio": 1024}


def test_the_1t_plan_is_mlperfs_18_tb_with_the_arithmetic_shown():
    """MLPerf Storage v2.0's 1T in its layout: DLIO's shape (head size 25872 // 192 = 134)
    gives 1.183 T parameters, 15,426 GiB at 14 B/param; MLPerf sizes it at 2,571 GiB of
    weights (mlpstorage), 1.1667x that, which the plan shows and stretches every tensor by:
    18 TB in the table's units (18,000 GiB, as its 5.29 TB is 5,292 GiB). llama3-1t-dlio is
    the size DLIO writes from the same shape."""
    layout = Layout(*MLPERF_LAYOUTS["llama3-1t"])
    plan = build_plan("llama3-1t", layout, "mixed-adam")
    assert plan.model.kv_dim == 134 * 32
    assert plan.model.parameters() == 1_183_035_102_480
    assert plan.model.stretch == pytest.approx(7 / 6, rel=1e-3)
    assert plan.nbytes == pytest.approx(18000 * GiB, rel=0.01) and len(plan.ranks) == 1024
    weights = sum(r.group_bytes("weights") for r in plan.ranks)
    assert weights == pytest.approx(2571 * GiB, rel=1e-3)
    text = describe(plan)
    assert "1,024 processes" in text and "18 TB" in text and "1.1667x" in text
    assert re.search(r"this plan is -0\.0\d % of it", text)
    dlio = build_plan("llama3-1t-dlio", layout, "mixed-adam")
    assert dlio.nbytes == pytest.approx(15426 * GiB, rel=1e-3)
    # the same tensors, each 7/6 the size
    assert [t.name for t in dlio.ranks[5].tensors] == [t.name for t in plan.ranks[5].tensors]


@pytest.mark.parametrize("model", sorted(MLPERF_LAYOUTS))
def test_a_subset_writes_8_of_the_layouts_ranks_share(model):
    """MLPerf's subset mode: one host's 8 processes write 8/(TP x PP x DP) of the checkpoint,
    each standing for a rank spread over the layout, sized to the mean rank's share."""
    layout = Layout(*MLPERF_LAYOUTS[model])
    plan = build_plan(model, layout, "mixed-adam", subset=8)
    full = build_plan(model, layout, "mixed-adam")
    assert plan.full_bytes == full.nbytes and len(plan.ranks) == 8
    assert plan.nbytes / plan.full_bytes == pytest.approx(8 / layout.ranks, rel=1e-6)
    assert all(r.nbytes == pytest.approx(full.nbytes / layout.ranks, rel=1e-6)
               for r in plan.ranks)
    assert [r.rank for r in plan.ranks] == [i * layout.ranks // 8 for i in range(8)]
    assert f"8/{layout.ranks}" in describe(plan)


def test_the_405b_subset_is_83_gb_and_mixes_the_layouts_ranks():
    layout = Layout(*MLPERF_LAYOUTS["llama3.1-405b"])
    plan = build_plan("llama3.1-405b", layout, "mixed-adam", subset=8)
    assert plan.nbytes / GiB == pytest.approx(82.7, abs=0.05)  # 5,292 GiB x 8 / 512
    # data-parallel group 0 (weights and optimizer) and group 1 (optimizer only), every stage
    assert {r.coords[0] for r in plan.ranks} == {0, 1}
    assert not plan.ranks[4].group_bytes("weights") and plan.ranks[0].group_bytes("weights")
    with pytest.raises(ValueError, match="subset of 8 processes of a 2-rank layout"):
        build_plan("llama3.1-8b", Layout(2), "mixed-adam", subset=8)


def test_seed_recipe_gives_1636_gb_for_405b_on_tp4_pp2():
    plan = build_plan("llama3.1-405b", Layout(4, 2), "bf16-adam8bit")
    assert plan.nbytes == pytest.approx(1636e9, rel=0.01)
    assert plan.model.parameters() == 405_853_388_800
    text = describe(plan)
    assert "seed 004" in text and "-0.67 %" in text and "8 files" in text


def test_layout_moves_bytes_between_ranks_not_the_total():
    totals = [build_plan("llama3.1-8b", lay, "mixed-adam").nbytes
              for lay in (Layout(), Layout(4, 2), Layout(2, 4, 2, 1), Layout(1, 2, 4, 3))]
    # only the norms, copied on every tensor-parallel rank, add to the total
    assert max(totals) / min(totals) - 1 < 1e-4


def test_pipeline_stages_and_tensor_shards():
    plan = build_plan("llama3.1-8b", Layout(tp=2, pp=3), "bf16-weights")
    names = {r.coords: {t.name: t for t in r.tensors} for r in plan.ranks}
    first, last = names[(0, 0, 0)], names[(0, 2, 1)]
    assert "model.embed_tokens.weight" in first and "lm_head.weight" not in first
    assert "lm_head.weight" in last and "model.norm.weight" in last
    # 32 layers over 3 stages: 11, 11, 10 (the first L mod PP stages take one more)
    layers = [{n.split(".")[2] for n in names[(0, s, 0)] if n.startswith("model.layers.")}
              for s in range(3)]
    assert [len(x) for x in layers] == [11, 11, 10]
    q = first["model.layers.0.self_attn.q_proj.weight"]
    o = first["model.layers.0.self_attn.o_proj.weight"]
    assert q.shape == (2048, 4096) and o.shape == (4096, 2048)  # column / row parallel
    assert first["model.layers.0.input_layernorm.weight"].shape == (4096,)  # replicated


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_zero_stages_decide_who_writes_what(zero):
    plan = build_plan("llama3.1-8b", Layout(tp=1, pp=1, dp=2, zero=zero), "mixed-adam")
    a, b = plan.ranks
    assert a.group_bytes("weights") > 0 and a.group_bytes("optimizer") > 0
    assert (b.group_bytes("weights") > 0) == (zero == 3)
    assert (b.group_bytes("optimizer") > 0) == (zero in (1, 3))
    whole = build_plan("llama3.1-8b", Layout(), "mixed-adam").nbytes
    assert abs(plan.nbytes - whole) <= 64  # sharding moves bytes, rounding aside


def test_scale_keeps_ranks_tensors_and_the_size_distribution():
    full = build_plan("llama3.1-405b", Layout(4, 2), "bf16-adam8bit")
    small = build_plan("llama3.1-405b", Layout(4, 2), "bf16-adam8bit", scale=1e-4)
    assert len(small.ranks) == len(full.ranks) and small.tensors == full.tensors
    assert small.nbytes == pytest.approx(full.nbytes * 1e-4, rel=1e-3)
    for a, b in zip(full.ranks[0].tensors, small.ranks[0].tensors):
        assert a.name == b.name and a.dtype == b.dtype
        assert abs(b.numel - a.numel * 1e-4) <= 1 or b.numel == 1


# ------------------------------------------------------------------ the file engine


DTYPES = sorted(DTYPE_BYTES)


@settings(max_examples=100, deadline=None)  # dimensions to 100: up to 8 MB a tensor, many chunks
@given(tensors=st.lists(st.tuples(st.lists(st.integers(1, 100), min_size=0, max_size=3),
                                  st.sampled_from(DTYPES)), min_size=1, max_size=12),
       chunk=st.sampled_from([4096, 12288, 65536, 1 << 20]), depth=st.integers(1, 8),
       backend=st.sampled_from(["io_uring", "psync"]), seed=st.integers(0, 2**32))
@pytest.mark.slow
def test_write_then_restore_is_bit_identical(tmp_path_factory, tensors, chunk, depth, backend,
                                             seed):
    rng = np.random.default_rng(seed)
    spans, offset = [], 0
    for shape, dtype in tensors:
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        offset = -(-offset // 64) * 64
        spans.append((offset, rng.integers(0, 256, nbytes, dtype=np.uint8)))
        offset += nbytes
    size = max(4096, -(-offset // 4096) * 4096)
    path = str(tmp_path_factory.mktemp("ckpt") / "rank.bin")
    io = dict(chunk_size=chunk, queue_depth=depth, backend=backend)
    crcs, written = engine.write_checkpoint_file(path, spans, size, **io)
    assert written.bytes == size and len(crcs) == -(-size // chunk)
    back = [(off, np.zeros_like(a)) for off, a in spans]
    engine.read_checkpoint_file(path, back, size, crcs, **io)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(spans, back))


def aligned(nbytes: int, at: int = 0) -> np.ndarray:
    """nbytes of memory starting `at` bytes past a page boundary."""
    return engine.aligned_empty(nbytes + at)[at:]


@pytest.mark.parametrize("backend", ["io_uring", "psync"])
def test_aligned_tensors_move_without_a_copy_and_the_rest_are_staged(tmp_path, backend):
    """Chunks inside one page-aligned tensor are written from it and restored into it; a
    tensor at an odd address, and the chunk two tensors share, go through staging."""
    rng = np.random.default_rng(3)
    first = aligned(3 << 20)
    first[:] = rng.integers(0, 256, len(first), dtype=np.uint8)
    odd = aligned(1 << 20, at=64)  # not congruent with its file offset
    odd[:] = rng.integers(0, 256, len(odd), dtype=np.uint8)
    spans, size = [(0, first), (3 << 20, odd)], 4 << 20
    path = str(tmp_path / "rank.bin")
    io = dict(chunk_size=1 << 20, queue_depth=4, backend=backend)
    crcs, written = engine.write_checkpoint_file(path, spans, size, **io)
    assert written.zero_copy_bytes == 3 << 20 and written.bytes == size
    back = [(0, aligned(3 << 20)), (3 << 20, aligned(1 << 20, at=64))]
    read = engine.read_checkpoint_file(path, back, size, crcs, **io)
    assert read.zero_copy_bytes == 3 << 20
    assert np.array_equal(back[0][1], first) and np.array_equal(back[1][1], odd)
    with open(path, "r+b") as f:  # a flipped byte in a chunk read in place is still caught
        f.seek((1 << 20) + 5)
        b = f.read(1)
        f.seek((1 << 20) + 5)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(DataMismatch, match="fail their CRC32C"):
        engine.read_checkpoint_file(path, [(0, aligned(3 << 20)), (3 << 20, aligned(1 << 20))],
                                    size, crcs, **io)


def test_a_flipped_byte_fails_its_chunk_crc(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)
    path = tmp_path / "r.bin"
    crcs, _ = engine.write_checkpoint_file(str(path), [(0, data)], 3 << 20, chunk_size=1 << 20)
    with open(path, "r+b") as f:
        f.seek((2 << 20) + 77)
        b = f.read(1)
        f.seek((2 << 20) + 77)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(DataMismatch, match=r"bytes 2097152\.\.3145728 fail their CRC32C"):
        engine.read_checkpoint_file(str(path), [(0, np.zeros_like(data))], 3 << 20, crcs,
                                    chunk_size=1 << 20)


def test_the_file_must_be_new(tmp_path):
    path = tmp_path / "exists.bin"
    path.write_bytes(b"keep me")
    with pytest.raises(QualError) as e:
        engine.write_checkpoint_file(str(path), [], 4096)
    assert e.value.errno == errno.EEXIST and path.read_bytes() == b"keep me"


# ------------------------------------------------------------------ the store


def test_an_uncommitted_checkpoint_is_refused_and_removed(tmp_path):
    store = CheckpointStore(tmp_path)
    store.create()
    partial = store.begin("ckpt-000001")
    (partial / "rank-00000.bin").write_bytes(b"\0" * 4096)
    assert store.complete() == []
    with pytest.raises(IncompleteCheckpoint, match="never committed"):
        load_set(partial)
    assert store.remove_partials() == [partial] and not partial.exists()


def test_manifest_corruption_is_named(tmp_path):
    store = CheckpointStore(tmp_path)
    store.create()
    ckpt = store.commit(store.begin("ckpt-000001"), {"name": "x", "ranks": [], "plan": {}})
    assert load_set(ckpt)["name"] == "x"
    manifest = ckpt / MANIFEST
    good = manifest.read_bytes()
    manifest.write_bytes(good.replace(b'"name": "x"', b'"name": "y"'))  # still JSON
    with pytest.raises(DataMismatch, match="CRC32C does not match"):
        load_set(ckpt)
    manifest.write_bytes(good.replace(b"{", b"[", 1))  # no longer JSON
    with pytest.raises(DataMismatch, match="not JSON"):
        load_set(ckpt)
    manifest.unlink()
    with pytest.raises(IncompleteCheckpoint, match="no manifest"):
        load_set(ckpt)


def test_a_folder_qual_did_not_make_is_left_alone(tmp_path):
    theirs = tmp_path / "qual-checkpoints"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    store = CheckpointStore(tmp_path)
    with pytest.raises(QualError, match="was not made by qual"):
        store.create()
    store.remove_all()
    assert (theirs / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------ ranks as processes


@pytest.mark.slow
def test_two_ranks_write_restore_and_keep_the_newest(tmp_path):
    outcome = checkpoint.run(Target(tmp_path), tiny(passes=2, per_pass=2, retention=1,
                                                   restore=True, baseline=True,
                                                   baseline_bytes="2 MiB"))
    assert outcome.result["world"] == 2 and len(outcome.result["checkpoints"]) == 4
    assert [c["pass"] for c in outcome.result["checkpoints"]] == [1, 1, 2, 2]
    assert outcome.result["kept"] == ["ckpt-000004"]
    restore = outcome.result["restore"]
    assert restore["intact"] and restore["errors"] == [] and restore["path"].endswith("ckpt-000004")
    assert restore["verified_bytes"] == restore["bytes"] == outcome.result["plan"]["bytes"]
    assert outcome.result["torch"]["round_trip_equal"]
    assert "intact: True (CRC32C of every chunk" in "\n".join(outcome.lines())
    doc = outcome.document()  # which path each byte took is recorded
    assert all(0 <= z <= outcome.result["plan"]["bytes"] for z in doc["zero_copy_bytes"])
    manifest = json.loads((tmp_path / "qual-checkpoints" / "ckpt-000004" / MANIFEST).read_text())
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1]
    assert sum(len(r["tensors"]) for r in manifest["ranks"]) == outcome.result["plan"]["tensors"]
    measurements = (checkpoint.pass_measurements(outcome.result, "t") +
                    checkpoint.restore_measurements(outcome.result, "t") +
                    checkpoint.baseline_measurements(outcome.result, "t"))
    ids = {m.id for m in measurements}
    assert {"ckpt_write_s[pass=1]", "ckpt_write_bw[pass=2]", "ckpt_each_s[pass=2,index=2]",
            "ckpt_restore_intact", "torch_save_bw", "ckpt_save_speedup"} <= ids


@pytest.mark.slow
def test_four_rank_processes(tmp_path):
    outcome = checkpoint.run(Target(tmp_path), tiny(tp=2, pp=2, restore=True))
    assert outcome.result["world"] == 4 and outcome.result["restore"]["intact"]
    assert len(outcome.result["checkpoints"][0]["rank_seconds"]) == 4


@pytest.mark.slow
def test_tensors_in_the_page_aligned_pool_move_without_a_copy(tmp_path):
    """Chunks that lie inside one tensor are written from the pool and restored into the
    destination directly, also when tensors share the pool. This plan's tensors average ~19 KB
    at 64-byte offsets, so about half of its 4 KiB chunks straddle two (those are staged)."""
    for pool in ("1 GiB", "1 MiB"):
        outcome = checkpoint.run(Target(tmp_path), tiny(restore=True, chunk_size="4 KiB",
                                                       pool=pool, retention=1))
        doc, size = outcome.document(), outcome.result["plan"]["bytes"]
        assert doc["zero_copy_bytes"][0] > 0.4 * size, pool
        assert doc["restore_zero_copy_bytes"] == doc["zero_copy_bytes"][0]
        assert outcome.result["restore"]["intact"]


def test_a_rank_larger_than_its_pool_says_how_much_was_compared_byte_for_byte(tmp_path):
    outcome = checkpoint.run(Target(tmp_path), tiny(restore=True, pool="1 MiB"))
    restore, doc = outcome.result["restore"], outcome.document()
    assert restore["intact"] and doc["crc_checked_bytes"] == outcome.result["plan"]["bytes"]
    assert 0 < doc["byte_compared_bytes"] <= 2 * (1 << 20) < doc["crc_checked_bytes"]


@pytest.mark.slow
def test_a_flipped_byte_in_a_data_file_is_caught_on_restore(tmp_path):
    target = Target(tmp_path)
    checkpoint.run(target, tiny())
    data = tmp_path / "qual-checkpoints" / "ckpt-000001" / "rank-00001.bin"
    with open(data, "r+b") as f:
        f.seek(100_000)
        b = f.read(1)
        f.seek(100_000)
        f.write(bytes([b[0] ^ 1]))
    outcome = checkpoint.run(target, tiny(restore=True), passes=0)
    restore = outcome.result["restore"]
    assert not restore["intact"]
    (error,) = restore["errors"]
    assert error.startswith("rank 1:") and "fail their CRC32C" in error
    (intact,) = checkpoint.restore_measurements(outcome.result, "t")[:1]
    assert intact.value == 0.0


@pytest.mark.slow
def test_restore_compares_every_byte_not_only_the_crcs(tmp_path):
    """A flipped byte whose chunk CRC and manifest CRC were rewritten to match (what a
    CRC-consistent corruption, or a writer that checksummed wrong data, leaves): the CRCs pass,
    and only restore's byte-for-byte compare with what was written can say so."""
    target = Target(tmp_path)
    checkpoint.run(target, tiny())
    folder = tmp_path / "qual-checkpoints" / "ckpt-000001"
    manifest = json.loads((folder / MANIFEST).read_text())
    chunk, mine = manifest["chunk_size"], manifest["ranks"][1]
    data = bytearray((folder / mine["file"]).read_bytes())
    crcs = [engine.crc32c(bytes(data[i:i + chunk])) for i in range(0, len(data), chunk)]
    assert crcs == mine["crcs"]  # the control: the test computes the CRCs as the writer did
    data[100_000] ^= 1
    (folder / mine["file"]).write_bytes(data)
    i = 100_000 // chunk
    mine["crcs"][i] = engine.crc32c(bytes(data[i * chunk:(i + 1) * chunk]))
    manifest["crc32c"] = engine.crc32c(json.dumps(
        {k: v for k, v in manifest.items() if k != "crc32c"}, sort_keys=True,
        separators=(",", ":")).encode())
    (folder / MANIFEST).write_text(json.dumps(manifest))
    restore = checkpoint.run(target, tiny(restore=True), passes=0).result["restore"]
    assert not restore["intact"]
    assert restore["errors"] == ["rank 1: restored bytes differ from the bytes written"]


@pytest.mark.slow
def test_a_corrupt_manifest_is_refused_on_restore(tmp_path):
    target = Target(tmp_path)
    checkpoint.run(target, tiny())
    manifest = tmp_path / "qual-checkpoints" / "ckpt-000001" / MANIFEST
    manifest.write_bytes(manifest.read_bytes().replace(b'"rank": 1', b'"rank": 7'))
    outcome = checkpoint.run(target, tiny(restore=True), passes=0)
    assert not outcome.result["restore"]["intact"]
    assert all("manifest is corrupt" in e for e in outcome.result["restore"]["errors"])


@needs_root
@pytest.mark.slow
def test_enospc_mid_checkpoint_leaves_the_earlier_ones_restorable(tmp_path, loop_device):
    dev = loop_device(48 << 20)
    folder = loop_device.mount(dev)
    target = Target(folder)
    with pytest.raises(NoSpace) as e:
        checkpoint.run(target, tiny(per_pass=20))
    assert e.value.errno == errno.ENOSPC and "no room for a" in str(e.value)
    store = CheckpointStore(folder)
    done = store.complete()
    assert done and not [p for p in store.root.iterdir() if p.name.endswith(".partial")]
    for ckpt in done:  # every directory restore would accept is complete and intact
        load_set(ckpt)
    outcome = checkpoint.run(target, tiny(restore=True), passes=0)
    assert outcome.result["restore"]["intact"] and outcome.result["restore"]["path"] == str(done[-1])


@pytest.mark.slow
def test_a_rank_error_stops_every_rank(tmp_path):
    """A plan that does not fit its layout fails in the ranks; none is left running."""
    with pytest.raises(QualError, match="processes for a 2-rank layout"):
        checkpoint.launch(_job(tmp_path, plan={"model": "llama3.1-8b", "tp": 2, "pp": 1,
                                               "dp": 1, "zero": 0, "recipe": "mixed-adam",
                                               "scale": 1e-4}), 3, tmp_path)
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)],  # its ranks name its job file
                              capture_output=True, text=True).stdout.split()
    assert str(os.getpid()) not in leftover and leftover == []


TP2 = {"model": "llama3.1-8b", "tp": 2, "pp": 1, "dp": 1, "zero": 0, "recipe": "mixed-adam",
       "scale": 1e-4}


@pytest.mark.slow
def test_the_first_rank_to_fail_ends_the_others_at_once(tmp_path):
    """Rank 1 fails before it joins its ranks (its log cannot be opened) while rank 0 is
    stuck where it cannot see that (opening its log, a pipe no one reads: as a rank blocked
    on storage): the ranks' parent ends rank 0 at once, and the error names rank 1 with what
    it said."""
    os.mkfifo(tmp_path / "rank-00000.log")
    (tmp_path / "rank-00001.log").mkdir()
    started = time.monotonic()
    with pytest.raises(QualError, match=r"rank 1 exited with 1: (?s:.*)IsADirectoryError"):
        checkpoint.launch(_job(tmp_path, plan=TP2), 2, tmp_path)
    assert time.monotonic() - started < 30
    exits = json.loads((tmp_path / ranks.EXITS).read_text())
    assert exits == {"1": 1, "0": -signal.SIGKILL}


@pytest.mark.slow
def test_a_rank_that_dies_without_a_word_is_named_not_the_rank_that_lost_it(tmp_path):
    """Rank 1 fails before it joins (its log cannot be opened) and writes no error; rank 0
    finds its pipe closed. Whichever the ranks' parent reaps first, the error names rank 1
    and what it said, never rank 0's loss of it."""
    CheckpointStore(tmp_path).create()  # rank 0 gets as far as the ranks' first meeting
    (tmp_path / "rank-00001.log").mkdir()
    with pytest.raises(QualError, match=r"rank 1 exited with 1: (?s:.*)IsADirectoryError"):
        checkpoint.launch(_job(tmp_path, plan=TP2), 2, tmp_path)
    exits = json.loads((tmp_path / ranks.EXITS).read_text())
    assert exits["1"] == 1 and exits["0"] in (1, -signal.SIGKILL)


def _forked_ranks(world: int, timeout_s: float, rank_does) -> tuple[ForkedGroup, dict]:
    """A ForkedGroup of `world` ranks: ranks 1.. forked, each running rank_does(group, rank)
    and exiting with what it returns; this process joins as rank 0. Returns the group and
    the forked ranks' pids by rank."""
    group = ForkedGroup(world, timeout_s)
    pids = {}
    for rank in range(1, world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = rank_does(group.joined(rank), rank)
            finally:
                os._exit(code)
        pids[rank] = pid
    return group.joined(0), pids


def _exits(pids: dict, within_s: float = 10) -> dict:
    deadline, out = time.monotonic() + within_s, {}
    while pids.keys() - out.keys() and time.monotonic() < deadline:
        for rank, pid in pids.items():
            if rank not in out and (done := os.waitpid(pid, os.WNOHANG))[0]:
                out[rank] = os.waitstatus_to_exitcode(done[1])
        time.sleep(0.01)
    for rank in pids.keys() - out.keys():  # never left running
        os.kill(pids[rank], signal.SIGKILL)
        os.waitpid(pids[rank], 0)
    return out


def test_forked_ranks_gather_to_rank_0_and_hear_its_broadcast():
    """Rank 0 gathers every rank's object in rank order, larger than a pipe holds, and each
    rank hears what rank 0 broadcasts, past a barrier."""
    blob = bytes(range(256)) * 4096  # 1 MiB: many times a pipe's buffer

    def rank_does(group, rank):
        group.barrier()
        group.gather({"rank": rank, "blob": blob})
        return 0 if group.broadcast(None) == ("go", 7) else 3
    group, pids = _forked_ranks(4, 10, rank_does)
    try:
        group.barrier()
        got = group.gather({"rank": 0, "blob": blob})
        group.broadcast(("go", 7))
    finally:
        group.close()
    assert [g["rank"] for g in got] == [0, 1, 2, 3] and all(g["blob"] == blob for g in got)
    assert _exits(pids) == {1: 0, 2: 0, 3: 0}


@pytest.mark.parametrize("rank_does, errno_, said", [
    (lambda group, rank: 1, errno.EPIPE, "rank 1 left the checkpoint's ranks"),
    (lambda group, rank: time.sleep(30) or 0, errno.ETIMEDOUT,
     "rank 0 waited 0.5 s for rank 1"),
], ids=["a rank that exits", "a rank that never answers"])
def test_rank_0_learns_at_once_that_a_rank_left_and_waits_no_longer_than_the_timeout(
        rank_does, errno_, said):
    """A rank that exits is an end of file to rank 0 at once (every other process closed its
    end of the pipe), not a wait; one that never answers is given up after the timeout."""
    group, pids = _forked_ranks(3, 0.5, rank_does)
    started = time.monotonic()
    try:
        with pytest.raises(PeerLost, match=said) as raised:
            group.gather(None)
    finally:
        group.close()
        _exits(pids, within_s=0)
    assert raised.value.errno == errno_ and time.monotonic() - started < 5


def test_the_failing_ranks_error_is_the_cause_not_a_peer_that_lost_it_earlier():
    """A rank that lost its peer (its pipe closed, or gloo's trace) may write its error
    before the failing rank writes its own, or the failing rank may die without writing one:
    the launcher reports the engine's error, else the rank that died without a word."""
    lost = {"rank": 0, "errno": errno.EPIPE, "message": "rank 1 left the checkpoint's ranks",
            "class": "PeerLost", "at": 1.0}
    gloo = {"rank": 2, "errno": errno.EIO, "message": "RuntimeError: Connection closed",
            "trace": "...", "class": "QualError", "at": 1.5}
    eio = {"rank": 1, "errno": errno.EIO, "message": "read at offset 4096", "class": "DeviceError",
           "at": 2.0}
    culprit = checkpoint.workload.culprit
    assert culprit([lost, gloo, eio], {"0": 1, "2": 1, "1": 1}) == (1, eio)
    assert culprit([gloo, lost], {"0": 1, "2": 1}) == (0, lost)  # none said more: the first
    # rank 1 died silently (its log could not be opened); rank 0 lost it; rank 2 was ended
    assert culprit([lost], {"0": 1, "1": 1, "2": -signal.SIGKILL}) == (1, None)
    assert culprit([lost, eio], {"0": 1, "3": -signal.SIGKILL, "1": 1}) == (1, eio)
    assert culprit([], {"0": 0, "1": 0}) == (None, None)
    assert culprit([], {}) == (None, None)


@pytest.mark.parametrize("procedure, baseline, root, times", [
    ("passes", True, "/x", True), ("passes", False, "/x", False),
    ("mlperf-v2", True, "/x", False), ("passes", True, None, False)])
def test_the_ranks_time_torch_save_only_where_a_run_of_passes_asks_for_its_baseline(
        tmp_path, procedure, baseline, root, times):
    """Only then does the ranks' parent import torch (1.6 s) before it forks them: the ci
    profile's baseline = yes under mlperf-v2, which never runs it, imported it for nothing."""
    job = dataclasses.replace(_job(tmp_path, {}), procedure=procedure, baseline=baseline,
                              root=root)
    assert job.times_torch is times


def _job(tmp_path, plan):
    (tmp_path / "errors").mkdir(exist_ok=True)
    return ranks.RankJob(root=str(tmp_path), plan=plan, passes=1, per_pass=1, retention=1,
                         baseline_bytes=1 << 20, chunk_size=1 << 20, queue_depth=4, align=4096,
                         backend="auto", pool=1 << 30, seed=1, timeout_s=60,
                         result=str(tmp_path / "result.json"), errors=str(tmp_path / "errors"))


def test_fill_to_utilisation_counts_what_fits(tmp_path):
    table = tiny(per_pass=0, utilisation="100 %")
    n = checkpoint.checkpoints_per_pass(table, tmp_path, 10 << 20)
    assert n >= 1
    with pytest.raises(NoSpace, match="does not fit below"):
        checkpoint.checkpoints_per_pass(tiny(per_pass=0, utilisation="1 %"), tmp_path, 1 << 50)


# ------------------------------------------------------------------ the suite and the command


@pytest.mark.slow
def test_only_the_checkpoint_suite_leaves_the_other_criteria_unjudged(tmp_path):
    proc, results = run_suite(tmp_path, "-k", "not torch", suite="test_checkpoint.py",
                              profile=TINY_ALL)
    summary = load_record(results)["summary"]
    assert proc.returncode == Exit.INCOMPLETE and summary["checks_failed"] == 0
    assert summary["verdict"] == "INCOMPLETE"
    assert summary["not_judged"] and not any(i.startswith("ckpt_")
                                             for i in summary["not_judged"])


def test_checkpoint_command_json(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "checkpoint", "--target",
                           str(tmp_path), "--tp", "2", "--scale", "1e-4", "--count", "2",
                           "--restore", "--baseline", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"bytes", "write_s", "write_bw_bytes", "restore_s", "restore_bw_bytes", "verified",
            "torch_save_bw_bytes"} <= doc.keys()
    assert len(doc["write_s"]) == 2 and doc["verified"] is True


@pytest.mark.slow
def test_torchrun_launches_the_ranks(tmp_path):
    """torchrun sets RANK, WORLD_SIZE and MASTER_ADDR; each worker is one rank, rank 0 reports."""
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", "-m", "qual.cli", "checkpoint", "--target",
                             str(tmp_path), "--tp", "2", "--scale", "1e-4", "--count", "2",
                             "--restore", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:  # torchrun's workers are session leaders: SIGTERM it so it stops them too
        if proc.poll() is None:
            proc.terminate()
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    doc = json.loads(out)  # one document: only rank 0 prints
    assert doc["ranks"] == 2 and len(doc["write_s"]) == 2 and doc["verified"] is True


def test_subset_of_a_layout_on_this_host(tmp_path):
    """Like MLPerf Storage's subset mode: 2 of a 4-rank layout's ranks write here."""
    outcome = checkpoint.run(Target(tmp_path), tiny(tp=2, pp=2, ranks=2, restore=True))
    assert outcome.result["world"] == 2 and outcome.result["restore"]["intact"]
    assert outcome.result["checkpoints"][0]["bytes"] == sum(outcome.result["rank_bytes"])
    assert outcome.result["checkpoints"][0]["device"] is None  # other ranks' bytes are not here


@pytest.mark.parametrize("fault, error", [
    (Fault(op="write", error=errno.EIO, offset_lo=1 << 20), "DeviceIoError"),
    (Fault(op="write", short_bytes=4096, offset_lo=1 << 20), "DeviceIoError"),
    (Fault(op="write", error=errno.ENOSPC, offset_lo=1 << 20), "NoSpace"),
])
@pytest.mark.slow
def test_a_failing_write_leaves_the_last_good_checkpoint_restorable(tmp_path, fault, error):
    """An injected EIO, short write or ENOSPC in the next checkpoint: the error names the file,
    the operation and the offset, no partial directory survives, and restore still finds the
    previous checkpoint intact."""
    target = Target(tmp_path)
    checkpoint.run(target, tiny())
    store = CheckpointStore(tmp_path)
    (good,) = store.complete()
    with pytest.raises(QualError) as e:
        checkpoint.run(target, tiny(), faults=(fault,))
    assert type(e.value).__name__ == error
    assert e.value.op == "write" and e.value.target.endswith(".bin")
    named = int(re.search(r"at offset (\d+)", str(e.value)).group(1))
    assert named >= 1 << 20 and named % (256 << 10) == 0  # a chunk the fault hit
    assert store.complete() == [good]
    assert not [p for p in store.root.iterdir() if p.name.endswith(".partial")]
    outcome = checkpoint.run(target, tiny(restore=True), passes=0)
    assert outcome.result["restore"]["intact"] and outcome.result["restore"]["path"] == str(good)


# ------------------------------------------------------------------ write and read phases apart


def qual_checkpoint(*args, cwd):
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "checkpoint", *args, "-q"],
                          capture_output=True, text=True, timeout=300, cwd=cwd)
    return proc, json.loads(proc.stdout) if proc.stdout.startswith("{") else None


@pytest.mark.slow
def test_a_set_written_by_one_run_is_restored_bit_for_bit_by_another(tmp_path):
    """--write-only leaves a complete set; a separate --read-only run restores it from its
    manifest alone (plan, chunking, the data's seed) and compares every byte."""
    target = tmp_path / "drive"
    target.mkdir()
    proc, doc = qual_checkpoint("--target", str(target), "--model", "llama3.1-8b", "--tp", "2",
                                "--scale", "1e-4", "--write-only", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "restore_s" not in doc and doc["kept"] == ["ckpt-000001"]
    ckpt = target / "qual-checkpoints" / "ckpt-000001"
    proc, back = qual_checkpoint("--read-only", str(ckpt), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert back["verified"] is True and back["restore_errors"] == []
    assert back["crc_checked_bytes"] == back["byte_compared_bytes"] == back["bytes"] == doc["bytes"]
    # the set travels: copied under another name (an archive), moved to another parent (another
    # host's mount point); its manifest alone makes it a committed set
    archive = tmp_path / "archive-2026-12"
    shutil.copytree(ckpt, archive)
    moved = tmp_path / "other-host" / "mnt"
    moved.mkdir(parents=True)
    ckpt = Path(shutil.move(ckpt, moved))
    for copy in (archive, ckpt):
        proc, back = qual_checkpoint("--read-only", str(copy), "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert back["verified"] is True and back["bytes"] == doc["bytes"]
    header = subprocess.run([sys.executable, "-m", "qual.cli", "checkpoint", "--read-only",
                             str(archive)], capture_output=True, text=True, timeout=300)
    assert f"checkpoint on {archive} (" in header.stderr  # the set, not the default target
    assert header.returncode == 0 and "kept in" not in header.stdout
    assert not (tmp_path / ".qual").exists()  # nothing was made beside it
    with open(ckpt / "rank-00001.bin", "r+b") as f:  # one flipped bit: the next read says so
        f.seek(4096)
        b = f.read(1)
        f.seek(4096)
        f.write(bytes([b[0] ^ 0x10]))
    proc, bad = qual_checkpoint("--read-only", str(ckpt), "--json", cwd=tmp_path)
    assert proc.returncode == 1 and bad["verified"] is False
    assert any("rank 1" in e for e in bad["restore_errors"])


@pytest.mark.parametrize("damage, message", [
    ("missing rank", "rank-00001.bin is missing: the set is incomplete"),
    ("foreign manifest", "not qual's (no qual-ckpt/1 format field)"),
    ("never committed", "never committed"),
])
@pytest.mark.slow
def test_read_only_refuses_an_incomplete_or_foreign_set(tmp_path, damage, message):
    checkpoint.run(Target(tmp_path), tiny())
    ckpt = tmp_path / "qual-checkpoints" / "ckpt-000001"
    if damage == "missing rank":
        (ckpt / "rank-00001.bin").unlink()
    elif damage == "foreign manifest":
        (ckpt / MANIFEST).write_text(json.dumps({"model": "someone else's"}))
    else:
        ckpt = ckpt.rename(ckpt.with_name("ckpt-000001.partial"))
    before = sorted((p.name, p.stat().st_size) for p in ckpt.iterdir())
    proc, _ = qual_checkpoint("--read-only", str(ckpt), cwd=tmp_path)
    assert proc.returncode == 1 and message in proc.stderr
    assert sorted((p.name, p.stat().st_size) for p in ckpt.iterdir()) == before


@needs_root
@pytest.mark.slow
def test_the_mlperf_v2_procedure_reads_every_checkpoint_back_from_the_device(tmp_path,
                                                                            loop_device):
    """MLPerf Storage v2.0 on a loop-mounted ext4: 10 writes, the cache cleared, 10 reads,
    every read byte counted by the device; the figures under DLIO's summary names."""
    folder = loop_device.mount(loop_device(256 << 20))
    outcome = checkpoint.run(Target(folder), tiny(procedure="mlperf-v2", per_pass=10, runs=1))
    doc = outcome.document()
    (run,) = doc["runs"]
    assert run["checkpoints_written"] == run["checkpoints_read"] == 10 and doc["verified"]
    assert run["read_bytes"] == 10 * doc["bytes"]
    assert run["device_read_bytes"] >= 0.95 * run["read_bytes"]  # not one served from cache
    assert doc["load_checkpoint_io_mean_GB_per_second"] > 0
    found = {m.id: m for m in outcome.measurements()}
    assert {"save_checkpoint_duration", "save_checkpoint_io", "load_checkpoint_duration",
            "load_checkpoint_io", "ckpt_restore_intact"} == found.keys()
    assert found["load_checkpoint_io"].context["runs"] == [run["load_checkpoint_io_mean_GB_per_second"]]
    assert found["load_checkpoint_io"].device_truth == "counted"
    assert found["ckpt_restore_intact"].value == 1.0


@needs_root
@pytest.mark.slow
def test_subset_mode_writes_this_hosts_share_and_reads_it_back_from_the_device(tmp_path,
                                                                              loop_device):
    """MLPerf's subset mode on a loop-mounted ext4 (node-local storage): 8 processes of the
    405B's 512-rank layout write 8/512 of its checkpoint, every byte counted by the device
    going out and coming back; a later --read-only restores the set from its manifest."""
    folder = loop_device.mount(loop_device(256 << 20))
    table = tiny(model="llama3.1-405b", tp=8, pp=32, dp=2, zero=1, subset=True,
                 procedure="mlperf-v2", per_pass=2, runs=1)
    outcome = checkpoint.run(Target(folder), table)
    doc = outcome.document()
    assert doc["mode"] == "subset" and doc["ranks"] == 8 and doc["verified"]
    # each tensor rounds to whole elements: at this scale to within 0.1 %
    assert doc["bytes"] / doc["full_bytes"] == pytest.approx(8 / 512, rel=1e-3)
    assert doc["full_bytes"] == build_plan("llama3.1-405b", Layout(8, 32, 2, 1), "mixed-adam",
                                           scale=1e-4).nbytes
    (run,) = doc["runs"]
    assert run["read_bytes"] == 2 * doc["bytes"]
    assert run["device_read_bytes"] >= 0.95 * run["read_bytes"]  # not one served from cache
    found = {m.id: m for m in outcome.measurements()}
    assert found["save_checkpoint_io"].device_truth == "counted"
    ckpt = Path(doc["store"]) / doc["kept"][-1]
    assert len(list(ckpt.glob("rank-*.bin"))) == 8
    again = checkpoint.run(Target(folder), tiny(read_only=str(ckpt))).document()
    assert again["verified"] and again["bytes"] == doc["bytes"]


@pytest.mark.parametrize("failing", [0, 1])
@pytest.mark.slow
def test_the_failing_ranks_own_error_is_shown_not_a_peers(misbehaving, tmp_path, failing):
    """A drive that returns EIO inside one rank's file during a restore: that rank fails with
    a device error naming the file and offset; its peer then finds it gone ("rank N left the
    checkpoint's ranks"). What the user sees is the failing rank's own error, whichever rank
    it is."""
    name = f"qual-checkpoints/ckpt-000001/rank-{failing:05d}.bin"
    storage = misbehaving("--eio", f"{name}:{1 << 20}:4096")
    written = subprocess.run(  # straight into the backing folder; read back through stallfs
        [sys.executable, "-m", "qual.cli", "checkpoint", "--target", str(storage.backing),
         "--tp", "2", "--scale", "1e-4", "--write-only", "-q"], capture_output=True, text=True,
        timeout=300)
    assert written.returncode == 0, written.stderr
    proc, _ = qual_checkpoint("--read-only", str(storage.point / "qual-checkpoints" /
                                                 "ckpt-000001"), cwd=tmp_path)
    assert proc.returncode == 1
    (error,) = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert f"rank {failing}: " in error and error.endswith("[EIO]"), proc.stderr
    assert f"rank-{failing:05d}.bin: read at offset" in error, error
    assert "left the checkpoint's ranks" not in proc.stderr and "Traceback" not in proc.stderr

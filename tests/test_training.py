"""Training-data ingestion: the sample reader, the dataset, AU arithmetic, the simulated
accelerators (calibration, throttled reads, step accounting), device truth on a loop device,
bad input refused before any I/O, the command line and the suite."""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from testbed import TINY_ALL, TINY_PROFILE, load_record, needs_root, run_suite

from qual import cli, engine
from qual.commands import family as command
from qual.engine import Fault, InvalidJob, SampleReader
from qual.targets import Target
from qual.thresholds import ProfileError, family_table
from qual.workloads import registry, training
from qual.workloads.training import accelerators, configs, dataset
from qual.workloads.training.accelerators import Step, utilisation


def table(**kw) -> dict:
    """A small unet3d: 42 files of ~290 KB, 20 ms compute, 2 read threads."""
    given = {"workload": "unet3d-h100", "files": 42, "record_scale": 0.002,
             "computation_time": "20 ms", "read_threads": 2, "accelerators": [1],
             "epochs": [1], "shuffle_seed": 7, **kw}
    return family_table(training.FAMILY, given)


# ------------------------------------------------------------------ the sample reader


@pytest.mark.parametrize("backend", ["io_uring", "psync"])
@pytest.mark.parametrize("direct", [True, False])
def test_reader_reads_every_byte_of_odd_sized_files(tmp_path, backend, direct):
    reader = SampleReader(block_size=64 << 10, queue_depth=4, align=4096, direct=direct,
                          backend=backend)
    try:
        assert reader.backend == backend
        for size in (1, 4095, 4096, 65536, 65537, 300_001):
            path = tmp_path / f"s{size}"
            path.write_bytes(os.urandom(size))
            assert reader.read(str(path)) == size
        assert int(reader.ctl.ops_done) == 6
    finally:
        reader.close()


def test_reader_reports_an_injected_error_with_the_file(tmp_path):
    path = tmp_path / "sample"
    path.write_bytes(os.urandom(1 << 20))
    reader = SampleReader(block_size=128 << 10, queue_depth=4, align=4096,
                          faults=(Fault(op="read", error=errno.EIO, offset_lo=512 << 10),))
    try:
        with pytest.raises(engine.DeviceIoError) as e:
            reader.read(str(path))
        assert e.value.target == str(path) and "offset 524288" in str(e.value)
    finally:
        reader.close()


def test_reader_refuses_bad_parameters_and_missing_files(tmp_path):
    with pytest.raises(InvalidJob):
        SampleReader(block_size=1000, queue_depth=4, align=4096)
    with pytest.raises(InvalidJob):
        SampleReader(block_size=4096, queue_depth=0, align=4096)
    reader = SampleReader(block_size=4096, queue_depth=1, align=4096)
    try:
        with pytest.raises(engine.TargetUnavailable):
            reader.read(str(tmp_path / "nothing"))
    finally:
        reader.close()


# ------------------------------------------------------------------ the dataset


def test_dataset_files_have_drawn_sizes_and_incompressible_bytes(tmp_path):
    t = table()
    w = training.workload_of(t)
    data = dataset.prepare(Target(tmp_path), w, seed=3)
    sizes = dataset.file_sizes(w, 3)
    assert data.files == 42 and list(data.sizes) == list(sizes)
    assert len(set(data.sizes)) > 40  # drawn per file, not one size
    assert abs(np.mean(sizes) - w.record_length) < 3 * w.record_stdev / math.sqrt(42)
    for i in range(data.files):
        assert Path(data.path(i)).stat().st_size == data.sizes[i]
    body = Path(data.path(0)).read_bytes()
    assert len(zlib.compress(body)) > 0.99 * len(body)  # the drive cannot compress it away
    # the same parameters reuse it; a new seed replaces it
    mtime = Path(data.path(0)).stat().st_mtime_ns
    assert dataset.prepare(Target(tmp_path), w, seed=3).sizes == data.sizes
    assert Path(data.path(0)).stat().st_mtime_ns == mtime
    again = dataset.prepare(Target(tmp_path), w, seed=4)
    assert again.sizes != data.sizes


def test_dataset_removal_spares_what_qual_did_not_make(tmp_path):
    w = training.workload_of(table())
    dataset.prepare(Target(tmp_path), w)
    theirs = tmp_path / dataset.FOLDER / "their-data"
    theirs.mkdir()
    (theirs / "keep.bin").write_bytes(b"x")
    training.remove(Target(tmp_path))
    assert (theirs / "keep.bin").exists()
    assert not (tmp_path / dataset.FOLDER / w.name).exists()


def test_dataset_refuses_a_folder_it_did_not_make(tmp_path):
    w = training.workload_of(table())
    folder = tmp_path / dataset.FOLDER / w.name
    folder.mkdir(parents=True)
    (folder / "precious").write_bytes(b"x")
    with pytest.raises(engine.TargetUnavailable):
        dataset.prepare(Target(tmp_path), w)
    assert (folder / "precious").read_bytes() == b"x"


# ------------------------------------------------------------------ AU arithmetic


def test_au_of_hand_computed_steps():
    # three steps: load 0.5 s then compute 1 s, barrier free; the first step is excluded
    steps = [Step(0.0, 0.5, 1.5, 1.5), Step(1.5, 2.0, 3.0, 3.0), Step(3.0, 3.5, 4.5, 4.5)]
    assert utilisation(steps) == pytest.approx(2.0 / 3.0)  # 2 s compute over 4.5 - 1.5 s
    # loads hidden behind compute: AU 1
    steps = [Step(0.0, 2.0, 3.0, 3.0), Step(3.0, 3.0, 4.0, 4.0), Step(4.0, 4.0, 5.0, 5.0)]
    assert utilisation(steps) == pytest.approx(1.0)
    # barrier waits count against AU: 1 s compute, 0.25 s at the barrier per step
    steps = [Step(0, 0, 1, 1.25), Step(1.25, 1.25, 2.25, 2.5), Step(2.5, 2.5, 3.5, 3.75)]
    assert utilisation(steps) == pytest.approx(2.0 / 2.5)
    assert math.isnan(utilisation(steps[:1]))


def test_epoch_aggregates_over_accelerators():
    e = accelerators.Epoch(index=1, steps=10, batch=4, au=[0.9, 0.7], bytes=8 << 20, wall_s=2.0)
    assert e.au_mean == pytest.approx(0.8)
    assert e.samples == 80 and e.samples_per_s == pytest.approx(40.0)
    assert e.bw == pytest.approx(4 << 20)


def test_dataset_rule_of_mlperf_storage():
    w = configs.WORKLOADS["unet3d-h100"]
    # 500 steps x 7 x 4 = 14,000 files (the Micron run); 5 x 64 GiB / 146.6 MB = 2,344
    assert configs.minimum_files(w, 4, 64 << 30) == 14_000
    # with 1 TiB of RAM the memory term wins: 5 x 2^40 / 146,600,628 = 37,502
    assert configs.minimum_files(w, 1, 1 << 40) == math.ceil(5 * (1 << 40) / 146_600_628)
    r = configs.WORKLOADS["resnet50-h100"]  # 1,251 samples per file
    assert configs.minimum_files(r, 1, 0) == math.ceil(500 * 400 / 1251)
    assert configs.steps_per_epoch(w, 2) == 168 // 7 // 2


def test_seed_001_workload_demands_the_seeds_ceiling_per_accelerator():
    # 32 samples x 146.6 MB every 1.3604 s: the seed's "theoretical ceiling 3,400 MB/s"
    assert configs.WORKLOADS["unet3d-seed001"].demand() == pytest.approx(3.45e9, rel=0.01)
    assert configs.WORKLOADS["unet3d-h100"].demand() == pytest.approx(3.18e9, rel=0.01)


# ------------------------------------------------------------------ the simulation


def test_calibration_reaches_the_ceiling(tmp_path):
    # 250 ms steps: the simulator's own cost per step (a barrier, a wake-up) stays far below
    # the 2 % it may take, even on a busy 2-core machine, where a woken thread can wait a few
    # ms for a core (at 100 ms, one such wait in the 3 steps of 2 accelerators made 97.5 %)
    outcome = training.run(Target(tmp_path), table(accelerators=[1, 2], epochs=[1],
                                                  computation_time="250 ms"))
    for n, c in outcome.result["calibration"].items():
        assert c["au_mean"] >= 0.98, (n, c["au_mean"])
        assert c["backend"] == "none" and c["device_read_bytes"] is None  # nothing was read
    for r in outcome.result["runs"]:
        assert r["bytes"] > 0 and r["backend"] in ("io_uring", "psync")


def test_a_repeated_sweep_calibrates_in_its_last_repetition_whose_ceiling_is_judged(tmp_path):
    from qual.workloads.base import Repeated

    runs = Repeated.of(training.FAMILY, Target(tmp_path), table(computation_time="5 ms"), 2)
    assert [list(o.result["calibration"]) for o in runs.outcomes] == [[], [1]]
    found = {m.id: m for m in runs.measurements()}
    au = found["train_au[accelerators=1,epochs=1]"]
    assert len(au.repetitions) == 2
    assert au.ceiling == runs.last.result["calibration"][1]["au_mean"] == \
        found["train_au_ceiling[accelerators=1]"].value
    training.remove(Target(tmp_path))


def test_every_accelerator_runs_the_same_steps(tmp_path):
    # 64 files, batch 7, 3 accelerators: floor(64 / 7 / 3) = 3 steps each, 1 file left over
    outcome = training.run(Target(tmp_path), table(files=64, accelerators=[3], epochs=[2],
                                                  calibrate=False))
    (r,) = outcome.result["runs"]
    assert r["steps_per_epoch"] == 3
    for e in r["per_epoch"]:
        assert e["steps_per_accelerator"] == [3, 3, 3]
        assert e["samples"] == 3 * 7 * 3


def test_throttled_reads_lower_au_as_predicted(tmp_path):
    """Every 64 KiB block read is held 10 ms: a step's 4 files take blocks x 10 ms each, two
    read threads in parallel; the step computes 40 ms, so AU = 40 ms / that read time."""
    t = table(files=48, record_scale=256 * 1024 / 146_600_628, batch_size=4,
              computation_time="40 ms", read_threads=2, block_size="64 KiB", calibrate=False)
    target = Target(tmp_path)
    fast = training.run(target, t)
    slow = training.run(target, t, faults=[Fault(op="read", delay=0.010)])
    data = dataset.prepare(target, training.workload_of(t))
    blocks = np.mean([math.ceil(s / 65536) for s in data.sizes])
    predicted = min(1.0, 0.040 / (4 * blocks * 0.010 / 2))
    assert predicted < 0.7  # the throttle must bite for the test to mean anything
    assert slow.result["runs"][0]["au_mean"] == pytest.approx(predicted, abs=0.12)
    assert fast.result["runs"][0]["au_mean"] > 0.9


def test_cancel_stops_every_reader(tmp_path):
    """A failing read stops the epoch with that error, not a hang or a broken barrier."""
    t = table(accelerators=[2], calibrate=False)
    with pytest.raises(engine.DeviceIoError):
        training.run(Target(tmp_path), t, faults=[Fault(op="read", error=errno.EIO, every=5)])


@needs_root
def test_device_counters_match_the_bytes_read(tmp_path, loop_device):
    dev = loop_device(256 << 20)
    mnt = loop_device.mount(dev)
    t = table(files=32, record_scale=0.01, computation_time="1 ms", calibrate=False)
    outcome = training.run(Target(mnt), t)
    (r,) = outcome.result["runs"]
    assert r["device_read_bytes"] is not None
    assert r["device_read_bytes"] == pytest.approx(r["bytes"], rel=0.05)
    # through the page cache a second epoch is served from memory: visible, not hidden
    cached = training.run(Target(mnt), {**t, "direct": False, "epochs": [1]})
    assert cached.result["runs"][0]["path"] == "page cache"


# ------------------------------------------------------------------ bad input, before any I/O


@pytest.mark.parametrize("given, key", [
    ({"batch_size": 0}, "batch_size"),
    ({"files": -4}, "files"),
    ({"record_scale": -0.5}, "record_scale"),
    ({"workload": "unet4d"}, "workload"),
    ({"accelerators": [0]}, "accelerators"),
    ({"files": 10, "accelerators": [2]}, "accelerators"),  # 0 steps per epoch
    ({"block_size": "1000"}, "block_size"),
])
def test_bad_configs_are_refused_before_any_io(tmp_path, given, key):
    with pytest.raises(ProfileError) as e:
        table(**given)
    assert any(k.endswith(key) for _, k, _ in e.value.problems), e.value.problems
    assert not (tmp_path / dataset.FOLDER).exists()


def test_train_command_refuses_bad_flags_without_touching_the_target(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "train", "--target", str(tmp_path),
                           "--workload", "unet3d-h100", "--batch-size", "0"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--batch-size" in proc.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ command line and suite


V3 = [n for n, w in configs.WORKLOADS.items() if "MLPerf Storage v3.0" in w.source]


def test_mlperf_storage_v3_adds_retinanet_flux_and_dlrm():
    assert {n.rsplit("-", 1)[0] for n in V3} == {"retinanet", "flux", "dlrm", "dlrm-parquet"}
    assert {"retinanet-a100", "retinanet-h100", "retinanet-b200", "retinanet-mi355", "flux-a100",
            "flux-h100", "flux-b200", "flux-mi355", "dlrm-a100", "dlrm-h100", "dlrm-b200",
            "dlrm-mi355"} <= set(V3)


@pytest.mark.parametrize("name", V3)
def test_train_plan_prints_the_figures_of_the_yaml_it_cites(name, capsys):
    w = configs.WORKLOADS[name]
    args = cli._parser(registry()).parse_args(["train", "--plan", "--workload", name])
    assert command.run(args, registry()) == 0
    out = " ".join(capsys.readouterr().out.split())
    yaml = name.replace("-", "_")
    assert f"configs/dlio/workload/{yaml}.yaml at " in out
    assert f"{w.files:,} {w.format} files x {w.samples_per_file:,} sample(s) of " \
        f"{w.record_length:,}" in out
    assert f"batch {w.batch:,}, {w.read_threads} read threads; compute " \
        f"{w.computation_time:g} s a step; {w.epochs} epoch(s); AU floor " \
        f"{w.au_floor * 100:g} %" in out
    assert f"= {w.demand() / 1e6:,.1f} MB/s" in out


@pytest.mark.parametrize("name, given", [
    ("retinanet-h100", {"files": 48, "record_scale": 0.05}),
    ("flux-b200", {"files": 4, "record_scale": 0.01, "batch_size": 8}),  # 288 samples a file
    ("dlrm-h100", {"files": 64, "batch_size": 16, "record_scale": 1.0}),  # 512-byte files
])
def test_the_v3_workloads_run_scaled(tmp_path, name, given):
    """Each new workload's files are made and read back through the engine as published
    (one sample a file, or 288 in flux-b200's), scaled to fit a test: every byte is read."""
    t = table(workload=name, computation_time="5 ms", **given)
    outcome = training.run(Target(tmp_path), t)
    (r,) = outcome.result["runs"]
    w = training.workload_of(t)
    assert r["bytes"] >= configs.steps_per_epoch(w, 1) * w.batch * w.record_length * 0.5
    assert 0 < r["au_mean"] <= 1 and r["samples_per_s"] > 0
    training.remove(Target(tmp_path))


def test_train_command_json(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "train", "--target", str(tmp_path),
                           "--files", "42", "--record-scale", "0.002", "--computation-time",
                           "20ms", "--read-threads", "2", "--accelerators", "2", "--epochs", "2",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for key in ("au_mean", "au_min_epoch", "samples_per_s", "bw_bytes", "device_read_bytes",
                "per_epoch", "au_ceiling", "caveats"):
        assert key in doc
    assert len(doc["per_epoch"]) == 2 and doc["accelerators"] == 2
    assert doc["au_min_epoch"] <= doc["au_mean"] <= 1.0
    assert doc["caveats"] and "size rule" in doc["caveats"][0]
    assert not (tmp_path / dataset.FOLDER).exists()  # removed unless --keep


@pytest.mark.slow
def test_training_suite_judges_and_says_the_dataset_is_too_small(tmp_path):
    proc, results = run_suite(tmp_path, "--qual-seed", "12345", suite="test_training_io.py",
                              profile=TINY_ALL)
    record = load_record(results)
    summary = record["summary"]
    # the file order is the run's own (MLPerf v2.0: a new one every run), not --qual-seed: the
    # suite's shared outcome gives no seed to a family whose own field takes --seed
    seeds = {m["context"]["shuffle_seed"] for t in record["tests"] for m in t["measurements"]
             if "shuffle_seed" in m["context"]}
    assert seeds and 12345 not in seeds
    assert summary["checks_failed"] == 0 and summary["tests_broken"] == 0, proc.stdout[-3000:]
    assert any("size rule" in c for c in summary["caveats"])
    assert "CAVEAT" in proc.stdout
    metrics = {m["metric"] for t in record["tests"] for m in t["measurements"]}
    assert {"train_au", "train_au_ceiling", "train_bw", "train_max_accelerators",
            "train_dataset_share"} <= metrics
    charts = list((results / "allure-results").glob("*-attachment.png"))
    assert len(charts) == 2


@pytest.mark.slow
def test_a_criterion_above_the_simulators_ceiling_is_refused(tmp_path):
    """With 0.5 ms of compute per step the simulator cannot reach 99.9 % AU even without
    storage; a profile asking for it gets an error, not a verdict."""
    profile = tmp_path / "ceiling.toml"
    profile.write_text(f'''[profile]
extends = "{TINY_PROFILE}"
description = "tests: an AU bound the simulation cannot show"

[training]
files = 42
record_scale = 0.002
computation_time = "0.5 ms"
read_threads = 2
accelerators = [2]
epochs = [2]

[[training.criteria]]
metric = "train_au"
params = {{ accelerators = 2, epochs = 2 }}
min = 99.9
unit = "%"
source = "tests: above the ceiling"
''')
    proc, results = run_suite(tmp_path, "-k", "utilisation", suite="test_training_io.py",
                              profile=profile)
    record = load_record(results)
    assert record["summary"]["verdict"] == "ERROR", proc.stdout[-3000:]
    assert "cannot judge the drive" in proc.stdout


@needs_root
def test_dlrm_b200_reads_only_the_columns_its_loader_wants(tmp_path, loop_device):
    """DLRM's b200 parquet files hold 200 columns of 761 B a row in row groups; its loader
    reads 40 of them (160 B a row): each file's chunks of those columns in each row group,
    widened to whole logical blocks (O_DIRECT), and the device reads just those."""
    mnt = loop_device.mount(loop_device(256 << 20), options="noatime")
    t = table(workload="dlrm-b200", files=4, record_scale=0.002, computation_time="1 ms",
              calibrate=False)
    w = training.workload_of(t)
    assert w.sample_read_bytes == 160 and len(w.columns) == 200 and w.record_length == 761
    per_file = engine.Ranges(w.column_ranges(), Target(mnt).align).nbytes
    assert per_file < 0.5 * w.file_bytes  # the columns, not the file
    (r,) = training.run(Target(mnt), t).result["runs"]
    assert r["bytes"] % per_file == 0 and 1 <= r["bytes"] // per_file <= 4
    assert r["device_read_bytes"] == pytest.approx(r["bytes"], rel=0.05)
    training.remove(Target(mnt))


def test_ranges_widen_to_the_alignment_and_merge(tmp_path):
    """A reader of ranges reads each, widened to whole 4 KiB blocks, neighbours once."""
    path = tmp_path / "cols.bin"
    path.write_bytes(os.urandom(1 << 20))
    ranges = engine.Ranges([(100, 10), (4096, 4096), (8190, 4), (900_000, 200_000)], 4096)
    assert len(ranges) == 2 and ranges.nbytes == 12288 + (1_101_824 - 897_024)
    reader = SampleReader(block_size=64 << 10, queue_depth=4, align=4096)
    assert reader.read(str(path), ranges) == 12288 + (1 << 20) - 897_024  # to the file's end
    assert reader.read(str(path)) == 1 << 20
    with pytest.raises(InvalidJob, match="unaligned"):  # the engine checks what it is given
        reader.read(str(path), engine.Ranges([(512, 512)], 512))
    reader.close()

"""Proof or no verdict: a measurement that claims the device is judged only with the device's
own counters (else UNVERIFIED, the run INCOMPLETE, exit 6), unless the profile makes device
truth optional (then every result carries a caveat); and every implausibility error fires."""

from __future__ import annotations

import os
import textwrap
from dataclasses import replace

import pytest
from testbed import TINY_PROFILE, load_record, needs_root, run_suite

from qual import engine, honesty
from qual.exits import Exit
from qual.targets import Identity, Target
from qual.workloads import checkpoint, gnn, training

GEN3_X1 = Identity(transport="nvme", link_speed="8.0 GT/s PCIe", link_width="1")  # 0.98 GB/s


@needs_root
@pytest.mark.slow
def test_a_target_without_device_counters_is_incomplete_not_passed(tmp_path, tmpfs):
    proc, results = run_suite(tmp_path, f"--qual-target={tmpfs / 'drive.dat'}")
    assert proc.returncode == Exit.INCOMPLETE, proc.stdout[-3000:]
    summary = load_record(results)["summary"]
    assert summary["verdict"] == "INCOMPLETE" and summary["checks_passed"] == 0
    assert set(summary["not_judged"]) == {"seq_read_bw[bs=64K,qd=4]",
                                          "rand_read_lat[bs=4K,qd=1,pct=99]"}
    assert all("no block device counters" in u for u in summary["unverified"])
    assert "UNVERIFIED: seq_read_bw[bs=64K,qd=4]" in proc.stdout


@needs_root
@pytest.mark.slow
def test_optional_device_truth_judges_with_a_caveat_on_every_result(tmp_path, tmpfs):
    profile = tmp_path / "smoke.toml"
    profile.write_text(f'[profile]\nname = "smoke"\nextends = "{TINY_PROFILE}"\n'
                       'description = "a pipeline smoke test"\ndevice_truth = "optional"\n')
    proc, results = run_suite(tmp_path, f"--qual-target={tmpfs / 'drive.dat'}", profile=profile)
    assert proc.returncode == 0, proc.stdout[-3000:]
    record = load_record(results)
    verdicts = [v for t in record["tests"] for v in t["verdicts"]]
    assert record["summary"]["verdict"] == "PASS" and len(verdicts) == 2
    assert all(any("no device truth" in c for c in v["caveats"]) for v in verdicts)


def test_a_profile_names_only_known_device_truth_modes(tmp_path):
    from qual.thresholds import ProfileError, load_profile
    from qual.workloads import registry

    bad = tmp_path / "bad.toml"
    bad.write_text(f'[profile]\nextends = "{TINY_PROFILE}"\ndescription = "x"\n'
                   'device_truth = "sometimes"\n')
    with pytest.raises(ProfileError, match="device_truth: 'sometimes' is not one of required"):
        load_profile(bad, registry())


# ------------------------------------------------------------------ each implausibility fires


@pytest.fixture(scope="module")
def read_result(tmp_path_factory):
    """A real O_DIRECT read job of 4 MiB on a scratch file."""
    target = Target(tmp_path_factory.mktemp("honesty") / "t.dat")
    job = target.prepare(target.job(op="read", pattern="sequential", block_size=64 << 10,
                                    queue_depth=4, size=4 << 20, bytes=4 << 20))
    result = engine.run_job(job)
    yield result
    target.cleanup()


def test_reads_the_device_did_not_count_came_from_a_cache(read_result):
    seen = {"read_bytes": 0, "write_bytes": 0, "utilisation": 0.0}
    with pytest.raises(honesty.ImplausibleMeasurement, match="did not reach the device"):
        honesty.check_io(read_result, seen, Identity())
    counted = {**seen, "read_bytes": read_result.bytes}
    assert honesty.check_io(read_result, counted, Identity())["device_truth"] == honesty.COUNTED


def test_a_page_cache_job_makes_no_claim_on_the_device(read_result):
    cached = replace(read_result, job=replace(read_result.job, direct=False))
    checked = honesty.check_io(cached, {"read_bytes": 0, "write_bytes": 0, "utilisation": 0.0},
                               Identity())
    assert checked["path"] == "page cache"


def test_faster_than_the_link_is_an_error(read_result):
    fast = replace(read_result, elapsed=read_result.bytes / 2e9)  # 2 GB/s on a ~1 GB/s link
    with pytest.raises(honesty.ImplausibleMeasurement, match="exceeds what a 8.0 GT/s PCIe x1"):
        honesty.check_io(fast, None, GEN3_X1)
    with pytest.raises(honesty.ImplausibleMeasurement, match="exceeds what the link can carry"):
        honesty.check_link(2e9, GEN3_X1, "t", "verification reads")


def _checkpoint_result(device: dict | None, restore_device: dict | None) -> dict:
    one = {"pass": 1, "index": 1, "name": "c1", "seconds": 1.0, "bytes": 1 << 20,
           "rank_seconds": [1.0], "rank_bytes": [1 << 20], "backend": "io_uring",
           "device": device}
    return {"checkpoints": [one], "world": 1, "plan": {}, "per_pass": 1, "data_period": 1,
            "passes": 1, "restore": {"path": "c1", "seconds": 1.0, "bytes": 1 << 20,
                                     "intact": True, "errors": [], "verified_bytes": 1 << 20,
                                     "device": restore_device}}


def test_checkpoint_writes_and_restores_must_reach_the_device():
    none = {"read_bytes": 0, "write_bytes": 0, "utilisation": 0.0}
    full = {"read_bytes": 1 << 20, "write_bytes": 1 << 20, "utilisation": 1.0}
    with pytest.raises(honesty.ImplausibleMeasurement, match="checkpoint writes"):
        checkpoint.pass_measurements(_checkpoint_result(none, full), "t")
    with pytest.raises(honesty.ImplausibleMeasurement, match="restore reads"):
        checkpoint.restore_measurements(_checkpoint_result(full, none), "t")
    proven = checkpoint.pass_measurements(_checkpoint_result(full, full), "t")
    assert {m.device_truth for m in proven if m.metric != "ckpt_size"} == \
        {honesty.COUNTED}
    unknown = checkpoint.pass_measurements(_checkpoint_result(None, None), "t")
    assert all(honesty.unproven(m.device_truth) for m in unknown if m.metric == "ckpt_write_bw")


def test_training_reads_with_o_direct_must_reach_the_device(tmp_path):
    run = {"path": "O_DIRECT", "backend": "io_uring", "bw_bytes": 1e8, "bytes": 1 << 20,
           "device_read_bytes": 0}
    target = Target(tmp_path / "t.dat")
    with pytest.raises(honesty.ImplausibleMeasurement, match="O_DIRECT sample reads"):
        training._check_run(run, target)
    cached = training._check_run({**run, "path": "page cache"}, target)
    assert cached["device_truth"] == honesty.COUNTED


def test_gids_reads_must_reach_the_device():
    cache = {"hits": 1, "misses": 1, "cpu_hits": 0, "reads": 1, "read_bytes": 1 << 20,
             "io_s": 0.01, "hit_rate": 0.5, "writes": 0,
             "device": {"read_bytes": 0, "write_bytes": 0, "utilisation": 0.0}}
    loader = {"steps": 1, "measured": 1, "setup": {}, "accuracy": 1.0, "e2e_s": 1.0,
              "stages": dict.fromkeys(gnn.STAGES, 0.1), "rows": 10, "cache": cache}
    result = {"dataset": {"size": "tiny", "synthetic": True}, "store": {"row_bytes": 4096},
              "loaders": {"gids": loader}}
    with pytest.raises(honesty.ImplausibleMeasurement, match="GIDS feature reads"):
        gnn.measurements(result, "t")


# ------------------------------------------------------------------ the verdict an implausibility gives

# pytest plugins (-p) that fake what the suites read about the device, no root needed
FAKES = {
    "counters": """
        from qual import targets as target
        from qual.targets.identity import DeviceStat

        def pytest_configure(config):  # a device whose counters never move
            target.Target.device_stat = lambda self: DeviceStat(0, 0, 0, 0.0)
        """,
    "link": """
        import dataclasses
        from qual import targets as target

        real = target.read_identity

        def pytest_configure(config):  # a link no disk is slow enough for: 125 KB/s
            target.read_identity = lambda *a, **k: dataclasses.replace(
                real(*a, **k), link_speed="0.001 GT/s", link_width="1")
        """,
}


@pytest.mark.parametrize("fake, error", [
    ("counters", "did not reach the device (a cache served them)"),
    ("link", "exceeds what a 0.001 GT/s x1 link can carry"),
])
@pytest.mark.slow
def test_an_implausible_measurement_is_an_error_not_a_verdict(tmp_path, fake, error):
    (tmp_path / "fake.py").write_text(textwrap.dedent(FAKES[fake]))
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    proc, results = run_suite(tmp_path, "-p", "fake", env_extra={"PYTHONPATH": path})
    summary = load_record(results)["summary"]
    assert proc.returncode == 1 and summary["verdict"] == "ERROR", proc.stdout[-3000:]
    assert summary["checks_passed"] == summary["checks_failed"] == 0
    assert error in proc.stdout


def test_the_commands_run_the_suites_checks(tmp_path, monkeypatch, capsys):
    """`qual train` reads through the same checks as the suite: counters that never move make
    its O_DIRECT reads implausible."""
    from qual import cli
    from qual.targets.identity import DeviceStat

    monkeypatch.setattr(Target, "device_stat", lambda self: DeviceStat(0, 0, 0, 0.0))
    rc = cli.main(["train", "--target", str(tmp_path), "--files", "16", "--record-scale",
                   "0.002", "--computation-time", "10ms", "--accelerators", "1", "--epochs", "1",
                   "-q"])
    assert rc == 1
    assert "O_DIRECT sample reads: they did not reach the device" in capsys.readouterr().err


@pytest.mark.parametrize("seen, from_device, truth", [
    (None, None, honesty.NO_DEVICE),  # nobody counted: unknown, not true
    ({"read_bytes": 0, "write_bytes": 0, "utilisation": 0.0}, False, "not from the device"),
    ({"read_bytes": 4 << 20, "write_bytes": 0, "utilisation": 1.0}, True, honesty.COUNTED),
])
def test_torch_load_is_from_the_device_only_when_the_device_counted_it(seen, from_device, truth):
    result = {**_checkpoint_result(None, None),
              "torch": {"load_device": seen, "bytes": 4 << 20, "file_bytes": 4 << 20,
                        "save_s": 1.0, "load_s": 1.0, "round_trip_equal": True}}
    load = next(m for m in checkpoint.baseline_measurements(result, "t")
                if m.metric == "torch_load_bw")
    assert load.context["load_from_device"] is from_device
    assert load.device_truth.startswith(truth)

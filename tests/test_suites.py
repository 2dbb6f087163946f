"""Every shipped suite in one run of the tests' profile (tests/profiles/tiny-all.toml), read by
the tests of each family's suite that need the whole pipeline: one run rather than one a
family."""

from __future__ import annotations

import json

import pytest

from testbed import TINY_ALL, load_record, run_suite


@pytest.fixture(scope="module")
def every_suite(tmp_path_factory):
    """Every suite, as `qual run` would run them, from a folder of its own: that folder, the
    pytest process and the run record."""
    folder = tmp_path_factory.mktemp("every-suite")
    proc, results = run_suite(folder, suite="", profile=TINY_ALL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return folder, results, load_record(results)


def _of(record: dict, suite: str) -> list[dict]:
    return [t for t in record["tests"] if t["nodeid"].split("::")[0].endswith(suite)]


@pytest.mark.slow
def test_every_suite_passes_and_the_checkpoint_suite_records(every_suite):
    folder, results, record = every_suite
    assert record["summary"]["verdict"] == "PASS"
    ids = {m["id"] for t in _of(record, "test_checkpoint.py") for m in t["measurements"]}
    assert {"ckpt_write_s[pass=1]", "ckpt_write_s[pass=2]", "ckpt_restore_intact",
            "torch_load_bw"} <= ids
    assert not (folder / ".qual" / "qual-checkpoints").exists()  # removed at the end
    charts = [a for d in (results / "allure-results").glob("*-result.json")
              for a in json.loads(d.read_text()).get("attachments", [])
              if a["name"] == "seconds per checkpoint"]
    assert len(charts) == 1


@pytest.mark.slow
def test_the_gnn_suite_passes_and_records(every_suite):
    folder, _, record = every_suite
    tests = _of(record, "test_gnn.py")
    ids = {m["id"] for t in tests for m in t["measurements"]}
    assert {"gnn_accuracy[loader=gids]", "gnn_accuracy[loader=mmap]", "gnn_speedup",
            "gnn_hit_rate", "gnn_stage_s[loader=gids,stage=gather]"} <= ids
    speedup = next(m for t in tests for m in t["measurements"]
                   if m["id"] == "gnn_speedup")["context"]
    # judged at equal memory: both budgets recorded, the baseline held to its own
    assert speedup["gids_memory_bytes"] == speedup["mmap_memory_bytes"] > 0
    assert speedup["mmap_memory"]["steps_over_budget"] == 0 and "unverifiable" not in speedup
    assert speedup["mmap_memory"]["steps_measured"] > 0
    verdicts = [v for t in tests for v in t["verdicts"]]
    assert {v["id"] for v in verdicts} == {"gnn_accuracy[loader=gids]",
                                           "gnn_accuracy[loader=mmap]"}
    assert all(v["passed"] for v in verdicts)
    # the calibrated synthetic IGBH: RGAT through either real loader lands in 75-85 %, its
    # spread recorded
    for m in (m for t in tests for m in t["measurements"] if m["metric"] == "gnn_accuracy"):
        assert 0.75 <= m["value"] <= 0.85, m
        low, high = m["context"]["interval"]
        assert low < m["value"] < high and m["context"]["batches"] > 1
    assert not (folder / ".qual" / "qual-igbh").exists()
    assert not (folder / ".qual" / "qual-gnn").exists()

"""Checkpoint qualification, by the profile's procedure: seed 004's passes of LLM checkpoints
that fill the target (the mean seconds per checkpoint of every pass judged against the
profile, the last checkpoint restored and verified bit for bit, and torch.save / torch.load
for comparison), or MLPerf Storage v2.0's runs of writes, cache clear and reads."""

import allure
import pytest

pytestmark = [pytest.mark.checkpoint, pytest.mark.destructive]


def _procedure(table, wanted: str) -> None:
    if table["procedure"] != wanted:
        pytest.skip(f"the profile's checkpoint procedure is {table['procedure']}")


@allure.feature("MLPerf Storage v2.0 checkpointing")
def test_mlperf_v2(outcome, table, target, record):
    """Per run: the writes, the page cache cleared, every checkpoint read back from the device
    and verified; MLPerf's figures (slowest rank) per run and over the runs."""
    _procedure(table, "mlperf-v2")
    record.add(outcome.measurements("mlperf"))


@allure.feature("checkpoint passes")
def test_passes(outcome, table, target, record):
    """Mean seconds per checkpoint in every pass, and each checkpoint's own seconds."""
    _procedure(table, "passes")
    record.add(outcome.measurements("passes"))
    record.attach("seconds per checkpoint", outcome.charts()["seconds per checkpoint"])


@allure.feature("checkpoint restore")
def test_restore(outcome, table, target, record):
    """The last checkpoint read back, every chunk's CRC32C checked, every byte compared."""
    _procedure(table, "passes")
    if not table["restore"]:
        pytest.skip("the profile does not restore")
    record.add(outcome.measurements("restore"))


@allure.feature("torch baseline")
def test_torch_baseline(outcome, table, target, record):
    """torch.save (+ fsync) and torch.load of the same tensors on the same target."""
    _procedure(table, "passes")
    if not table["baseline"]:
        pytest.skip("the profile has no torch baseline")
    record.add(outcome.measurements("baseline"))

"""Training-data ingestion, seed 001's procedure: simulated accelerators read sample files
through the native engine and compute for a fixed time per step, swept over accelerator counts;
AU and bandwidth judged against the profile, the accelerators one drive keeps busy, the
simulator's own AU ceiling, and whether the dataset is big enough to mean anything."""

import allure
import pytest

from qual.workloads.training import charts

pytestmark = [pytest.mark.training]


def _pick(outcome, *metrics):
    return [m for m in outcome.measurements() if m.metric in metrics]


@allure.feature("training AU")
def test_utilisation(outcome, record):
    """Mean and lowest-epoch AU per accelerator count, and the no-storage ceiling."""
    record.add(_pick(outcome, "train_au", "train_au_min_epoch", "train_au_ceiling"))
    record.attach("AU vs accelerators", charts.sweep_chart(outcome.last, "au"))


@allure.feature("training throughput")
def test_throughput(outcome, record):
    """Samples/s and bytes/s per accelerator count, and the share the device really read."""
    record.add(_pick(outcome, "train_samples_per_s", "train_bw",
                     "train_device_read_share"))
    record.attach("MiB/s vs accelerators", charts.sweep_chart(outcome.last, "bw"))


@allure.feature("accelerators per drive")
def test_accelerators_per_drive(outcome, record):
    """The most accelerators of the sweep that held the AU floor (MLPerf Storage's headline)."""
    record.add(_pick(outcome, "train_max_accelerators"))


@allure.feature("training dataset size")
def test_dataset_size(outcome, record):
    """Files against MLPerf Storage's minimum (500 steps of every accelerator, 5x host RAM)."""
    record.add(_pick(outcome, "train_dataset_share"))

"""Bandwidth qualification: seed 004's GDSIO-style matrix (block size x queue depth for
sequential and random reads and writes) and 4K random-read latency QoS, judged against the
profile's [bandwidth] table."""

import allure
import pytest

from qual.workloads import bandwidth
from qual.workloads.bandwidth import charts

pytestmark = [pytest.mark.bandwidth, pytest.mark.usefixtures("drive_health")]


def pytest_generate_tests(metafunc):
    if "cell" in metafunc.fixturenames:
        from qual.plugin.session import qual_session

        table = qual_session(metafunc.config).profile.table(bandwidth.NAME)
        cells = bandwidth.matrix(table) if table else []
        params = [pytest.param(c, id=c.label,
                               marks=[pytest.mark.destructive] if c.op == "write" else [])
                  for c in cells]
        metafunc.parametrize("cell", params)


@allure.feature("bandwidth matrix")
def test_cell(cell, table, target, record, progress):
    """One cell of the matrix: bandwidth and IOPS for a pattern, block size and depth (a write
    cell in rounds until steady state where the profile asks for it)."""
    record.outcome(bandwidth.run(target, table, seed=record.seed, progress=progress,
                                 cells=[cell], latency=False), charts=False)


@allure.feature("latency QoS")
def test_latency(table, target, record):
    """Random-read completion latency percentiles at the profile's block size and depth."""
    if "latency" not in table:
        pytest.skip("profile has no [bandwidth.latency] table")
    record.outcome(bandwidth.run(target, table, seed=record.seed, cells=[]))


@allure.feature("charts")
def test_charts(session_measurements, record):
    """The matrix as heatmaps (block size x depth -> GiB/s), one per pattern."""
    cells = [m.as_dict() for m in session_measurements if m.family == bandwidth.NAME]
    if not any(m["metric"].endswith("_bw") for m in cells):
        pytest.skip("no bandwidth cell ran in this process")
    record.attach("bandwidth heatmap", charts.heatmaps(cells, "bandwidth matrix (GiB/s)"))


@allure.feature("drive health")
def test_drive_health(drive_health, record):
    """The SMART health log before and after this suite: critical warning, media errors,
    error-log entries, the hottest temperature sampled through it, thermal transitions, spare
    headroom, bytes the drive counted as written."""
    drive_health.record(record)

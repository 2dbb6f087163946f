"""Bandwidth qualification: seed 004's GDSIO-style matrix (block size x queue depth for
sequential and random reads and writes) and 4K random-read latency QoS, judged against the
profile's [bandwidth] table."""

import allure
import pytest

from qual.workloads import bandwidth
from qual.workloads.bandwidth import charts

pytestmark = [pytest.mark.bandwidth]


def pytest_generate_tests(metafunc):
    """Every cell, and the latency test, once per repetition of the profile's `repeats`: all
    of them once, then all again (repetitions interleaved, not back to back)."""
    from qual.plugin.session import qual_session

    session = qual_session(metafunc.config)
    if "cell" in metafunc.fixturenames:
        table = session.profile.table(bandwidth.NAME)
        cells = {c.label: c for c in (bandwidth.matrix(table) if table else [])}
        params, ids = session.repetitions(list(cells))
        metafunc.parametrize(["cell", "repetition"], [
            pytest.param(cells[label], rep, id=i,
                         marks=[pytest.mark.destructive] if cells[label].op == "write" else [])
            for (rep, label), i in zip(params, ids)])
    elif "repetition" in metafunc.fixturenames and session.repeats > 1:
        params, ids = session.repetitions(["latency"])
        metafunc.parametrize("repetition", [rep for rep, _ in params],
                             ids=[i.removeprefix("latency-") for i in ids])


@allure.feature("bandwidth matrix")
def test_cell(cell, repetition, table, target, record, progress):
    """One cell of the matrix: bandwidth and IOPS for a pattern, block size and depth (a write
    cell in rounds until steady state where the profile asks for it); the last repetition
    judges the median of every repetition."""
    record.repeat(repetition)
    record.outcome(bandwidth.run(target, table, seed=record.seed, progress=progress,
                                 cells=[cell], latency=False), charts=False)


@allure.feature("latency QoS")
def test_latency(repetition, table, target, record):
    """Random-read completion latency percentiles at the profile's block size and depth."""
    if "latency" not in table:
        pytest.skip("profile has no [bandwidth.latency] table")
    record.repeat(repetition)
    record.outcome(bandwidth.run(target, table, seed=record.seed, cells=[]))


@allure.feature("charts")
def test_charts(session_measurements, record):
    """The matrix as heatmaps (block size x depth -> GiB/s), one per pattern."""
    cells = [m.as_dict() for m in session_measurements
             if m.family == bandwidth.NAME and m.final]
    if not any(m["metric"].endswith("_bw") for m in cells):
        pytest.skip("no bandwidth cell ran in this process")
    record.attach("bandwidth heatmap", charts.heatmaps(cells, "bandwidth matrix (GiB/s)"))

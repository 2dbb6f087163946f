"""SNIA PTS-E: each test from a purged (NVMe) and preconditioned region, in rounds until its
tracking variable is steady, reported as the specification's tables and plots, judged against
the profile's [pts] table."""

import allure
import pytest

from qual.workloads import pts

pytestmark = [pytest.mark.pts, pytest.mark.destructive]


def pytest_generate_tests(metafunc):
    if "pts_test" in metafunc.fixturenames:  # the tests the profile's table runs, in its order
        from qual.plugin.session import qual_session

        table = qual_session(metafunc.config).profile.table(pts.NAME)
        metafunc.parametrize("pts_test", table["tests"] if table else [])


@allure.feature("SNIA PTS")
def test_pts(pts_test, table, target, record, progress):
    """One PTS test: purge, precondition, rounds to steady state, the window's means (write
    saturation: until 4x the region is written)."""
    outcome = pts.run_test(target, table, pts_test, seed=record.seed, progress=progress)
    for line in outcome.lines():
        print(line)
    record.attach(f"PTS {pts_test} report", outcome.report_text(), kind="text")
    record.outcome(outcome)

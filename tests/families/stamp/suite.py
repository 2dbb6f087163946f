"""The stamp family's suite: every durable write timed, judged against the profile."""

import allure
import pytest

from qual.workloads import registry

pytestmark = [pytest.mark.stamp]


@pytest.fixture(scope="module")
def stamp(target):
    family = registry()["stamp"]
    yield family
    family.remove(target)


@allure.feature("durable writes")
def test_durable_writes(stamp, table, target, record, progress):
    """write + fdatasync latency percentiles and rate."""
    record.outcome(stamp.run(target, table, seed=record.seed, progress=progress))

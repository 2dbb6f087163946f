"""Data integrity: verification blocks (offset, run seed, sequence, CRC32C) written over the
profile's region in sequential and random order, overwritten by a newer generation, and read
back; a corrupted, stale or misdirected block fails the drive and is named with its offset."""

import allure
import pytest

from qual.workloads import integrity

pytestmark = [pytest.mark.integrity, pytest.mark.destructive]


@pytest.fixture(params=integrity.PATTERNS)
def pattern(request, table):
    if request.param not in table["patterns"]:
        pytest.skip(f"the profile does not verify in {request.param} order")
    return request.param


@allure.feature("data integrity")
def test_blocks_read_back_as_written(pattern, table, target, record, progress):
    """Every block of the region holds its own offset, this run's seed and the last sequence
    written, and its bytes pass their CRC32C."""
    outcome = integrity.IntegrityOutcome(
        [integrity.run_pattern(target, table, pattern, progress=progress)], target)
    for line in outcome.lines():  # every bad block named with its offset
        print(line)
    record.outcome(outcome)

"""Data integrity: verification blocks (offset, run seed, sequence, CRC32C) written over the
profile's region in sequential and random order, overwritten by a newer generation, and read
back; a corrupted, stale or misdirected block fails the drive and is named with its offset.
Its test is the family's (qual.workloads.integrity.TESTS), one for each order the table
names."""

import pytest

pytestmark = [pytest.mark.integrity, pytest.mark.destructive]

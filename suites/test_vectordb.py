"""Vector database (MLPerf Storage v3.0) on DiskANN itself: a disk index built on the drive,
then searched by beams of O_DIRECT sector reads with many queries in flight: QPS, latency,
recall against an exact search, and the drive's bytes per query, proven by its counters. Its
tests are the family's (qual.workloads.vectordb.TESTS)."""

import pytest

pytestmark = [pytest.mark.vectordb]

"""Bandwidth qualification: seed 004's GDSIO-style matrix (block size x queue depth for
sequential and random reads and writes) and 4K random-read latency QoS, judged against the
profile's [bandwidth] table. Its tests are the family's (qual.workloads.bandwidth.TESTS): a
test per cell and the latency test, each repeated and interleaved, then the heatmaps."""

import pytest

pytestmark = [pytest.mark.bandwidth]

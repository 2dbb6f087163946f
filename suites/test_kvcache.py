"""KV-cache offload (MLPerf Storage v3.0): users' conversations whose KV entries prefill writes
and decode reads back through host memory and the drive; the drive's latency and bytes (proven
by its counters), and what the users saw: end-to-end latency per QoS class, queue wait, tokens
per second. Its tests are the family's (qual.workloads.kvcache.TESTS)."""

import pytest

pytestmark = [pytest.mark.kvcache]

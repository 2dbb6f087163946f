"""KV-cache offload (MLPerf Storage v3.0): users' conversations whose KV entries prefill writes
and decode reads back through host memory and the drive; the drive's latency and bytes (proven
by its counters), and what the users saw: end-to-end latency per QoS class, queue wait, tokens
per second."""

import allure
import pytest

pytestmark = [pytest.mark.kvcache]


@allure.feature("KV-cache storage")
def test_storage(outcome, record):
    """Prefill-write and decode-read latency on the drive, decode bytes read, hits per tier."""
    record.add(outcome.measurements("storage"))


@allure.feature("KV-cache service")
def test_service(outcome, record):
    """End-to-end latency per QoS class, queue wait, tokens per second (a search's answer);
    the per-request latency chart, and a search's trials."""
    record.add(outcome.measurements("service"))
    for title, chart in outcome.charts().items():
        record.attach(title, chart)

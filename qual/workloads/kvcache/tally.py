"""What a KV-cache run served, in memory that does not grow with the run: each latency the
family reports goes into the engine's log-linear histogram (<= 0.78 % error) as the request
is served, and a uniform sample of at most KEPT requests stays whole for a reader (all of
them in a run that served no more). A run of days serves millions of requests; a list of
them would grow the server by megabytes a minute and the record with it."""

from __future__ import annotations

import random
from dataclasses import asdict

from qual.engine import LatencyHistogram

KEPT = 1000


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


class Tally:
    """Served requests: their count, the drive's write and read latency per request and per
    entry, each QoS class's end-to-end latency, the queue wait, and the kept sample."""

    def __init__(self, classes, seed: int):
        self.served = 0
        self.storage = {"write": LatencyHistogram(), "read": LatencyHistogram()}
        # one entry's write (its batch's fdatasync with it) or read, as the reference times
        # each .npy file's save or load: what MLPerf's device p95 is of
        self.entries = {"write": LatencyHistogram(), "read": LatencyHistogram()}
        self.e2e = {c: LatencyHistogram() for c in classes}
        self.wait = LatencyHistogram()
        self.kept: list[dict] = []
        self._pick = random.Random(seed)  # the sample is the same for the same run

    def entry(self, op: str, seconds: float) -> None:
        self.entries[op].record_ns(_ns(seconds))

    def add(self, request) -> None:
        self.served += 1
        for op in ("write", "read"):
            took = getattr(request, f"{op}_s")
            if took is not None:
                self.storage[op].record_ns(_ns(took))
        self.e2e[request.qos].record_ns(_ns(request.done - request.arrival))
        self.wait.record_ns(_ns(request.started - request.arrival))
        if len(self.kept) < KEPT:  # reservoir sampling: each served request kept alike
            self.kept.append(asdict(request))
        else:
            slot = self._pick.randrange(self.served)
            if slot < KEPT:
                self.kept[slot] = asdict(request)

    def e2e_tail(self) -> dict[str, tuple[float, float]]:
        """Each class that served a request: its (p95, p99) end-to-end latency in seconds."""
        return {c: (h.percentile(95.0) / 1e9, h.percentile(99.0) / 1e9)
                for c, h in self.e2e.items() if h.count}

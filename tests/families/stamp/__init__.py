"""A workload family that lives only in tests/ (this folder, plus the QUAL_FAMILIES line in
test_families.py): durable small writes, each write followed by fdatasync, timed one by one,
the way a database log or a checkpoint's commit record hits the drive. It proves that a
family needs nothing outside its folder to run through `qual run`, `qual stamp`, the run
record and the report, and shows the whole shape of one: its fields and metrics, the tests it
declares (each a section of one shared run, with its chart), the work it plans, its outcome."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from qual import charts
from qual.errors import TargetUnavailable
from qual.family import (Family, Field, Outcome, Rates, SuiteTest, Work, in_section,
                         declares)
from qual.measurement import Measurement, Metric, Param, measure, measurement_id
from qual.targets.scratch import fsync_dir, own_folder, remove_made

NAME = "stamp"
FOLDER = "qual-stamp"
MANIFEST = "manifest.json"
PERCENTILES = (50.0, 99.0)
_PCT = Param("pct", "number")

METRICS = {m.name: m for m in (
    Metric("stamp_lat", "time", "lower", (_PCT,), "write + fdatasync latency percentile"),
    Metric("stamp_rate", "rate", "higher", (), "durable writes per second"),
)}

FIELDS = (
    Field("count", "count", default=64, maximum=1_000_000, help="durable writes"),
    Field("block_size", "size", default="4K", minimum=512, help="bytes per write"),
    Field("enabled", "bool", default=True,
          help="whether its suite's tests run here (no: they skip, saying so)"),
)


def _cells(table: dict) -> list[str]:
    return [measurement_id(METRICS["stamp_lat"], {"pct": p}) for p in PERCENTILES] + \
        ["stamp_rate"]


# the suite records these apart: how long one durable write takes, and how many a second
SECTIONS = {"latency": ("stamp_lat",), "rate": ("stamp_rate",)}

def _switched_off(table: dict) -> str | None:
    return None if table["enabled"] else "stamps are switched off in this profile"


TESTS = (
    SuiteTest("latency", "durable write latency", "write + fdatasync latency percentiles.",
              section="latency", charts=("durable write latency",), skip=_switched_off),
    SuiteTest("rate", "durable write rate", "Durable writes per second.", section="rate",
              skip=_switched_off),
)


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one run: `count` writes of a block, each with its flush."""
    if not declares(TESTS, test):
        return []
    written = table["count"] * table["block_size"]
    return [Work("stamp run", written / rates.write_bw + table["count"] * 1e-3,
                 bytes_written=written, space=written, repeated=True,
                 what=f"{table['count']} durable writes")]


class StampOutcome(Outcome):
    def __init__(self, seconds: list[float], table: dict, target: str):
        self.seconds, self.table, self.target = seconds, table, target

    def _percentile(self, pct: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered)) - 1))]

    def measurements(self, section: str | None = None) -> list[Measurement]:
        return in_section(self._all(), SECTIONS, section)

    def _all(self) -> list[Measurement]:
        ctx = {"target": self.target, "count": len(self.seconds),
               "block_size": self.table["block_size"], "path": "write + fdatasync"}
        out = [measure(NAME, METRICS["stamp_lat"], {"pct": p}, self._percentile(p), context=ctx,
                       samples=self.seconds) for p in PERCENTILES]
        out.append(measure(NAME, METRICS["stamp_rate"], {}, len(self.seconds) /
                           sum(self.seconds), context=ctx))
        return out

    def document(self) -> dict:
        return {"writes": len(self.seconds), "block_size": self.table["block_size"],
                "p50_s": self._percentile(50), "p99_s": self._percentile(99),
                "rate_per_s": len(self.seconds) / sum(self.seconds)}

    def charts(self) -> dict[str, bytes]:
        fig, ax = charts.subplots(figsize=(6.4, 3.6))
        ax.plot(range(1, len(self.seconds) + 1), [s * 1e6 for s in self.seconds], ".")
        ax.set_xlabel("write (in the order issued)")
        ax.set_ylabel("write + fdatasync (us)")
        ax.set_title("durable write latency")
        return {"durable write latency": charts.png(fig)}


def run(target, table: dict, *, seed: int = 1, progress=None) -> StampOutcome:
    if target.directory is None:
        raise TargetUnavailable(95, "stamps need a filesystem", target=target.spec)
    folder = own_folder(target.directory / FOLDER) / f"run-{os.getpid()}"
    folder.mkdir()
    (folder / MANIFEST).write_text(json.dumps({"created_by": "qual"}))
    block = os.urandom(table["block_size"])
    fd = os.open(folder / "stamps.dat", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    seconds = []
    try:
        for i in range(table["count"]):
            if progress and i % max(1, table["count"] // 4) == 0:
                progress(f"stamp {i}/{table['count']}", i / table["count"])
            t0 = time.perf_counter()
            os.write(fd, block)  # appended: the file grows one durable block at a time
            os.fdatasync(fd)
            seconds.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    fsync_dir(folder)
    return StampOutcome(seconds, table, str(target.path))


def remove(target) -> None:
    if target.directory is not None:
        remove_made(target.directory / FOLDER, MANIFEST)


FAMILY = Family(name=NAME, description="durable small writes (write + fdatasync)",
                fields=FIELDS, metrics=METRICS, cells=_cells, run=run, remove=remove,
                plan=_plan, tests=TESTS, suite=Path(__file__).parent / "suite.py")

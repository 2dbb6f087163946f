"""The gdsio-style bandwidth matrix (block size x queue depth x pattern) and 4K random-read
latency QoS: which cells a profile asks for, and how one cell becomes measurements."""

from __future__ import annotations

from dataclasses import dataclass

from qual import engine, honesty
from qual.engine import BACKENDS, IoResult, Progress
from qual.record import Measurement, measure
from qual.target import Target
from qual.family import Family, Field, Metric, Param, format_block, measurement_id

NAME = "bandwidth"
# pattern -> (op, offset pattern)
PATTERNS = {
    "seq_read": ("read", "sequential"),
    "rand_read": ("read", "random"),
    "seq_write": ("write", "sequential"),
    "rand_write": ("write", "random"),
}
# nearest-rank percentiles of the latency QoS test; 100 is the maximum
LATENCY_PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99, 100.0)

_BS, _QD, _PCT = Param("bs", "size"), Param("qd", "count"), Param("pct", "number")


def _metrics() -> dict[str, Metric]:
    out = {}
    for pattern, (op, layout) in PATTERNS.items():
        out[f"{pattern}_bw"] = Metric(f"{pattern}_bw", "bandwidth", "higher", (_BS, _QD),
                                      f"{layout} {op} bandwidth")
        out[f"{pattern}_iops"] = Metric(f"{pattern}_iops", "rate", "higher", (_BS, _QD),
                                        f"{layout} {op} I/O operations per second")
    out["rand_read_lat"] = Metric("rand_read_lat", "time", "lower", (_BS, _QD, _PCT),
                                  "random-read completion latency percentile (100 = max)")
    return out


METRICS = _metrics()

FIELDS = (
    Field("size", "size", default="1 GiB", minimum=4096,
          help="bytes of the target every cell addresses"),
    Field("runtime", "duration", default="10 s", help="seconds per cell"),
    Field("workers", "count", default=1, maximum=engine.MAX_WORKERS),
    Field("block_sizes", "sizes", required=True, help="e.g. [\"1M\", \"128K\"]"),
    Field("depths", "counts", required=True, maximum=engine.MAX_QUEUE_DEPTH,
          help="queue depths, e.g. [128, 32, 1]"),
    Field("patterns", "choices", default=list(PATTERNS), choices=tuple(PATTERNS)),
    Field("backend", "choice", default="auto", choices=BACKENDS),
    Field("submit_batch", "count", default=1, minimum=0, maximum=engine.MAX_QUEUE_DEPTH,
          help="I/Os per io_uring submission (0: all ready; 1: each at once, as fio does)"),
    Field("latency", "table", fields=(
        Field("block_size", "size", default="4K"),
        Field("depth", "count", default=1, maximum=engine.MAX_QUEUE_DEPTH),
        Field("runtime", "duration", default="10 s"),
    ), help="the random-read latency QoS test"),
)


@dataclass(frozen=True, repr=False)
class Cell:
    pattern: str
    bs: int
    qd: int

    def __repr__(self) -> str:
        return self.label

    @property
    def op(self) -> str:
        return PATTERNS[self.pattern][0]

    @property
    def layout(self) -> str:
        return PATTERNS[self.pattern][1]

    @property
    def label(self) -> str:
        return f"{self.pattern}-{format_block(self.bs)}-qd{self.qd}"


def matrix(table: dict) -> list[Cell]:
    """Every cell of the profile's matrix, pattern-major, then block size, then depth."""
    return [Cell(p, bs, qd) for p in table["patterns"] for bs in table["block_sizes"]
            for qd in table["depths"]]


def _cells(table: dict) -> list[str]:
    ids = []
    for c in matrix(table):
        for kind in ("bw", "iops"):
            ids.append(measurement_id(METRICS[f"{c.pattern}_{kind}"], {"bs": c.bs, "qd": c.qd}))
    lat = table.get("latency")
    if lat:
        for pct in LATENCY_PERCENTILES:
            ids.append(measurement_id(METRICS["rand_read_lat"], {"bs": lat["block_size"],
                                                                 "qd": lat["depth"], "pct": pct}))
    return ids


def _check(table: dict) -> list[tuple[str, str]]:
    problems = []
    for bs in table["block_sizes"]:
        if bs > table["size"]:
            problems.append(("block_sizes", f"{format_block(bs)} is larger than size"))
        elif bs * table["workers"] > table["size"]:
            problems.append(("block_sizes", f"size holds fewer {format_block(bs)} blocks than "
                                            "workers to split it over"))
    lat = table.get("latency")
    if lat and lat["block_size"] > table["size"]:
        problems.append(("latency.block_size", "is larger than size"))
    return problems


FAMILY = Family(name=NAME, description="gdsio-style bandwidth matrix and random-read latency QoS",
                fields=FIELDS, metrics=METRICS, check=_check, cells=_cells)


def _run(target: Target, table: dict, *, op: str, layout: str, bs: int, qd: int, runtime: float,
         seed: int, progress: Progress | None) -> tuple[IoResult, dict]:
    size = table["size"]
    job = target.job(op=op, pattern=layout, block_size=bs, queue_depth=qd,
                     workers=table["workers"], submit_batch=min(table["submit_batch"], qd),
                     size=size, runtime=runtime, backend=table["backend"], seed=seed)
    target.prepare(job)
    before = target.device_stat()
    result = engine.run_job(job, progress=progress)
    after = target.device_stat()
    device = after.since(before) if before and after else None
    checked = honesty.check_io(result, device, target.identity)
    context = {"target": job.target, "backend": result.backend, "rw": job.rw, "bs": bs, "qd": qd,
               "workers": job.workers, "bytes": result.bytes, "ops": result.ops,
               "elapsed_s": result.elapsed, "cpu_s": result.cpu, "region_bytes": size,
               "latency_ns": result.latency.summary(), **checked}
    return result, context


def run_cell(target: Target, table: dict, cell: Cell, *, seed: int = 1,
             progress: Progress | None = None) -> list[Measurement]:
    """One matrix cell: bandwidth and IOPS, with the latency histogram as raw samples."""
    result, context = _run(target, table, op=cell.op, layout=cell.layout, bs=cell.bs,
                           qd=cell.qd, runtime=table["runtime"], seed=seed, progress=progress)
    params = {"bs": cell.bs, "qd": cell.qd}
    bins = result.latency.to_bins()
    return [
        measure(NAME, METRICS[f"{cell.pattern}_bw"], params, result.bandwidth, context=context,
                samples=bins),
        measure(NAME, METRICS[f"{cell.pattern}_iops"], params, result.iops, context=context),
    ]


def run_latency(target: Target, table: dict, *, seed: int = 1,
                progress: Progress | None = None) -> list[Measurement]:
    """Random-read latency QoS: nearest-rank percentiles of every completion; a percentile
    that the sample count cannot resolve is recorded as unresolved."""
    lat = table["latency"]
    result, context = _run(target, table, op="read", layout="random", bs=lat["block_size"],
                           qd=lat["depth"], runtime=lat["runtime"], seed=seed, progress=progress)
    bins = result.latency.to_bins()
    count = result.latency.count
    out = []
    for pct in LATENCY_PERCENTILES:
        needed = honesty.samples_needed(pct)
        params = {"bs": lat["block_size"], "qd": lat["depth"], "pct": pct}
        out.append(measure(NAME, METRICS["rand_read_lat"], params,
                           result.latency.percentile(pct) / 1e9,
                           context={**context, "samples_needed": needed},
                           samples=bins, resolved=count >= needed,
                           comparable=pct < 100 and count >= 10 * needed))
    return out

"""The gdsio-style bandwidth matrix (block size x queue depth x pattern) and 4K random-read
latency QoS: which cells a profile asks for, and how one cell becomes measurements."""

from __future__ import annotations

from dataclasses import dataclass

from qual import engine, honesty, steady, units
from qual.engine import IoResult
from qual.measurement import Measurement, Metric, Param, format_block, measure, measurement_id
from qual.targets import Target
from qual.workloads.base import backend_field
from qual.family import Family, Field, Outcome, Rates, SuiteTest, Work
from qual.workloads.bandwidth import charts

NAME = "bandwidth"
# pattern -> (op, offset pattern)
PATTERNS = {
    "seq_read": ("read", "sequential"),
    "rand_read": ("read", "random"),
    "seq_write": ("write", "sequential"),
    "rand_write": ("write", "random"),
}
# nearest-rank percentiles of the latency QoS test (OCP's QoS goes to six nines); 100 is the
# maximum
LATENCY_PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99, 99.9999, 100.0)

_BS, _QD, _PCT = Param("bs", "size"), Param("qd", "count"), Param("pct", "percentile")


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
    Field("workers", "count", default=1, maximum=engine.MAX_WORKERS,
          help="threads per cell, each with its own ring (gdsio -w)"),
    Field("block_sizes", "sizes", required=True, help="block sizes, e.g. [\"1M\", \"128K\"]"),
    Field("depths", "counts", required=True, maximum=engine.MAX_QUEUE_DEPTH,
          help="queue depths, e.g. [128, 32, 1]"),
    Field("patterns", "choices", default=list(PATTERNS), choices=tuple(PATTERNS),
          help="access patterns of the matrix (sequential and random reads and writes)"),
    backend_field(),
    Field("command_timeout", "duration", default="30 s",
          help="an I/O outstanding this long is a stall, an error naming it (NVMe's default)"),
    Field("submit_batch", "count", default=1, minimum=0, maximum=engine.MAX_QUEUE_DEPTH,
          help="I/Os per io_uring submission (0: all ready; 1: each at once, as fio does)"),
    Field("steady_state", "table", fields=(
        Field("max_rounds", "count", default=25, minimum=5, maximum=1000,
              help="rounds before steady state is reported as not achieved (SNIA PTS: 25)"),
        Field("precondition_passes", "count", default=2, minimum=0, maximum=16,
              help="sequential 128 KiB writes over the region before the first write cell "
                   "(SNIA PTS WIPC: 2x capacity)"),
    ), help="write cells run in rounds until the last five settle (SNIA PTS)"),
    Field("latency", "table", fields=(
        Field("block_size", "size", default="4K", help="bytes per read of the latency test"),
        Field("depth", "count", default=1, maximum=engine.MAX_QUEUE_DEPTH,
              help="reads in flight in the latency test (1: each read alone)"),
        Field("runtime", "duration", default="10 s",
              help="seconds, or with samples the most it may take"),
        Field("samples", "count", default=None, maximum=10 ** 12,
              help="completions to collect (p99.9999 needs 1,000,000): sizes the test by "
                   "samples rather than time"),
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


def _run(target: Target, table: dict, *, op: str, layout: str, bs: int, qd: int, runtime: float,
         seed: int, samples: int | None = None, say=None,
         label: str = "") -> tuple[IoResult, dict]:
    size = table["size"]
    job = target.job(op=op, pattern=layout, block_size=bs, queue_depth=qd,
                     workers=table["workers"], submit_batch=min(table["submit_batch"], qd),
                     size=size, runtime=runtime, bytes=samples * bs if samples else None,
                     backend=table["backend"], seed=seed,
                     command_timeout=table["command_timeout"])

    def running(done: int, _ops: int, seconds: float) -> None:  # said at most each 10 s
        say(f"{label}: {units.format_duration(seconds)} of {units.format_duration(runtime)}, "
            f"{units.format_size(done / seconds)}/s so far")

    result, checked = honesty.run_checked(target, job,
                                          running if say and runtime and label else None)
    context = {"target": job.target, "backend": result.backend, "rw": job.rw, "bs": bs, "qd": qd,
               "workers": job.workers, "bytes": result.bytes, "ops": result.ops,
               "elapsed_s": result.elapsed, "cpu_s": result.cpu, "region_bytes": size,
               "latency_ns": result.latency.summary(), **checked}
    return result, context


PRECONDITION_BS = 128 << 10  # SNIA PTS workload-independent preconditioning
_preconditioned: set[tuple[str, int]] = set()  # (target, region) done in this process


def precondition(target: Target, table: dict, passes: int, progress=None) -> None:
    """SNIA PTS WIPC: `passes` x the region in 128 KiB sequential writes, once per process."""
    key = (target.spec, table["size"])
    if passes == 0 or key in _preconditioned:
        return
    size = table["size"] // PRECONDITION_BS * PRECONDITION_BS
    job = target.job(op="write", pattern="sequential", block_size=PRECONDITION_BS,
                     queue_depth=32, size=size, bytes=passes * size, backend=table["backend"],
                     command_timeout=table["command_timeout"])
    job = target.prepare(job)
    if progress:
        progress(f"preconditioning {target.spec}: {passes} x {size >> 20} MiB sequential writes")
    engine.run_job(job)
    target.written = max(target.written, size)  # its reads need no fill of their own
    _preconditioned.add(key)


def run_cell(target: Target, table: dict, cell: Cell, *, seed: int = 1,
             say=None) -> list[Measurement]:
    """One matrix cell: bandwidth and IOPS, with the latency histogram as raw samples. With a
    steady_state table, a write cell runs in rounds until steady (SNIA PTS) and reports the
    mean of the measurement window."""
    def one_round():
        result, context = _run(target, table, op=cell.op, layout=cell.layout, bs=cell.bs,
                               qd=cell.qd, runtime=table["runtime"], seed=seed, say=say,
                               label=cell.label)
        return result.bandwidth, (result, context)

    ss = table.get("steady_state")
    params = {"bs": cell.bs, "qd": cell.qd}
    caveats = []
    if cell.op != "write" or not ss:
        _, (result, context) = one_round()
        bw, iops = result.bandwidth, result.iops
    else:
        precondition(target, table, ss["precondition_passes"], say)
        state, rounds = steady.rounds_until_steady(one_round, ss["max_rounds"])
        window = rounds[-len(state.window):]
        result, context = merge_rounds(window)
        bw = state.mean
        iops = sum(r.iops for r, _ in window) / len(window)
        context = {**context, "steady_state": {
            "reached": state.reached, "rounds": state.rounds, "window_bw": list(state.window),
            "range_share": state.range_share, "slope_share": state.slope_share,
            "round_bw": [r.bandwidth for r, _ in rounds]}}
        if not state.reached:
            caveats.append(f"{cell.label}: {state.describe()}")
        if say:
            say(f"{cell.label}: {state.describe()}")
    bins = result.latency.to_bins()
    return [
        measure(NAME, METRICS[f"{cell.pattern}_bw"], params, bw, context=context, samples=bins,
                caveats=caveats),
        measure(NAME, METRICS[f"{cell.pattern}_iops"], params, iops, context=context,
                caveats=caveats),
    ]


def merge_rounds(rounds: list[tuple[IoResult, dict]]) -> tuple[IoResult, dict]:
    """The steady-state window as one result: its rounds' bytes, operations, time, CPU and
    latencies together, and the device's counts summed over them (every round was checked
    against its own counters as it ran; the window is proven only if each round was)."""
    context = rounds[0][1]
    result = engine.combined([r for r, _ in rounds])
    context = {**context, "bytes": result.bytes, "ops": result.ops, "elapsed_s": result.elapsed,
               "cpu_s": result.cpu, "latency_ns": result.latency.summary(),
               "rounds_in_window": len(rounds)}
    truths = {c.get("device_truth") for _, c in rounds}
    if truths == {honesty.COUNTED}:
        context["device_bytes"] = sum(c["device_bytes"] for _, c in rounds)
        context["device_utilisation"] = sum(c["device_utilisation"] or 0 for _, c in rounds) / len(rounds)
    else:
        context["device_truth"] = next(t for t in truths if t != honesty.COUNTED)
        context.pop("device_bytes", None)
        context.pop("device_utilisation", None)
    return result, context


def run_latency(target: Target, table: dict, *, seed: int = 1) -> list[Measurement]:
    """Random-read latency QoS: nearest-rank percentiles of every completion; a percentile
    that the sample count cannot resolve is recorded as unresolved."""
    lat = table["latency"]
    result, context = _run(target, table, op="read", layout="random", bs=lat["block_size"],
                           qd=lat["depth"], runtime=lat["runtime"], seed=seed,
                           samples=lat.get("samples"))
    bins = result.latency.to_bins()
    count = result.latency.count
    out = []
    for pct in LATENCY_PERCENTILES:
        needed = honesty.samples_needed(pct)
        params = {"bs": lat["block_size"], "qd": lat["depth"], "pct": pct}
        out.append(measure(NAME, METRICS["rand_read_lat"], params,
                           result.latency.percentile(pct) / 1e9,
                           context={**context, "samples_needed": needed},
                           samples=bins, unresolved=None if count >= needed else
                           f"needs at least {needed:,} samples but the run completed {count:,}",
                           comparable=pct < 100 and count >= 10 * needed))
    return out


@dataclass
class MatrixOutcome(Outcome):
    """The cells and the latency test that ran, as measurements."""

    found: list[Measurement]

    def measurements(self) -> list[Measurement]:
        return self.found

    def document(self) -> dict:
        cells: dict[str, dict] = {}
        latency: dict = {}
        for m in self.found:
            c = m.context
            if m.metric == "rand_read_lat":
                latency.setdefault("percentiles_s", {})[f"{m.params['pct']:g}"] = m.value
                latency.update(bs=c["bs"], qd=c["qd"], backend=c["backend"], ops=c["ops"])
                if not m.resolved:
                    latency.setdefault("unresolved", []).append(m.params["pct"])
                continue
            pattern, kind = m.metric.rsplit("_", 1)
            cell = cells.setdefault(Cell(pattern, c["bs"], c["qd"]).label, {
                "pattern": pattern, "bs": c["bs"], "qd": c["qd"], "workers": c["workers"],
                "backend": c["backend"], "elapsed_s": c["elapsed_s"], "cpu_s": c["cpu_s"],
                "device": c.get("device")})
            cell["bw_bytes" if kind == "bw" else "iops"] = m.value
            if "steady_state" in c:
                cell["steady_state"] = c["steady_state"]
        return {"cells": list(cells.values()), **({"latency": latency} if latency else {})}

    def charts(self) -> dict[str, bytes]:
        out = {}
        cells = [m.as_dict() for m in self.found if m.metric.endswith("_bw")]
        if cells:
            out["bandwidth heatmap"] = charts.heatmaps(cells, "bandwidth matrix (GiB/s)")
        lat = next((m for m in self.found if m.metric == "rand_read_lat"), None)
        if lat is not None:
            out["latency percentiles"] = charts.latency_percentile_curve(
                lat.samples, f"{format_block(lat.context['bs'])} random read, depth "
                f"{lat.context['qd']}: completion latency")
        return out


def run(target: Target, table: dict, *, seed: int = 1, progress=None,
        cells: list[Cell] | None = None, latency: bool = True) -> MatrixOutcome:
    """The profile's matrix (or the given cells) and, where the table has one, the latency
    QoS test."""
    cells = matrix(table) if cells is None else cells
    latency = latency and bool(table.get("latency"))
    steps = len(cells) + latency
    found = []
    say = (lambda message: progress(message)) if progress else None
    for i, cell in enumerate(cells):
        if progress:
            progress(f"bandwidth {cell.label}", i / steps)
        found += run_cell(target, table, cell, seed=seed, say=say)
    if latency:
        if progress:
            progress("latency QoS", len(cells) / steps)
        found += run_latency(target, table, seed=seed)
    return MatrixOutcome(found)


CHART_CPU_S = 0.5  # matplotlib imported and the heatmaps drawn, on qual's reference host


def _heatmaps(found: list[dict]) -> dict[str, bytes] | str:
    """The matrix as heatmaps, from every cell this process measured (or why none)."""
    if not any(m["metric"].endswith("_bw") for m in found):
        return "no bandwidth cell ran in this process"
    return {"bandwidth heatmap": charts.heatmaps(found, "bandwidth matrix (GiB/s)")}


CELL = SuiteTest(
    "cell", "bandwidth matrix", "One cell of the matrix: bandwidth and IOPS for a pattern, block "
    "size and depth (a write cell in rounds until steady state where the profile asks for it); "
    "the last repetition judges the median of every repetition.",
    run=lambda target, table, cell, *, seed, progress: run(
        target, table, seed=seed, progress=progress, cells=[cell], latency=False),
    each=matrix, label=lambda cell: cell.label, repeated=True,
    destructive=lambda cell: cell.op == "write")
LATENCY = SuiteTest(
    "latency", "latency QoS", "Random-read completion latency percentiles at the profile's block "
    "size and depth.",
    run=lambda target, table, _value, *, seed, progress: run(target, table, seed=seed,
                                                              cells=[]),
    repeated=True, charts=None,
    skip=lambda table: None if "latency" in table else
    "profile has no [bandwidth.latency] table")
CHARTS = SuiteTest("charts", "charts", "The matrix as heatmaps (block size x depth -> GiB/s), "
                   "one per pattern.", summary=_heatmaps)
TESTS = (CELL, LATENCY, CHARTS)


def _plan(table: dict, test: str, cell, rates: Rates) -> list[Work]:
    """What a test of the suite does: a cell runs for the runtime (a steady-state write cell
    at least its five-round window, after the region's preconditioning, once); the latency
    test for its runtime or its samples."""
    size = table["size"]
    region = Work(f"region {size}", 0.0, space=size, what=f"the bandwidth region ({NAME}.size)")
    if test == CELL.id:
        ss = table.get("steady_state")
        rounds = steady.WINDOW if cell.op == "write" and ss else 1
        seconds = rounds * table["runtime"]
        moved = rates.moved(cell.op, cell.bs, cell.qd * table["workers"], seconds)
        longest = ss["max_rounds"] * table["runtime"] if rounds > 1 else None
        out = [region, Work(f"cell {cell.label}", seconds, longest=longest, repeated=True, **(
            {"bytes_written": moved} if cell.op == "write" else {"bytes_read": moved}))]
        if cell.op == "write" and ss and ss["precondition_passes"]:
            wipc = ss["precondition_passes"] * size
            out.append(Work(f"precondition {size}", wipc / rates.write_bw, bytes_written=wipc))
        return out
    if test == LATENCY.id and table.get("latency"):
        lat = table["latency"]
        seconds = lat["runtime"] if not lat.get("samples") else \
            min(lat["runtime"], lat["samples"] / (rates.iops_4k / 8))
        return [region, Work("latency", seconds, repeated=True, bytes_read=rates.moved(
            "read", lat["block_size"], lat["depth"], seconds))]
    if test == CHARTS.id:
        return [Work("charts", CHART_CPU_S * rates.cpu)]
    return []


def _fit(table: dict, room: int, need: int) -> dict:
    """A region that fits (--qual-fit): the room, in whole MiB."""
    return {"size": room >> 20 << 20} if room >= 1 << 20 else {}


READ_BW = ("seq_read_bw", "rand_read_bw")


def _feasible(profile, criterion, link) -> list[str]:
    """A read-bandwidth floor stays within the class's published peak at its block size
    (`[profile] peak_read_bw`); at a block size with no published figure, strictly below the
    peak published for a larger one (smaller blocks cannot be assumed to reach it)."""
    if criterion.metric not in READ_BW or not profile.peak_read_bw:
        return []
    floor = criterion.min
    bs = units.parse_size(criterion.param_dict["bs"], name="bs")
    peaks = profile.peak_read_bw
    fmt = lambda v: units.format_quantity(v, "GiB/s")  # noqa: E731
    if bs in peaks:
        if floor > peaks[bs]:
            return [f"at least {fmt(floor)}, above the class's published {fmt(peaks[bs])} at "
                    f"{units.format_size(bs)}"]
        return []
    larger = [v for b, v in peaks.items() if b > bs]
    if larger and floor >= max(larger):
        return [f"at least {fmt(floor)} at {units.format_size(bs)}, where nothing is "
                f"published; the class peaks at {fmt(max(larger))} with larger blocks"]
    return []


FAMILY = Family(name=NAME, description="gdsio-style bandwidth matrix and random-read latency QoS",
                fields=FIELDS, metrics=METRICS, check=_check, cells=_cells, run=run, plan=_plan,
                fit=_fit, feasible=_feasible, tests=TESTS)

"""SNIA's Solid State Storage Performance Test Specification (PTS-E 2.0.x) as a family. Every
test starts from a purged device (nvme format --ses=1 on an NVMe namespace; on anything else
no purge, and a caveat) and workload-independent preconditioning (twice the region in 128 KiB
sequential writes), then runs its points in rounds until the tracking variable is steady (the
5-round window of qual.steady, 25 rounds at most) and reports the window's means:

- IOPS: read/write mixes x block sizes, random, at the profile's threads x depth; tracking
  variable the smallest block's lowest-read-share IOPS (PTS: 4 KiB 100 % writes);
- throughput: sequential reads and writes of large blocks; tracking the largest block's write
  bandwidth (or its read bandwidth without writes);
- latency: small blocks at depth 1, one thread: mean, p99.99, p99.9999 and maximum of every
  completion in the window; tracking the smallest block's lowest-read-share mean;
- write saturation (WSAT): 4 KiB random writes in rounds until WSAT_MULTIPLE x the region is
  written: IOPS against bytes written.
"""

from __future__ import annotations

from dataclasses import dataclass

from qual import engine, honesty, steady
from qual.engine import IoResult
from qual.family import Family, Field, Outcome, Rates, SuiteTest, Work, declares
from qual.measurement import Measurement, Metric, Param, format_block, measure
from qual.targets import Target, guard, nvme
from qual.workloads.base import backend_field
from qual.workloads.bandwidth import merge_rounds

NAME = "pts"
WIPC_BS = 128 << 10  # workload-independent preconditioning: 128 KiB sequential writes
LATENCY_STATS = ("mean", "p99.99", "p99.9999", "max")

_RWMIX, _BS, _OP, _STAT = (Param("rwmix", "number"), Param("bs", "size"), Param("op", "name"),
                           Param("stat", "name"))
METRICS = {
    "pts_iops": Metric("pts_iops", "rate", "higher", (_RWMIX, _BS),
                       "PTS IOPS test: random I/O per second at a read share and block size "
                       "(steady-state window mean)"),
    "pts_tp": Metric("pts_tp", "bandwidth", "higher", (_OP, _BS),
                     "PTS throughput test: sequential bandwidth (steady-state window mean)"),
    "pts_lat": Metric("pts_lat", "time", "lower", (_RWMIX, _BS, _STAT),
                      "PTS latency test: completion latency at depth 1 (mean, p99.99, "
                      "p99.9999, max over the steady-state window)"),
    "pts_wsat_iops": Metric("pts_wsat_iops", "rate", "higher", (),
                            "PTS write saturation: 4 KiB random-write IOPS over the last five "
                            "rounds, once 4x the region is written"),
}

FIELDS = (
    Field("size", "size", default="1 GiB", minimum=1 << 20,
          help="the test region (PTS: the whole user capacity)"),
    Field("runtime", "duration", default="0.1 s",
          help="seconds per point per round (PTS: one minute, as the nvme-rig profile sets; "
               "the default gives a quick look)"),
    Field("workers", "count", default=4, maximum=engine.MAX_WORKERS,
          help="threads of the IOPS and throughput tests (PTS: T4Q32 is usual)"),
    Field("depth", "count", default=32, maximum=engine.MAX_QUEUE_DEPTH,
          help="I/Os in flight per thread of the IOPS and throughput tests"),
    Field("max_rounds", "count", default=steady.MAX_ROUNDS, minimum=steady.WINDOW, maximum=1000,
          help="rounds before a test reports steady state as not achieved (PTS: 25)"),
    Field("precondition_passes", "count", default=2, minimum=0, maximum=16,
          help="sequential 128 KiB writes over the region before each test (PTS WIPC: 2x)"),
    Field("purge", "bool", default=True,
          help="purge an NVMe namespace before each test (nvme format --ses=1)"),
    Field("mixes", "counts", default=[100, 95, 65, 50, 35, 5, 0], minimum=0, maximum=100,
          help="read shares (per cent) of the IOPS test"),
    Field("block_sizes", "sizes", default=["1M", "128K", "64K", "32K", "16K", "8K", "4K"],
          help="block sizes of the IOPS test"),
    Field("throughput_block_sizes", "sizes", default=["1M", "128K"],
          help="block sizes of the throughput test (PTS: 1024 KiB and 128 KiB)"),
    Field("latency_block_sizes", "sizes", default=["8K", "4K"],
          help="block sizes of the latency test (PTS: 8 KiB, 4 KiB; 512 B where supported)"),
    Field("latency_mixes", "counts", default=[100, 65, 0], minimum=0, maximum=100,
          help="read percentages of the latency test's mixes (PTS: 100, 65, 0)"),
    Field("wsat_multiple", "count", default=4, maximum=64,
          help="write saturation writes this many times the region"),
    Field("tests", "choices", default=["iops", "throughput", "latency", "wsat"],
          choices=("iops", "throughput", "latency", "wsat"),
          help="which PTS tests run, in this order"),
    backend_field(),
    Field("command_timeout", "duration", default="30 s",
          help="an I/O outstanding this long is a stall, an error naming it (NVMe's default)"),
)


@dataclass(frozen=True)
class Point:
    """One workload of a test: read share (%), sequential or random, block size, threads and
    depth."""

    rwmix: int
    layout: str
    bs: int
    workers: int
    depth: int

    @property
    def label(self) -> str:
        return f"{self.rwmix}/{100 - self.rwmix} {format_block(self.bs)}"


def _points(table: dict, test: str) -> list[Point]:
    w, d = table["workers"], table["depth"]
    if test == "iops":
        return [Point(m, "random", bs, w, d) for bs in table["block_sizes"]
                for m in table["mixes"]]
    if test == "throughput":
        return [Point(m, "sequential", bs, w, d) for bs in table["throughput_block_sizes"]
                for m in (100, 0)]
    if test == "latency":
        return [Point(m, "random", bs, 1, 1) for bs in table["latency_block_sizes"]
                for m in table["latency_mixes"]]
    return [Point(0, "random", 4096, w, d)]  # wsat


def _tracking(table: dict, test: str) -> Point:
    """The point whose value decides steady state (PTS: the hardest to settle)."""
    points = _points(table, test)
    if test == "throughput":
        big = max(p.bs for p in points)
        return min((p for p in points if p.bs == big), key=lambda p: p.rwmix)
    small = min(p.bs for p in points)
    return min((p for p in points if p.bs == small), key=lambda p: p.rwmix)


def _run_point(target: Target, table: dict, point: Point, *, seed: int,
               runtime: float | None = None, nbytes: int | None = None) -> tuple[IoResult, dict]:
    op = {100: "read", 0: "write"}.get(point.rwmix, "mixed")
    job = target.job(op=op, rwmixread=point.rwmix if op == "mixed" else 50, pattern=point.layout,
                     block_size=point.bs, queue_depth=point.depth, workers=point.workers,
                     submit_batch=1, size=table["size"], runtime=runtime, bytes=nbytes,
                     backend=table["backend"], seed=seed, command_timeout=table["command_timeout"])
    result, checked = honesty.run_checked(target, job)
    context = {"target": job.target, "backend": result.backend, "rw": job.rw,
               "rwmixread": point.rwmix, "bs": point.bs, "workers": point.workers,
               "qd": point.depth, "bytes": result.bytes, "ops": result.ops,
               "elapsed_s": result.elapsed, "region_bytes": table["size"], **checked}
    return result, context


# ------------------------------------------------------------------ purge and preconditioning


def purge(target: Target, table: dict) -> dict:
    """The PTS purge. The guard decides first: a purge is a write of the whole region, so a
    target qual may not write is refused before anything else. Then an NVMe namespace is
    formatted with a user-data erase (nvme format --ses=1), itself guarded: where the format
    reaches every namespace of the controller, each must pass the guard (qual/targets/guard.py).
    Any other target keeps what it holds, and the returned caveat says so."""
    target.prepare(target.job(op="write", pattern="sequential", block_size=WIPC_BS,
                              size=table["size"], bytes=WIPC_BS))  # UnsafeTarget if refused
    if not table["purge"]:
        return {"done": False, "caveat": "no purge: the profile turned it off"}
    if target.kind != "block" or not nvme.NAMESPACE.fullmatch(target.path.name):
        what = "a file" if target.kind != "block" else "not a whole NVMe namespace"
        return {"done": False, "caveat": f"no purge: {target.spec} is {what}; the tests start "
                                         "from what the drive holds (PTS asks for a purged "
                                         "device)"}
    target.written = 0  # the format deallocates every block: a read would read nothing
    return guard.format_namespace(target, ses=1, guard_other=lambda path: Target(
        path, allow_destructive=target.allow_destructive, confirm_serial=target.confirm_serial,
        consent_flags=target.consent_flags).check_guard())


def precondition(target: Target, table: dict) -> dict:
    """Workload-independent preconditioning: precondition_passes x the region in 128 KiB
    sequential writes."""
    region = table["size"] // WIPC_BS * WIPC_BS
    passes = table["precondition_passes"]
    if passes:
        engine.run_job(target.prepare(target.job(
            op="write", pattern="sequential", block_size=WIPC_BS, queue_depth=32,
            size=region, bytes=passes * region, backend=table["backend"],
            command_timeout=table["command_timeout"])))
        target.written = max(target.written, region)  # its reads need no fill of their own
    return {"passes": passes, "bytes": passes * region, "block_size": WIPC_BS}


# ------------------------------------------------------------------ the tests


def _value(test: str, result: IoResult) -> float:
    """A round's tracking value: IOPS, bandwidth, or mean latency (s)."""
    if test == "throughput":
        return result.bandwidth
    if test == "latency":
        return result.latency.mean_ns / 1e9
    return result.iops


def steady_summary(state: steady.SteadyState, tracking: str, values: list[float]) -> dict:
    """A steady-state window as the report shows it."""
    n = len(state.window)
    return {"reached": state.reached, "rounds": state.rounds, "range": state.range_share,
            "slope": state.slope_share, "window_rounds": [state.rounds - n + 1, state.rounds],
            "tracking": tracking, "values": values}


def run_steady_test(target: Target, table: dict, test: str, *, seed: int,
                    say=None) -> tuple[dict, dict[Point, tuple[IoResult, dict]]]:
    """Rounds of every point of `test` until its tracking point is steady: the steady-state
    summary and each point's window as one result."""
    points, track = _points(table, test), _tracking(table, test)
    rounds: list[dict[Point, tuple[IoResult, dict]]] = []

    def one_round():
        got = {p: _run_point(target, table, p, seed=seed + len(rounds), runtime=table["runtime"])
               for p in points}
        rounds.append(got)
        value = _value(test, got[track][0])
        if test == "latency":  # lower is better; steady state looks at its spread alike
            value = value or 1e-12
        return value, got

    state, _ = steady.rounds_until_steady(one_round, table["max_rounds"])
    values = [_value(test, r[track][0]) for r in rounds]
    if say:
        say(f"{test}: {state.describe()}")
    window = rounds[-len(state.window):]
    merged = {p: merge_rounds([r[p] for r in window]) for p in points}
    return steady_summary(state, f"{track.label} {test}", values), merged


def run_wsat(target: Target, table: dict, *, seed: int, say=None) -> dict:
    """4 KiB random writes, a round at a time, until wsat_multiple x the region is written:
    IOPS against the bytes written so far."""
    point = _points(table, "wsat")[0]
    goal = table["wsat_multiple"] * table["size"]
    written, curve, results = 0, [], []
    while written < goal:
        left = (goal - written) // point.bs * point.bs or point.bs
        result, context = _run_point(target, table, point, seed=seed + len(curve),
                                     runtime=table["runtime"], nbytes=left)
        written += result.bytes
        curve.append({"round": len(curve) + 1, "iops": result.iops, "bytes_written": written})
        results.append((result, context))
        if say:
            say(f"wsat: {written / goal:.0%} of {goal >> 20} MiB written")
    state = steady.assess([c["iops"] for c in curve])
    last = merge_rounds(results[-steady.WINDOW:])
    return {"steady_state": steady_summary(state, "4K 0/100 wsat", [c["iops"] for c in curve]),
            "rounds": curve, "bytes_written": written, "region_bytes": table["size"],
            "multiple": written / table["size"], "iops": last[0].iops, "context": last[1]}


def _measure_test(test: str, merged: dict, ss: dict, caveats: list[str]) -> list[Measurement]:
    out = []
    for p, (result, context) in merged.items():
        context = {**context, "steady_state": ss}
        if test == "iops":
            out.append(measure(NAME, METRICS["pts_iops"], {"rwmix": p.rwmix, "bs": p.bs},
                               result.iops, context=context, caveats=caveats))
        elif test == "throughput":
            op = "read" if p.rwmix == 100 else "write"
            out.append(measure(NAME, METRICS["pts_tp"], {"op": op, "bs": p.bs},
                               result.bandwidth, context=context, caveats=caveats))
        else:
            lat = result.latency
            for stat in LATENCY_STATS:
                pct = {"p99.99": 99.99, "p99.9999": 99.9999}.get(stat)
                value = lat.mean_ns if stat == "mean" else lat.max_ns if stat == "max" \
                    else lat.percentile(pct)
                needed = honesty.samples_needed(pct) if pct else 1
                out.append(measure(NAME, METRICS["pts_lat"],
                                   {"rwmix": p.rwmix, "bs": p.bs, "stat": stat}, value / 1e9,
                                   context={**context, "samples_needed": needed},
                                   caveats=caveats, unresolved=None if lat.count >= needed
                                   else f"needs at least {needed:,} samples but the run "
                                   f"completed {lat.count:,}",
                                   comparable=stat != "max" and lat.count >= 10 * needed))
    return out


@dataclass
class PtsOutcome(Outcome):
    """What the tests found: measurements, and each test's section of the PTS report."""

    found: list[Measurement]
    sections: dict

    def measurements(self) -> list[Measurement]:
        return self.found

    def document(self) -> dict:
        return self.sections

    def charts(self) -> dict[str, bytes]:
        from qual.workloads.pts import charts
        return charts.all_charts(self.sections)

    def texts(self) -> dict[str, str]:
        return {f"PTS {', '.join(self.sections)} report": self.report_text()}

    def report_text(self) -> str:
        """The PTS report's summary tables, as text."""
        out = []
        for test, s in self.sections.items():
            out.append(f"== PTS {test} test ==")
            out.append(f"purge: {s['purge'].get('method') or s['purge'].get('caveat')}")
            pre = s["precondition"]
            out.append(f"preconditioning: {pre['passes']} x the region in "
                       f"{format_block(pre['block_size'])} sequential writes")
            ss = s.get("steady_state")
            if ss:
                out.append(f"steady state ({ss['tracking']}): "
                           f"{'reached' if ss['reached'] else 'NOT reached'}, rounds "
                           f"{ss['window_rounds'][0]}-{ss['window_rounds'][1]} of {ss['rounds']}"
                           f", range {ss['range'] * 100:.1f} %, slope {ss['slope'] * 100:.1f} %")
            out += _text_table(test, s)
            out += [f"CAVEAT: {c}" for c in s.get("caveats", [])]
            out.append("")
        return "\n".join(out)

    def lines(self) -> list[str]:
        out = []
        for test, section in self.sections.items():
            ss = section.get("steady_state")
            if ss:
                out.append(f"{test}: steady state {'reached' if ss['reached'] else 'NOT reached'}"
                           f" after {ss['rounds']} rounds (range {ss['range'] * 100:.1f} %, "
                           f"slope {ss['slope'] * 100:.1f} %)")
            for caveat in section.get("caveats", []):
                out.append(f"{test}: CAVEAT {caveat}")
        return out + super().lines()


def _text_table(test: str, section: dict) -> list[str]:
    if test == "wsat":
        return [f"round {r['round']:3d}: {r['bytes_written'] / (1 << 30):8.2f} GiB written, "
                f"{r['iops']:12,.0f} IOPS" for r in section["rounds"]]
    rows = section["table"]
    if test == "iops":  # PTS: block sizes down, read/write mixes across
        mixes = sorted({r["rwmixread"] for r in rows}, reverse=True)
        sizes = sorted({r["bs"] for r in rows}, reverse=True)
        iops = {(r["bs"], r["rwmixread"]): r["iops"] for r in rows}
        head = "block size " + "".join(f"{f'{m}/{100 - m}':>12}" for m in mixes)
        return [head] + [f"{format_block(bs):>10} " + "".join(
            f"{iops.get((bs, m), float('nan')):12,.0f}" for m in mixes) for bs in sizes]
    if test == "throughput":
        return [f"{format_block(r['bs']):>6} sequential {r['op']:5}: "
                f"{r['bw_bytes'] / (1 << 20):10,.1f} MiB/s" for r in rows]
    return [f"{format_block(r['bs']):>6} {r['rwmixread']}/{100 - r['rwmixread']}: " + ", ".join(
        f"{k} {v / 1e3:,.1f} us" for k, v in r["lat_ns"].items()) + f" ({r['samples']} samples)"
        for r in rows]


def _table_rows(test: str, merged: dict) -> list[dict]:
    rows = []
    for p, (result, _) in merged.items():
        row = {"rwmixread": p.rwmix, "bs": p.bs, "workers": p.workers, "qd": p.depth}
        if test == "iops":
            row["iops"] = result.iops
        elif test == "throughput":
            row.update(op="read" if p.rwmix == 100 else "write", bw_bytes=result.bandwidth)
        else:
            row["lat_ns"] = {k: v for k, v in result.latency.summary().items()
                             if k in LATENCY_STATS}
            row["samples"] = result.latency.count
        rows.append(row)
    return rows


def run_test(target: Target, table: dict, test: str, *, seed: int = 1,
             progress=None) -> PtsOutcome:
    """One PTS test from a purged, preconditioned region."""
    say = (lambda message: progress(message)) if progress else None
    caveats = []
    purged = purge(target, table)
    if not purged["done"]:
        caveats.append(purged["caveat"])
    if say:
        say(f"{test}: preconditioning {table['precondition_passes']} x "
            f"{table['size'] >> 20} MiB")
    pre = precondition(target, table)
    section = {"purge": purged, "precondition": pre}
    if test == "wsat":
        wsat = run_wsat(target, table, seed=seed, say=say)
        context = {**wsat.pop("context"), "steady_state": wsat["steady_state"],
                   "curve": wsat["rounds"]}
        section.update(wsat)
        found = [measure(NAME, METRICS["pts_wsat_iops"], {}, wsat["iops"], context=context,
                         caveats=caveats)]
    else:
        ss, merged = run_steady_test(target, table, test, seed=seed, say=say)
        if not ss["reached"]:
            caveats.append(f"{test}: steady state not achieved in {ss['rounds']} rounds")
        section.update(steady_state=ss, table=_table_rows(test, merged))
        found = _measure_test(test, merged, ss, caveats)
    if caveats:
        section["caveats"] = caveats
    return PtsOutcome(found, {test: section})


def run(target: Target, table: dict, *, seed: int = 1, progress=None) -> PtsOutcome:
    """Every test the profile asks for, in the specification's order."""
    found, sections = [], {}
    for i, test in enumerate(table["tests"]):
        if progress:
            progress(f"PTS {test} test", i / len(table["tests"]))
        one = run_test(target, table, test, seed=seed, progress=progress)
        found += one.found
        sections.update(one.sections)
    return PtsOutcome(found, sections)


def _cells(table: dict) -> list[str]:
    from qual.measurement import measurement_id
    ids = []
    for test in table["tests"]:
        for p in _points(table, test):
            if test == "iops":
                ids.append(measurement_id(METRICS["pts_iops"], {"rwmix": p.rwmix, "bs": p.bs}))
            elif test == "throughput":
                ids.append(measurement_id(METRICS["pts_tp"], {
                    "op": "read" if p.rwmix == 100 else "write", "bs": p.bs}))
            elif test == "latency":
                ids += [measurement_id(METRICS["pts_lat"], {"rwmix": p.rwmix, "bs": p.bs,
                                                            "stat": s}) for s in LATENCY_STATS]
            else:
                ids.append(METRICS["pts_wsat_iops"].name)
    return ids


def _check(table: dict) -> list[tuple[str, str]]:
    problems = []
    for key in ("block_sizes", "throughput_block_sizes", "latency_block_sizes"):
        for bs in table[key]:
            if bs * max(table["workers"], 1) > table["size"]:
                problems.append((key, f"{format_block(bs)} x {table['workers']} workers is "
                                      "larger than size"))
    if WIPC_BS > table["size"]:
        problems.append(("size", "is smaller than one 128 KiB preconditioning write"))
    return problems


def _plan(table: dict, test: str, pts_test, rates: Rates) -> list[Work]:
    """A PTS test: its preconditioning, then its points in rounds, at least the five of the
    steady-state window (write saturation: until wsat_multiple x the region is written in
    4 KiB random writes)."""
    if not declares(TESTS, test):
        return []
    size = table["size"]
    wipc = table["precondition_passes"] * (size // WIPC_BS * WIPC_BS)
    out = [Work(f"pts {pts_test} precondition", wipc / rates.write_bw, bytes_written=wipc,
                space=size, what=f"the PTS region ({NAME}.size)")]
    if pts_test == "wsat":
        goal = table["wsat_multiple"] * size
        return out + [Work("pts wsat", goal / (rates.iops_4k * 4096), bytes_written=goal)]
    points = _points(table, pts_test)
    seconds = steady.WINDOW * table["runtime"]
    written = sum(rates.moved("write", p.bs, p.depth * p.workers, seconds) *
                  (100 - p.rwmix) // 100 for p in points)
    read = sum(rates.moved("read", p.bs, p.depth * p.workers, seconds) * p.rwmix // 100
               for p in points)
    return out + [Work(f"pts {pts_test}", seconds * len(points), bytes_written=written,
                       bytes_read=read,
                       longest=table["max_rounds"] * table["runtime"] * len(points))]


TESTS = (SuiteTest("pts", "SNIA PTS", "One PTS test: purge, precondition, rounds to steady "
                   "state, the window's means (write saturation: until 4x the region is "
                   "written).", each=lambda table: list(table["tests"]), charts=None,
                   run=lambda target, table, test, *, seed, progress: run_test(
                       target, table, test, seed=seed, progress=progress)),)


FAMILY = Family(name=NAME, description="SNIA PTS: purge, precondition, IOPS, throughput, "
                                       "latency and write saturation to steady state",
                fields=FIELDS, metrics=METRICS, check=_check, cells=_cells, run=run, plan=_plan,
                tests=TESTS,
                fit=lambda table, room, need: {"size": room >> 20 << 20})

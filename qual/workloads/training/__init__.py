"""DLIO-style training-data ingestion (seed 001): simulated accelerators read sample files from
the target through the native engine and compute for a fixed time per step; accelerator
utilisation (AU), samples/s and bandwidth per accelerator count, the largest count that holds
the AU floor (MLPerf Storage's accelerators per drive), and the simulator's own AU ceiling."""

from __future__ import annotations

import math
import os
import secrets
import time

import numpy as np

from qual import engine, honesty
from qual.workloads.base import FIT_MARGIN, Family, Flags, ResultOutcome, backend_field
from qual.family import Field, Metric, Param, Rates, Work, measurement_id
from qual.record import Measurement, measure
from qual.target import Target
from qual.units import format_size
from qual.workloads.training import accelerators, charts, configs, dataset
from qual.workloads.training.accelerators import Epoch, Plan
from qual.workloads.training.configs import WORKLOADS, Workload

NAME = "training"
MAX_READ_THREADS = 1024  # accelerators x read threads, all in this process
_ACC, _EP = Param("accelerators", "count"), Param("epochs", "count")

METRICS = {m.name: m for m in (
    Metric("train_au", "ratio", "higher", (_ACC, _EP),
           "accelerator utilisation, mean over accelerators and epochs (DLIO)"),
    Metric("train_au_min_epoch", "ratio", "higher", (_ACC, _EP),
           "the lowest epoch's AU (a mean over epochs can hide a dip)"),
    Metric("train_samples_per_s", "samples", "higher", (_ACC, _EP),
           "samples consumed per second, all accelerators, mean over epochs"),
    Metric("train_bw", "bandwidth", "higher", (_ACC, _EP),
           "sample bytes read per second, all accelerators, mean over epochs"),
    Metric("train_device_read_share", "ratio", "higher", (_ACC, _EP),
           "bytes the block device read over the sample bytes read"),
    Metric("train_au_ceiling", "ratio", "higher", (_ACC,),
           "AU of the same run with no storage: what the simulator itself can reach"),
    Metric("train_dataset_share", "ratio", "higher", (_ACC,),
           "files over MLPerf Storage's minimum (500 steps of every accelerator, 5x host RAM)"),
    Metric("train_max_accelerators", "count", "higher", (_EP,),
           "the most accelerators of the sweep that held the AU floor"),
)}

FIELDS = (
    Field("workload", "choice", default="unet3d-h100", choices=tuple(WORKLOADS)),
    Field("files", "count", help="sample files (default: the workload's)"),
    Field("record_scale", "number", default=1.0,
          help="scales the record length and its spread, for small targets"),
    Field("batch_size", "count", help="samples per step (default: the workload's)"),
    Field("computation_time", "duration", minimum=0,
          help="compute per step (default: the workload's; 0: read as fast as the drive can)"),
    Field("read_threads", "count", help="loader threads per accelerator (default: the workload's)"),
    Field("prefetch_size", "count", default=2, minimum=0,
          help="DLIO reader.prefetch_size: batches loaded ahead (0 means 2)"),
    Field("accelerators", "counts", default=[1, 2, 4, 6, 8, 16, 32]),
    Field("epochs", "counts", default=[5], help="a run per value (seed 001: 5 and 1)"),
    Field("au_floor", "ratio", help="AU that counts as keeping up (default: the workload's)"),
    Field("direct", "bool", default=True, negations=("--page-cache",),
          help="O_DIRECT; no (or --page-cache) reads through the page cache"),
    Field("block_size", "size", default="1 MiB", aliases=("--bs",), help="bytes per read"),
    Field("queue_depth", "count", default=8, maximum=4096, aliases=("--iodepth",),
          help="reads in flight per read thread"),
    Field("shuffle_seed", "count", minimum=0, aliases=("--seed",),
          help="file order seed (default: a new one every run, as MLPerf v2.0 asks)"),
    Field("data_seed", "count", default=0, minimum=0),
    Field("calibrate", "bool", default=True, help="measure the AU ceiling without storage"),
    backend_field(),
)


def workload_of(table: dict) -> Workload:
    w = WORKLOADS[table["workload"]]
    return w.scaled(files=table.get("files"), record_scale=table["record_scale"],
                    batch=table.get("batch_size"), read_threads=table.get("read_threads"),
                    computation_time=table.get("computation_time"))


def _check(table: dict) -> list[tuple[str, str]]:
    problems = []
    if table["record_scale"] > 1:
        problems.append(("record_scale", f"{table['record_scale']} is above 1"))
    w = workload_of(table)
    for n in table["accelerators"]:
        steps = configs.steps_per_epoch(w, n)
        if steps < 2:
            problems.append(("accelerators", f"{n} accelerators get {steps} step(s) per epoch "
                             f"from {w.files} files of {w.samples_per_file} sample(s) at batch "
                             f"{w.batch}; AU needs 2 or more: add files"))
        if n * w.read_threads > MAX_READ_THREADS:
            problems.append(("accelerators", f"{n} accelerators x {w.read_threads} read threads "
                             f"is more than {MAX_READ_THREADS} threads"))
    if table["block_size"] % 512:
        problems.append(("block_size", "is not a multiple of 512 bytes"))
    return problems


def _cells(table: dict) -> list[str]:
    ids = []
    for n in table["accelerators"]:
        for e in table["epochs"]:
            p = {"accelerators": n, "epochs": e}
            ids += [measurement_id(METRICS[m], p) for m in
                    ("train_au", "train_au_min_epoch", "train_samples_per_s", "train_bw",
                     "train_device_read_share")]
        ids.append(measurement_id(METRICS["train_dataset_share"], {"accelerators": n}))
        if table["calibrate"]:
            ids.append(measurement_id(METRICS["train_au_ceiling"], {"accelerators": n}))
    ids += [measurement_id(METRICS["train_max_accelerators"], {"epochs": e})
            for e in table["epochs"]]
    return ids


# ------------------------------------------------------------------ running it


def host_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_of(w: Workload, table: dict, n: int) -> Plan:
    prefetch = math.ceil((table["prefetch_size"] or 2) / w.read_threads)  # DLIO prefetch_factor
    return Plan(accelerators=n, batch=w.batch, samples_per_file=w.samples_per_file,
                read_threads=w.read_threads, prefetch=prefetch,
                computation_time=w.computation_time, steps=configs.steps_per_epoch(w, n))


class _NoStorage:
    """The calibration run's reader: every file arrives at once, nothing is read."""

    def __init__(self, sizes: dict[str, int]):
        self.sizes = sizes

    def read(self, path: str) -> int:
        return self.sizes[path]

    def close(self) -> None:
        pass


def _sweep_point(data: dataset.Dataset, table: dict, target: Target, n: int, epochs: int,
                 seed: int, *, faults=(), calibration: bool = False, progress=None) -> dict:
    """One run: `epochs` epochs with n accelerators (calibration: one epoch, no storage)."""
    w = data.workload
    plan = plan_of(w, table, n)
    paths = [data.path(i) for i in range(data.files)]
    ctl = engine.new_ctl()
    align = target.align
    if calibration:
        sizes = dict(zip(paths, data.sizes))

        def open_reader():
            return _NoStorage(sizes)
    else:
        def open_reader():
            return engine.SampleReader(block_size=table["block_size"],
                                       queue_depth=table["queue_depth"], align=align,
                                       direct=table["direct"], backend=table["backend"],
                                       faults=tuple(faults), ctl=ctl)

    probe = open_reader()
    backend = "none" if calibration else probe.backend
    probe.close()
    out = []
    for e in range(epochs):
        order = np.random.default_rng([seed, e]).permutation(data.files)
        if not table["direct"] and not calibration:
            data.drop_cache()  # every epoch starts from the device; what it caches is its own
        epoch = accelerators.run_epoch(
            plan, paths, order, index=e + 1, open_reader=open_reader,
            stop=lambda: setattr(ctl, "cancel", 1),
            sample_device=None if calibration else target.device_stat)
        out.append(epoch)
        if progress:
            progress(f"{w.name}: {n} accelerator(s), epoch {e + 1}/{epochs}"
                     f"{' (calibration)' if calibration else ''}: AU {epoch.au_mean * 100:.1f} %, "
                     f"{epoch.samples_per_s:.1f} samples/s, {epoch.bw / 2**20:.0f} MiB/s")
    return _summary(out, plan, backend, table, n, epochs)


def _summary(epochs: list[Epoch], plan: Plan, backend: str, table: dict, n: int,
             count: int) -> dict:
    devices = [e.device for e in epochs]
    device_bytes = None if any(d is None for d in devices) else sum(d["read_bytes"] for d in devices)
    return {
        "accelerators": n, "epochs": count, "steps_per_epoch": plan.steps,
        "backend": backend, "path": "O_DIRECT" if table["direct"] else "page cache",
        "au_mean": float(np.mean([e.au_mean for e in epochs])),
        "au_min_epoch": min(e.au_mean for e in epochs),
        "samples_per_s": float(np.mean([e.samples_per_s for e in epochs])),
        "bw_bytes": float(np.mean([e.bw for e in epochs])),
        "bytes": sum(e.bytes for e in epochs),
        "device_read_bytes": device_bytes,
        "per_epoch": [e.as_dict() for e in epochs],
    }


def run(target: Target, table: dict, *, seed: int | None = None, faults=(),
        progress=None) -> TrainingOutcome:
    """The sweep of the profile: the dataset (generated once), then for every accelerator count
    a calibration run without storage and a run per epochs value."""
    w = workload_of(table)
    if seed is None:
        seed = table.get("shuffle_seed")
    if seed is None:
        seed = secrets.randbits(32)  # MLPerf v2.0: the order changes from run to run
    t0 = time.perf_counter()
    data = dataset.prepare(target, w, seed=table["data_seed"], progress=progress)
    memory = host_memory()
    demand = w.demand() if w.computation_time else None  # no compute: no demand to meet
    out = {"workload": {**w.__dict__, "demand_bytes_per_s": demand},
           "dataset": data.as_dict(), "host_memory": memory, "shuffle_seed": seed,
           "au_floor": au_floor(table), "generate_s": time.perf_counter() - t0,
           "rule": {}, "calibration": {}, "runs": []}
    points = len(table["accelerators"]) * (len(table["epochs"]) + bool(table["calibrate"]))
    done = 0

    def say(message, _=None):
        if progress:
            progress(message, done / points)
    for n in table["accelerators"]:
        need = configs.minimum_files(w, n, memory)
        out["rule"][n] = {"files": data.files, "minimum_files": need,
                          "share": data.files / need}
        if table["calibrate"]:
            out["calibration"][n] = _sweep_point(data, table, target, n, 1, seed,
                                                 calibration=True, progress=say)
            done += 1
        for e in table["epochs"]:
            out["runs"].append(_sweep_point(data, table, target, n, e, seed, faults=faults,
                                            progress=say))
            done += 1
    out["max_accelerators"] = {e: max_accelerators(out["runs"], e, out["au_floor"])
                               for e in table["epochs"]}
    return TrainingOutcome(out, target=target)


def au_floor(table: dict) -> float:
    if table.get("au_floor") is not None:
        return table["au_floor"]
    floor = WORKLOADS[table["workload"]].au_floor
    return floor if floor is not None else 0.90  # DLIO's default metric.au


def max_accelerators(runs: list[dict], epochs: int, floor: float) -> int:
    """The largest accelerator count run with `epochs` epochs whose AU held the floor (0: none)."""
    held = [r["accelerators"] for r in runs if r["epochs"] == epochs and r["au_mean"] >= floor]
    return max(held, default=0)


def remove(target: Target) -> None:
    dataset.remove(target)


# ------------------------------------------------------------------ results into measurements


def caveats(result: dict, n: int) -> list[str]:
    rule = result["rule"][n]
    if rule["share"] >= 1:
        return []
    return [f"dataset below MLPerf Storage's size rule: {rule['files']} files < "
            f"{rule['minimum_files']} (500 steps x batch x {n} accelerator(s), 5x host RAM "
            f"{format_size(result['host_memory'])}); the page cache may have served reads"]


def _check_run(r: dict, target: Target) -> dict:
    """Honesty (docs/ARCHITECTURE.md §6): O_DIRECT bytes must reach the device; nothing beats the link."""
    checked = {"path": r["path"], "backend": r["backend"]}
    honesty.check_link(r["bw_bytes"], target.identity, target.spec, "training reads")
    seen = r["device_read_bytes"]
    device = None if seen is None else {"read_bytes": seen}
    return {**checked, **honesty.check_device(device, "read_bytes", r["bytes"] if r["path"] ==
                                              "O_DIRECT" else 0, "O_DIRECT sample reads",
                                              target.spec)}


def measurements(result: dict, target: Target) -> list[Measurement]:
    out = []
    name = str(target.path)
    for r in result["runs"]:
        n, e = r["accelerators"], r["epochs"]
        p = {"accelerators": n, "epochs": e}
        ctx = {"target": name, "workload": result["workload"]["name"],
               "steps_per_epoch": r["steps_per_epoch"], "shuffle_seed": result["shuffle_seed"],
               **_check_run(r, target)}
        said = caveats(result, n)
        calib = result["calibration"].get(n)
        au_ctx = {**ctx, "per_epoch": [x["au_mean"] for x in r["per_epoch"]]}
        # a criterion above what the simulator reaches without storage cannot be judged
        ceiling = calib["au_mean"] if calib else None
        out.append(measure(NAME, METRICS["train_au"], p, r["au_mean"], context=au_ctx,
                           samples=au_ctx["per_epoch"], caveats=said, ceiling=ceiling))
        out.append(measure(NAME, METRICS["train_au_min_epoch"], p, r["au_min_epoch"],
                           context=au_ctx, caveats=said, ceiling=ceiling))
        out.append(measure(NAME, METRICS["train_samples_per_s"], p, r["samples_per_s"],
                           context=ctx, caveats=said))
        out.append(measure(NAME, METRICS["train_bw"], p, r["bw_bytes"], context=ctx, caveats=said,
                           samples=[x["bw_bytes"] for x in r["per_epoch"]]))
        if r["device_read_bytes"] is not None and r["bytes"]:
            out.append(measure(NAME, METRICS["train_device_read_share"], p,
                               r["device_read_bytes"] / r["bytes"],
                               context={**ctx, "device": [x["device"] for x in r["per_epoch"]]}))
    for n, rule in result["rule"].items():
        out.append(measure(NAME, METRICS["train_dataset_share"], {"accelerators": n},
                           rule["share"], context={"target": name, **rule,
                                                   "host_memory": result["host_memory"]}))
    for n, c in result["calibration"].items():
        out.append(measure(NAME, METRICS["train_au_ceiling"], {"accelerators": n}, c["au_mean"],
                           context={"target": name, "steps_per_epoch": c["steps_per_epoch"]}))
    for e, best in result["max_accelerators"].items():
        out.append(measure(NAME, METRICS["train_max_accelerators"], {"epochs": e}, best,
                           context={"target": name, "au_floor": result["au_floor"],
                                    "swept": sorted({r["accelerators"] for r in result["runs"]})}))
    return out



class TrainingOutcome(ResultOutcome):
    """The sweep's results (a dict, as `run` assembles it) and the protocol's views of them."""

    def measurements(self) -> list[Measurement]:
        return measurements(self, self.target)

    def document(self) -> dict:
        """The first sweep point: one accelerator count, one epochs value (as the CLI runs)."""
        r = self["runs"][0]
        n = r["accelerators"]
        calib = self["calibration"].get(n)
        return {"workload": self["workload"]["name"], "accelerators": n, "epochs": r["epochs"],
                "backend": r["backend"], "path": r["path"], "au_mean": r["au_mean"],
                "au_min_epoch": r["au_min_epoch"], "samples_per_s": r["samples_per_s"],
                "bw_bytes": r["bw_bytes"], "bytes": r["bytes"],
                "device_read_bytes": r["device_read_bytes"],
                "au_ceiling": calib["au_mean"] if calib else None,
                "steps_per_epoch": r["steps_per_epoch"], "shuffle_seed": self["shuffle_seed"],
                "dataset": self["dataset"], "dataset_rule": self["rule"][n],
                "caveats": caveats(self, n), "per_epoch": r["per_epoch"]}

    def lines(self) -> list[str]:
        doc = self.document()
        out = [f"epoch {e['epoch']}: AU {e['au_mean'] * 100:.1f} %, {e['samples_per_s']:.1f} "
               f"samples/s, {e['bw_bytes'] / 2**20:.0f} MiB/s, device read "
               + (format_size(e["device"]["read_bytes"]) if e["device"] else "unknown")
               for e in doc["per_epoch"]]
        ceiling = f", ceiling without storage {doc['au_ceiling'] * 100:.1f} %" \
            if doc["au_ceiling"] is not None else ""
        out.append(f"{doc['workload']}, {doc['accelerators']} accelerator(s) [{doc['backend']}, "
                   f"{doc['path']}]: AU mean {doc['au_mean'] * 100:.1f} %, lowest epoch "
                   f"{doc['au_min_epoch'] * 100:.1f} %{ceiling}; {doc['samples_per_s']:.1f} "
                   f"samples/s, {doc['bw_bytes'] / 2**20:.0f} MiB/s")
        out += [f"CAVEAT: {c}" for c in doc["caveats"]]
        return out

    def charts(self) -> dict[str, bytes]:
        return {"AU vs accelerators": charts.sweep_chart(self, "au"),
                "MiB/s vs accelerators": charts.sweep_chart(self, "bw")}


def _defaults(given: dict) -> dict:
    """A quick run without a profile: one accelerator count, one epoch."""
    return {"accelerators": [1], "epochs": [1]}


def _fit(table: dict, room: int, need: int) -> dict:
    """A dataset that fits (--qual-fit): fewer files, but enough for two steps of every
    accelerator count; then shorter records if those still do not fit."""
    w = workload_of(table)
    least = math.ceil(2 * w.batch * max(table["accelerators"]) / w.samples_per_file)  # AU: 2 steps
    files = max(least, int(w.files * room / need * FIT_MARGIN))
    scale = min(1.0, room * FIT_MARGIN / (files * w.file_bytes))
    return {"files": files, "record_scale": table["record_scale"] * scale}


RUN_TESTS = ("test_utilisation", "test_throughput", "test_accelerators_per_drive",
             "test_dataset_size")


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one sweep (its module's `outcome`, run `repeats` times over the
    dataset written once): per accelerator count a calibration epoch without storage and each epochs value, every
    epoch as long as its compute or its reads, whichever is longer."""
    if test not in RUN_TESTS:
        return []
    w = workload_of(table)
    data = w.files * w.file_bytes
    seconds, read = 0.0, 0
    for n in table["accelerators"]:
        steps = configs.steps_per_epoch(w, n)
        compute = steps * w.computation_time
        epoch_bytes = steps * w.batch * n * w.record_length
        epoch = max(compute, epoch_bytes / rates.read_bw)
        seconds += compute * bool(table["calibrate"]) + sum(table["epochs"]) * epoch
        read += sum(table["epochs"]) * epoch_bytes
    return [Work("training dataset", data / rates.write_bw, bytes_written=data, space=data,
                 what=f"the {w.name} dataset ({w.files} files)"),
            Work("training sweep", seconds, bytes_read=read, repeated=True)]


def _feasible(profile, criterion, link) -> list[str]:
    """An AU floor: AU x accelerators x one accelerator's demand must fit within the link. A
    dataset share (MLPerf Storage's size rule) must be reachable with the profile's own
    dataset: 500 steps of every accelerator in files (the host-memory half of the rule depends
    on the host and is measured at run time)."""
    table = profile.table(NAME)
    if table is None:
        return []
    w = workload_of(table)
    n = criterion.param_dict.get("accelerators")
    gbs = lambda v: f"{v / 1e9:.3g} GB/s"  # noqa: E731
    if criterion.metric == "train_au" and link and w.computation_time:
        need = criterion.min * n * w.demand()
        if need > link:
            return [f"AU {criterion.min * 100:g} % x {n} accelerators x {gbs(w.demand())} "
                    f"each needs {gbs(need)}, more than a {profile.link} link carries "
                    f"({gbs(link)})"]
    if criterion.metric == "train_dataset_share":
        share = w.files / configs.minimum_files(w, n, host_memory=0)
        if share < criterion.min:
            return [f"at least {criterion.min * 100:g} % of MLPerf's dataset size, but the "
                    f"profile's dataset holds {share * 100:.3g} % of 500 steps of {n} "
                    "accelerators"]
    return []


FAMILY = Family(name=NAME, description="DLIO-style training-data ingestion with simulated "
                "accelerators: AU, samples/s, bandwidth", fields=FIELDS, metrics=METRICS,
                check=_check, cells=_cells, run=run, remove=remove, command="train",
                plan=_plan, filesystem=True,
                fit=_fit,
                flags=Flags(defaults=_defaults), feasible=_feasible)

"""A training run: the sample files on the target, then for every accelerator count a
calibration epoch without storage and each epochs value, the simulated accelerators reading
through the engine; what qual made removed."""

from __future__ import annotations

import math
import os
import secrets
import time

import numpy as np

from qual import engine
from qual.family import Repetition
from qual.targets import Target
from qual.workloads.training import accelerators, configs, dataset
from qual.workloads.training.accelerators import Epoch, Plan
from qual.workloads.training.configs import WORKLOADS, Workload
from qual.workloads.training.spec import workload_of
from qual.workloads.training.results import TrainingOutcome


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


class _Columns:
    """A read thread's reader of whole files, or of a columnar file's ranges."""

    def __init__(self, reader: engine.SampleReader, ranges: engine.Ranges | None):
        self.reader, self.ranges, self.backend = reader, ranges, reader.backend

    def read(self, path: str) -> int:
        return self.reader.read(path, self.ranges)

    def close(self) -> None:
        self.reader.close()


def _sweep_point(data: dataset.Dataset, table: dict, target: Target, n: int, epochs: int,
                 seed: int, *, faults=(), calibration: bool = False, progress=None) -> dict:
    """One run: `epochs` epochs with n accelerators (calibration: one epoch, no storage)."""
    w = data.workload
    plan = plan_of(w, table, n)
    paths = [data.path(i) for i in range(data.files)]
    ctl = engine.new_ctl()
    align = target.align
    # a columnar file's loader reads only its columns' chunks (the same in every file)
    ranges = engine.Ranges(w.column_ranges(), align) if w.read_columns else None
    if calibration:
        sizes = {p: ranges.nbytes if ranges else size for p, size in zip(paths, data.sizes)}

        def open_reader():
            return _NoStorage(sizes)
    else:
        def open_reader():
            return _Columns(engine.SampleReader(
                block_size=table["block_size"], queue_depth=table["queue_depth"], align=align,
                direct=table["direct"], backend=table["backend"], faults=tuple(faults),
                ctl=ctl), ranges)

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
        progress=None, repetition: Repetition = Repetition()) -> TrainingOutcome:
    """The sweep of the profile: the dataset (generated once), then for every accelerator count
    a calibration run without storage and a run per epochs value. A repeated run calibrates in
    its last repetition only: the ceiling judged with the median AU is the last repetition's
    (Repeated.measurements), so the earlier repetitions' calibrations decided nothing."""
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
    calibrate = table["calibrate"] and repetition.last
    points = len(table["accelerators"]) * (len(table["epochs"]) + calibrate)
    done = 0

    def say(message, _=None):
        if progress:
            progress(message, done / points)
    for n in table["accelerators"]:
        need = configs.minimum_files(w, n, memory)
        out["rule"][n] = {"files": data.files, "minimum_files": need,
                          "share": data.files / need}
        if calibrate:
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

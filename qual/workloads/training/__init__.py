"""DLIO-style training-data ingestion (seed 001): simulated accelerators read sample files from
the target through the native engine and compute for a fixed time per step; accelerator
utilisation (AU), samples/s and bandwidth per accelerator count, the largest count that holds
the AU floor (MLPerf Storage's accelerators per drive), and the simulator's own AU ceiling."""

from __future__ import annotations

import math

from qual.workloads.base import FIT_MARGIN
from qual.family import Family, Flags, Rates, SuiteTest, Work, declares
from qual.workloads.training import configs
from qual.workloads.training.spec import (FIELDS, METRICS, NAME, cells, check_table, explain,
                                          workload_of)
from qual.workloads.training.results import (TrainingOutcome, _check_run, caveats,
                                             measurements)
from qual.workloads.training.workload import (au_floor, host_memory, max_accelerators, plan_of,
                                              remove, run)

# the family's face to suites, tests and tooling; the rest stays in its modules
__all__ = ["FAMILY", "NAME", "METRICS", "FIELDS", "workload_of", "run", "remove", "plan_of",
           "host_memory", "au_floor", "max_accelerators", "measurements", "caveats", "_check_run",
           "TrainingOutcome"]


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


TESTS = (
    SuiteTest("utilisation", "training AU", "Mean and lowest-epoch AU per accelerator count, "
              "and the no-storage ceiling.", section="utilisation",
              charts=("AU vs accelerators",)),
    SuiteTest("throughput", "training throughput", "Samples/s and bytes/s per accelerator "
              "count, and the share the device really read.", section="throughput",
              charts=("MiB/s vs accelerators",)),
    SuiteTest("accelerators_per_drive", "accelerators per drive", "The most accelerators of "
              "the sweep that held the AU floor (MLPerf Storage's headline).",
              section="accelerators"),
    SuiteTest("dataset_size", "training dataset size", "Files against MLPerf Storage's minimum "
              "(500 steps of every accelerator, 5x host RAM).", section="dataset"),
)


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one sweep (its module's `outcome`, run `repeats` times over the
    dataset written once): per accelerator count each epochs value, every epoch as long as its
    compute or its reads, whichever is longer, and once a run a calibration epoch without
    storage."""
    if not declares(TESTS, test):
        return []
    w = workload_of(table)
    data = w.files * w.file_bytes
    seconds, calibration, read = 0.0, 0.0, 0
    for n in table["accelerators"]:
        steps = configs.steps_per_epoch(w, n)
        compute = steps * w.computation_time
        epoch_bytes = steps * w.batch * n * w.record_length
        seconds += sum(table["epochs"]) * max(compute, epoch_bytes / rates.read_bw)
        calibration += compute * bool(table["calibrate"])
        read += sum(table["epochs"]) * epoch_bytes
    return [Work("training dataset", data / rates.write_bw, bytes_written=data, space=data,
                 what=f"the {w.name} dataset ({w.files} files)"),
            Work("training sweep", seconds, bytes_read=read, repeated=True),
            Work("training calibration", calibration)]


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
                check=check_table, cells=cells, run=run, remove=remove, command="train",
                plan=_plan, filesystem=True, tests=TESTS, measures_once=True,
                fit=_fit,
                flags=Flags(defaults=_defaults,
                            explain=lambda table: explain(table, host_memory())), feasible=_feasible)

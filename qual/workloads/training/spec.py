"""The training family's spec: its metrics, the fields of its profile table (a DLIO workload,
scaled), the table's check and the measurement ids a table will produce."""

from __future__ import annotations

from qual.workloads.base import backend_field
from qual.family import Field
from qual.measurement import Metric, Param, measurement_id
from qual.workloads.training import configs
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
    Field("workload", "choice", default="unet3d-h100", choices=tuple(WORKLOADS),
          help="the DLIO workload: sample size, batch and compute time per step"),
    Field("files", "count", help="sample files (default: the workload's)"),
    Field("record_scale", "number", default=1.0,
          help="scales the record length and its spread, for small targets"),
    Field("batch_size", "count", help="samples per step (default: the workload's)"),
    Field("computation_time", "duration", minimum=0,
          help="compute per step (default: the workload's; 0: read as fast as the drive can)"),
    Field("read_threads", "count", help="loader threads per accelerator (default: the workload's)"),
    Field("prefetch_size", "count", default=2, minimum=0,
          help="DLIO reader.prefetch_size: batches loaded ahead (0 means 2)"),
    Field("accelerators", "counts", default=[1, 2, 4, 6, 8, 16, 32],
          help="simulated accelerator counts, a run each"),
    Field("epochs", "counts", default=[5], help="a run per value (seed 001: 5 and 1)"),
    Field("au_floor", "ratio", help="AU that counts as keeping up (default: the workload's)"),
    Field("direct", "bool", default=True, negations=("--page-cache",),
          help="O_DIRECT; no (or --page-cache) reads through the page cache"),
    Field("block_size", "size", default="1 MiB", aliases=("--bs",), help="bytes per read"),
    Field("queue_depth", "count", default=8, maximum=4096, aliases=("--iodepth",),
          help="reads in flight per read thread"),
    Field("shuffle_seed", "count", minimum=0, aliases=("--seed",),
          help="file order seed (default: a new one every run, as MLPerf v2.0 asks)"),
    Field("data_seed", "count", default=0, minimum=0, help="seed of the generated sample files"),
    Field("calibrate", "bool", default=True, help="measure the AU ceiling without storage"),
    backend_field(),
)


def workload_of(table: dict) -> Workload:
    w = WORKLOADS[table["workload"]]
    return w.scaled(files=table.get("files"), record_scale=table["record_scale"],
                    batch=table.get("batch_size"), read_threads=table.get("read_threads"),
                    computation_time=table.get("computation_time"))


def check_table(table: dict) -> list[tuple[str, str]]:
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


def cells(table: dict) -> list[str]:
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


def explain(table: dict, memory: int) -> tuple[dict, list[str]]:
    """`qual train --plan`: the workload's figures as its YAML gives them (cited), what the
    table scales, each accelerator count's demand and steps, and the dataset-size rule against
    a host of `memory` bytes; nothing is read or written."""
    published, w = WORKLOADS[table["workload"]], workload_of(table)
    counts = []
    for n in table["accelerators"]:
        need = configs.minimum_files(w, n, memory)
        counts.append({"accelerators": n, "demand_bytes_per_s": w.demand() * n,
                       "steps_per_epoch": configs.steps_per_epoch(w, n),
                       "minimum_files": need, "dataset_share": w.files / need})
    doc = {"workload": w.name, "source": w.source, "format": w.format,
           "published": {"files": published.files,
                         "samples_per_file": published.samples_per_file,
                         "record_length": published.record_length,
                         "record_stdev": published.record_stdev, "batch": published.batch,
                         "read_threads": published.read_threads,
                         "computation_time": published.computation_time,
                         "epochs": published.epochs, "au_floor": published.au_floor},
           "files": w.files, "record_length": w.record_length, "batch": w.batch,
           "computation_time": w.computation_time, "dataset_bytes": w.files * w.file_bytes,
           "host_memory": memory, "accelerators": counts}
    p = published
    spread = f" ± {p.record_stdev:,}" if p.record_stdev else ""
    floor = f"{p.au_floor * 100:g} %" if p.au_floor is not None else "none"
    lines = [f"{w.name}: {w.source}",
             f"  dataset: {p.files:,} {p.format} files x {p.samples_per_file:,} sample(s) of "
             f"{p.record_length:,}{spread} B",
             f"  reader: batch {p.batch:,}, {p.read_threads} read threads; compute "
             f"{p.computation_time:g} s a step; {p.epochs} epoch(s); AU floor {floor}",
             f"  one accelerator at 100 % AU reads batch x record / compute = {p.batch:,} x "
             f"{p.sample_read_bytes:,} B / {p.computation_time:g} s = {p.demand() / 1e6:,.1f} MB/s"]
    if p.read_columns:
        lines.insert(2, f"  columnar: {len(p.columns)} columns, row groups of {p.row_group:,} "
                        f"rows; the loader reads {len(p.read_columns)} columns, "
                        f"{p.sample_read_bytes:,} of a row's {p.record_length:,} B, as each "
                        "column's chunk of each row group")
        doc["columns"] = {"count": len(p.columns), "read": list(p.read_columns),
                          "row_group": p.row_group, "sample_read_bytes": p.sample_read_bytes}
    if (w.files, w.record_length, w.batch, w.computation_time) != \
            (p.files, p.record_length, p.batch, p.computation_time):
        lines.append(f"  this table: {w.files:,} files of {w.file_bytes:,} B, batch {w.batch:,}, "
                     f"compute {w.computation_time:g} s ({w.demand() / 1e6:,.1f} MB/s an "
                     "accelerator)")
    lines.append(f"  dataset {w.files * w.file_bytes / 1e9:,.3f} GB; MLPerf's size rule: 500 "
                 f"steps of every accelerator and 5x this host's {memory / 2**30:.1f} GiB")
    lines += [f"  {c['accelerators']} accelerator(s): {c['demand_bytes_per_s'] / 1e6:,.1f} "
              f"MB/s, {c['steps_per_epoch']:,} steps an epoch, size rule {c['minimum_files']:,} "
              f"files ({c['dataset_share'] * 100:.3g} % met)" for c in counts]
    return doc, lines


"""A GNN run: the IGBH dataset (generated or found) and its feature store on the target, then
RGAT trained through each loader (GIDS/BaM-style and the mmap baseline) on the same batches;
what qual made removed."""

from __future__ import annotations

import errno
import json
import shutil
import time
from pathlib import Path

import numpy as np

from qual import honesty
from qual.units import format_duration
from qual.errors import QualError, TargetUnavailable
from qual.family import Repetition
from qual.targets import Target
from qual.targets.scratch import own_folder, remove_made
from qual.workloads.gnn import store as feature_store
from qual.workloads.gnn.igbh import CALIBRATION, CLASSES, IGBH, MARKER, generate, synthetic_name
from qual.workloads.gnn.spec import DATASETS
from qual.workloads.gnn.results import GnnOutcome


def dataset_of(target: Target, table: dict, progress=None) -> IGBH:
    """A downloaded IGBH the profile names, or qual's synthetic one in the target's folder
    (generated once; regenerated when its parameters change)."""
    if table["dataset"] != "synthetic":
        return IGBH(table["dataset"], table["size"])
    folder = target.directory
    if folder is None:
        raise TargetUnavailable(errno.ENOTSUP, "a synthetic IGBH needs a filesystem: give a "
                                "directory on the drive", target=target.spec)
    root = folder / DATASETS
    name = synthetic_name(table["size"], table["scale"])
    marker = root / name / MARKER
    if marker.exists():
        doc = json.loads(marker.read_text())
        if (doc.get("size"), doc.get("scale"), doc.get("seed"), doc.get("calibration")) == \
                (table["size"], table["scale"], table["data_seed"], CALIBRATION.as_dict()):
            return IGBH(root, name)
        shutil.rmtree(root / name)
    own_folder(root)
    return generate(root, table["size"], scale=table["scale"], seed=table["data_seed"],
                    progress=progress)


def cache_pages(table: dict, store) -> int:
    if table.get("cache_size"):
        return max(1, table["cache_size"] // store.page_size)
    return max(1, int(table["cache_share"] * store.rows * store.row_stride // store.page_size))


def cpu_buffer_rows(table: dict, store) -> int:
    return int(table["cpu_buffer_share"] * store.rows)


def feature_memory(table: dict, store) -> int:
    """Host memory GIDS holds features in (its cache and CPU buffer): the mmap baseline's
    budget, so that both loaders are judged with the same memory."""
    return cache_pages(table, store) * store.page_size + cpu_buffer_rows(table, store) * store.row_bytes


def open_loader(name: str, table: dict, store, graph, labels, **common):
    """One loader as the profile sets it up; its setup() says how, for the record."""
    from qual.workloads.gnn.graph import hot_rows
    from qual.workloads.gnn.loaders import (GidsLoader, MemoryBudget, MmapLoader,
                                            accumulator_threshold)

    if name == "gids":
        cpu_rows = None
        if cpu_buffer_rows(table, store):
            hot = hot_rows(graph, store.offsets, table["fanouts"][0])
            cpu_rows = np.sort(hot[:cpu_buffer_rows(table, store)])
        threshold = accumulator_threshold(table["ssd_bandwidth"] * 1e9, table["ssd_latency"],
                                          table["system_latency"], table["ssds"],
                                          store.page_size) if table["accumulator"] else 0
        return GidsLoader(store, graph, labels, cache_pages=cache_pages(table, store),
                          window=table["window"], threshold=threshold, cpu_rows=cpu_rows,
                          page_cache=table["page_cache"], queue_depth=table["queue_depth"],
                          max_coalesce=table["max_coalesce"], backend=table["backend"], **common)
    budget = MemoryBudget(store, feature_memory(table, store),
                          prefer_cgroup=table["memory_budget"] != "evict")
    if table["memory_budget"] == "cgroup" and budget.mode != "cgroup":
        budget.close()
        raise QualError(errno.ENOTSUP, f"the profile asks for a memory cgroup: {budget.detail}")
    return MmapLoader(store, graph, labels, budget=budget, **common)


def run(target: Target, table: dict, *, seed: int = 1, progress=None,
        repetition: Repetition = Repetition()) -> GnnOutcome:
    """Both loaders train RGAT on the same batches; returns what each measured. The accuracy
    is validated in the last repetition only: every repetition trains the same model on the
    same rows (the seed fixes both), so it would validate to the same value again; only the
    timed steps vary."""
    from qual.workloads.gnn.graph import Graph
    from qual.workloads.gnn.train import splits, train

    if progress:
        progress(f"RGAT on IGBH {table['size']} through {', '.join(table['loaders'])}: the "
                 "dataset and feature store first, then an estimate after the first steps")
    dataset = dataset_of(target, table, progress)
    folder = target.directory if target.directory is not None else Path(dataset.root)
    store = feature_store.build(dataset, folder, page_size=table["page_size"])
    graph = Graph.of(dataset)
    labels = dataset.labels(CLASSES)
    train_ids, val_ids = splits(dataset.counts["paper"])
    relations = [r.key for r in graph.relations]
    common = dict(fanouts=table["fanouts"], batch_size=table["batch_size"], seed=seed)
    model = {"hidden": table["hidden"], "heads": table["heads"], "classes": CLASSES,
             "fanouts": table["fanouts"], "lr": table["lr"], "epochs": table["epochs"],
             "warmup": table["warmup"], "steps": table["steps"],
             "batch_size": table["batch_size"]}
    out = {"dataset": dataset.describe(), "store": store.as_dict(), "loaders": {}}
    validate = repetition.last

    def pace(name: str, first: bool, step_s: float, steps: int) -> None:
        """How long training will take, said once a loader's first steps are timed: RGAT
        trains on this host's CPU, GIDS's figure is 100 measured steps a loader, and the
        loader that runs next is the baseline GIDS is faster than."""
        if not progress:
            return
        loaders = len(table["loaders"])
        checks = -(-len(val_ids) // table["batch_size"]) if validate else 0
        one = step_s * (steps + checks)  # a validation batch reads as much as a step
        why = (f"{steps} steps" + (f" and {checks} validation batches" if checks else "") +
               f" at {step_s:.2f} s a step on this host: RGAT, batch {table['batch_size']}, "
               f"fanouts {','.join(map(str, table['fanouts']))}")
        if first and loaders > 1:
            progress(f"{name}: about {format_duration(one)} ({why}); at least "
                     f"{format_duration(one * loaders)} for all {loaders} loaders, since the "
                     "mmap baseline is slower wherever GIDS's speedup holds; --steps, "
                     "--batch-size, --loader or --scale shorten it")
        else:
            progress(f"{name}: about {format_duration(one)} ({why})")

    for i, name in enumerate(table["loaders"]):
        share = 1 / len(table["loaders"])

        def say(message, done=None, i=i):
            if progress:
                progress(message, None if done is None else (i + done) * share)
        store.drop_cache()  # every loader starts cold
        loader = open_loader(name, table, store, graph, labels, **common)
        window, device = {}, {}
        hooks = {}
        if name == "gids":  # the cache's counters of the measured steps only, as GIDS reports,
            # and the device's own counters over the same steps (device truth)
            def window_start():
                loader.cache.stats(reset=True)
                device["before"] = target.device_stat()

            def window_end():
                window.update(loader.cache.stats().as_dict())
                device["seen"] = honesty.between(device.pop("before"), target.device_stat())
            hooks = {"window_start": window_start, "window_end": window_end}
        try:
            t0 = time.perf_counter()
            trained = train(loader, relations, table=model, train_ids=train_ids,
                            val_ids=val_ids, seed=seed, progress=say, validate=validate,
                            on_pace=lambda step_s, steps, name=name, i=i:
                            pace(name, i == 0, step_s, steps), **hooks)
            result = {**trained.as_dict(), "setup": loader.setup(),
                      "wall_s": time.perf_counter() - t0}
            if name == "gids":
                result["cache"] = {**window, "device": device.get("seen")} if window else {}
        finally:
            loader.close()
        out["loaders"][name] = result
    return GnnOutcome(out, target=str(target.path))


def remove(target: Target) -> None:
    """The synthetic datasets and feature stores qual made on the target."""
    folder = target.directory
    if folder is None:
        return
    feature_store.remove(folder)
    remove_made(folder / DATASETS, MARKER)

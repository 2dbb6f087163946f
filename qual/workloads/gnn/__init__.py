"""GNN training from SSD (seeds 000/002): RGAT on an IGBH graph with a GIDS/BaM-style loader
and the DGL-style mmap baseline; accuracy of both, GIDS's speedup, its cache behaviour."""

from __future__ import annotations

import errno
import json
import shutil
import time
from pathlib import Path

import numpy as np

from qual import honesty
from qual.units import format_duration, format_quantity
from qual.engine import QualError, TargetUnavailable
from qual.workloads.base import FIT_MARGIN, Family, ResultOutcome, backend_field
from qual.family import Field, Metric, Param, Rates, Work, measurement_id
from qual.record import Measurement, measure
from qual.target import Target
from qual.target.scratch import own_folder, remove_made
from qual.workloads.gnn import charts
from qual.workloads.gnn import store as feature_store
from qual.workloads.gnn.igbh import (CALIBRATION, CLASSES, FEATURE_DIM, IGBH, MARKER, SIZES,
                                     generate, synthetic_name)

# torch and PyG load only when a GNN run starts (loaders, model, train): declaring the family
# for profiles and the command line stays cheap
STAGES = ("sample", "gather", "transfer", "train")

NAME = "gnn"
LOADERS = ("gids", "mmap")
DATASETS = "qual-igbh"  # where synthetic datasets are generated, in the target's folder
_LOADER, _STAGE = Param("loader", "name"), Param("stage", "name")

METRICS = {m.name: m for m in (
    Metric("gnn_accuracy", "ratio", "higher", (_LOADER,),
           "validation accuracy of RGAT trained through the loader"),
    Metric("gnn_e2e_s", "time", "lower", (_LOADER,),
           "seconds of the measured training steps, end to end"),
    Metric("gnn_stage_s", "time", "lower", (_LOADER, _STAGE),
           "seconds of one stage (sample, gather, transfer, train) in the measured steps"),
    Metric("gnn_speedup", "ratio", "higher", (), "mmap end-to-end time over GIDS's"),
    Metric("gnn_hit_rate", "ratio", "higher", (),
           "share of GIDS feature requests served without the SSD (cache and CPU buffer)"),
    Metric("gnn_effective_bw", "bandwidth", "higher", (_LOADER,),
           "feature bytes delivered per second of gathering"),
    Metric("gnn_ssd_bw", "bandwidth", "higher", (),
           "bytes the GIDS loader read from the SSD per second of reading"),
)}

FIELDS = (
    Field("dataset", "text", default="synthetic",
          help="'synthetic', or the root of a downloaded IGBH (holding <size>/processed)"),
    Field("size", "choice", default="tiny", choices=tuple(SIZES)),
    Field("scale", "number", default=1.0, help="synthetic only: share of the size's nodes"),
    Field("data_seed", "count", default=0, minimum=0),
    Field("batch_size", "count", default=512, help="seed: 512 seed nodes per step"),
    Field("fanouts", "counts", default=[10, 5], help="neighbours per relation, hop 1 first"),
    Field("hidden", "count", default=128),
    Field("heads", "count", default=4),
    Field("lr", "number", default=0.001),
    Field("epochs", "count", default=1),
    Field("warmup", "count", default=10, minimum=0),
    Field("steps", "count", default=100, help="measured steps after the warm-up (seed: 100)"),
    Field("loaders", "choices", default=list(LOADERS), choices=LOADERS, aliases=("--loader",),
          words=(("both", list(LOADERS)),), help="the loaders compared"),
    Field("page_size", "size", default="4 KiB"),
    Field("page_cache", "bool", default=True,
          help="GIDS's software cache; off, every gather reads all it needs (a removal test)"),
    Field("cache_share", "ratio", default="10 %", help="software cache, share of the store"),
    Field("cache_size", "size", minimum=4096, help="software cache size (overrides the share; "
          "GIDS paper: an 8 GB GPU cache for IGBH-full's 2.2 TB)"),
    Field("cpu_buffer_share", "ratio", default="20 %",
          help="constant CPU buffer of the hottest rows, share of the store (seed: 20 %; 0 off)"),
    Field("window", "count", default=8, minimum=0,
          help="batches sampled ahead whose pages stay pinned (GIDS wb_size; 0 off)"),
    Field("accumulator", "bool", default=True,
          help="merge batches until their storage requests reach GIDS's threshold"),
    Field("ssd_bandwidth", "number", default=5.8, help="GB/s, for the accumulator's threshold"),
    Field("ssd_latency", "duration", default="11 us"),
    Field("system_latency", "duration", default="20 us"),
    Field("ssds", "count", default=1),
    Field("queue_depth", "count", default=128, maximum=4096),
    Field("max_coalesce", "count", default=32, maximum=1024),
    Field("memory_budget", "choice", default="auto", choices=("auto", "cgroup", "evict"),
          help="how the mmap baseline is held to GIDS's host memory (cache + CPU buffer)"),
    backend_field(),
)


def _check(table: dict) -> list[tuple[str, str]]:
    problems = []
    if table["scale"] > 1:
        problems.append(("scale", f"{table['scale']} is above 1"))
    if table["hidden"] % table["heads"]:
        problems.append(("hidden", f"{table['hidden']} is not a multiple of {table['heads']} heads"))
    if table["page_size"] % 512 or table["page_size"] & (table["page_size"] - 1):
        problems.append(("page_size", "is not a power of two of 512 bytes or more"))
    for key in ("cache_share", "cpu_buffer_share"):
        if not 0 <= table[key] <= 1:
            problems.append((key, f"{table[key] * 100:g} % is outside 0..100 %"))
    if table["cache_share"] <= 0:
        problems.append(("cache_share", "the cache needs some room"))
    return problems


def _cells(table: dict) -> list[str]:
    ids = []
    for ld in table["loaders"]:
        ids += [measurement_id(METRICS["gnn_accuracy"], {"loader": ld}),
                measurement_id(METRICS["gnn_e2e_s"], {"loader": ld}),
                measurement_id(METRICS["gnn_effective_bw"], {"loader": ld})]
        ids += [measurement_id(METRICS["gnn_stage_s"], {"loader": ld, "stage": s}) for s in STAGES]
    if "gids" in table["loaders"]:
        ids += ["gnn_hit_rate", "gnn_ssd_bw"]
    if set(LOADERS) <= set(table["loaders"]):
        ids.append("gnn_speedup")
    return ids


# ------------------------------------------------------------------ running it


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


def run(target: Target, table: dict, *, seed: int = 1, progress=None) -> GnnOutcome:
    """Both loaders train RGAT on the same batches; returns what each measured."""
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

    def pace(name: str, first: bool, step_s: float, steps: int) -> None:
        """How long training will take, said once a loader's first steps are timed: RGAT
        trains on this host's CPU, GIDS's figure is 100 measured steps a loader, and the
        loader that runs next is the baseline GIDS is faster than."""
        if not progress:
            return
        loaders = len(table["loaders"])
        checks = -(-len(val_ids) // table["batch_size"])
        one = step_s * (steps + checks)  # a validation batch reads as much as a step
        why = (f"{steps} steps and {checks} validation batches at {step_s:.2f} s a step on "
               f"this host: RGAT, batch {table['batch_size']}, fanouts "
               f"{','.join(map(str, table['fanouts']))}")
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
                            val_ids=val_ids, seed=seed, progress=say,
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


# ------------------------------------------------------------------ results into measurements


def measurements(result: dict, target: str) -> list[Measurement]:
    out = []
    loaders = result["loaders"]
    row_bytes = result["store"]["row_bytes"]
    gids = loaders.get("gids", {}).get("cache")
    # the GIDS loader's claim on the SSD, proven by the device's counters over its window
    proof = honesty.check_device(gids["device"], "read_bytes", gids["read_bytes"],
                                 "GIDS feature reads", target) if gids else {}
    for name, r in loaders.items():
        ctx = {"target": target, "dataset": result["dataset"]["size"],
               "synthetic": bool(result["dataset"]["synthetic"]), "steps": r["steps"],
               "measured": r["measured"], "setup": r["setup"]}
        timed = {**ctx, **proof} if name == "gids" else ctx
        out.append(measure(NAME, METRICS["gnn_accuracy"], {"loader": name}, r["accuracy"],
                           context={**ctx, "batches": r["accuracy_batches"]},
                           interval=r["accuracy_interval"], interval_confidence=0.95,
                           spread_from=r["accuracy_batches"]))
        out.append(measure(NAME, METRICS["gnn_e2e_s"], {"loader": name}, r["e2e_s"],
                           context={**timed, "stages": r["stages"]}))
        for stage, seconds in r["stages"].items():
            out.append(measure(NAME, METRICS["gnn_stage_s"], {"loader": name, "stage": stage},
                               seconds, context=timed))
        c = r.get("cache")
        if c:
            out.append(measure(NAME, METRICS["gnn_hit_rate"], {}, c["hit_rate"],
                               context={**ctx, "cache": c}))
            if c["io_s"]:
                out.append(measure(NAME, METRICS["gnn_ssd_bw"], {}, c["read_bytes"] / c["io_s"],
                                   context={**ctx, "cache": c, **proof}))
        if r["stages"]["gather"]:
            out.append(measure(NAME, METRICS["gnn_effective_bw"], {"loader": name},
                               r["rows"] * row_bytes / r["stages"]["gather"], context=timed))
    if set(LOADERS) <= set(loaders) and loaders["gids"]["e2e_s"]:
        memory, unequal = equal_memory(loaders["gids"]["setup"], loaders["mmap"]["setup"])
        out.append(measure(NAME, METRICS["gnn_speedup"], {},
                           loaders["mmap"]["e2e_s"] / loaders["gids"]["e2e_s"],
                           context={"target": target, "gids_e2e_s": loaders["gids"]["e2e_s"],
                                    "mmap_e2e_s": loaders["mmap"]["e2e_s"], **proof, **memory},
                           unverifiable=unequal))
    return out


def equal_memory(gids: dict, mmap: dict) -> tuple[dict, str | None]:
    """Both loaders' host memory for features and the baseline's measured residency, and why
    the speedup is no verdict (None: it is): only when the baseline had as much memory as GIDS
    and was held to it."""
    out = {"gids_memory_bytes": gids["memory_bytes"], "mmap_memory_bytes": mmap["memory_bytes"],
           "mmap_memory": {k: mmap[k] for k in ("mode", "steps_measured", "max_resident_bytes",
                                                "steps_over_budget")}}
    size = lambda n: format_quantity(n, dimension="size")  # noqa: E731
    if mmap["steps_over_budget"]:
        return out, (
            f"the mmap baseline's page cache exceeded its {size(mmap['memory_bytes'])} budget "
            f"(plus the step's own rows) at {mmap['steps_over_budget']} of "
            f"{mmap['steps_measured']} steps, up to {size(mmap['max_resident_bytes'])}: "
            f"{mmap['mode']} mode could not hold it there")
    if mmap["memory_bytes"] < gids["memory_bytes"]:
        return out, (f"the mmap baseline had {size(mmap['memory_bytes'])} of host memory, "
                     f"GIDS {size(gids['memory_bytes'])}")
    return out, None



class GnnOutcome(ResultOutcome):
    """What each loader measured (a dict, as `run` assembles it) and the protocol's views."""

    def measurements(self) -> list[Measurement]:
        return measurements(self, self.target)

    def document(self) -> dict:
        loaders = self["loaders"]
        row = self["store"]["row_bytes"]
        doc = {"dataset": self["dataset"], "steps": next(iter(loaders.values()))["measured"],
               "e2e_s": {k: v["e2e_s"] for k, v in loaders.items()},
               "accuracy": {k: v["accuracy"] for k, v in loaders.items()},
               "accuracy_interval": {k: v["accuracy_interval"] for k, v in loaders.items()},
               "stages": {k: v["stages"] for k, v in loaders.items()},
               "effective_bw_bytes": {k: v["rows"] * row / v["stages"]["gather"]
                                      for k, v in loaders.items() if v["stages"]["gather"]},
               "setup": {k: v["setup"] for k, v in loaders.items()}}
        if "gids" in loaders and "mmap" in loaders:
            doc["speedup"] = loaders["mmap"]["e2e_s"] / loaders["gids"]["e2e_s"]
        c = loaders.get("gids", {}).get("cache")
        if c:
            doc["cache"] = {"hits": c["hits"], "misses": c["misses"],
                            "cpu_buffer_hits": c["cpu_hits"], "ssd_reads": c["reads"],
                            "ssd_read_bytes": c["read_bytes"], "hit_rate": c["hit_rate"],
                            "writes": c["writes"]}
        return doc

    def lines(self) -> list[str]:
        doc = self.document()
        out = []
        for name in doc["accuracy"]:
            stages = ", ".join(f"{k} {v:.2f}" for k, v in doc["stages"][name].items())
            interval = doc["accuracy_interval"][name]
            spread = (f"95 % interval {interval[0] * 100:.1f} .. {interval[1] * 100:.1f} %"
                      if interval else "one validation batch: spread unknown")
            out.append(f"{name}: {doc['e2e_s'][name]:.2f} s for {doc['steps']} steps ({stages}), "
                       f"validation accuracy {doc['accuracy'][name] * 100:.1f} % ({spread})")
        if "speedup" in doc:
            memory = format_quantity(doc["setup"]["gids"]["memory_bytes"], dimension="size")
            mm = doc["setup"]["mmap"]
            out.append(f"GIDS speedup over mmap: {doc['speedup']:.2f}x at equal host memory "
                       f"({memory} each: GIDS cache + CPU buffer, the mmap baseline's budget "
                       f"held by {mm['mode']} mode, at most "
                       f"{format_quantity(mm['max_resident_bytes'], dimension='size')} of the "
                       "store resident)")
        if "cache" in doc:
            c = doc["cache"]
            out.append(f"GIDS cache: hit rate {c['hit_rate'] * 100:.1f} % ({c['hits']} hits, "
                       f"{c['cpu_buffer_hits']} CPU-buffer hits, {c['misses']} misses, "
                       f"{c['ssd_reads']} SSD reads)")
        return out

    def charts(self) -> dict[str, bytes]:
        out = {"stage breakdown": charts.stage_chart(self)}
        if self["loaders"].get("gids", {}).get("cache"):
            out["GIDS cache"] = charts.cache_chart(self)
        return out


# qual's reference host (2 cores, KVM), ci profile (IGBH tiny at 0.2, batch 512, fanouts 5,3,
# hidden 64, 2 heads): generating the synthetic IGBH and its feature store took 9 s of CPU for
# 110 k nodes, and an RGAT step through the GIDS loader 0.38 s
GENERATE_CPU_S_PER_NODE = 80e-6
STEP_CPU_S = 0.38
STEP_REFERENCE = 512 * (1 + 5 + 5 * 3) * 64 * 2  # seed nodes x sampled hops x hidden x heads
RUN_TESTS = ("test_accuracy", "test_speedup", "test_cache")


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one run (its module's `outcome`): the synthetic IGBH and its
    feature store written, then each loader's training steps and validation batches; RGAT
    computes on the host's CPU, and the mmap baseline also waits for its page faults (reads
    at low depth: a quarter of the 4 KiB IOPS)."""
    if test not in RUN_TESTS:
        return []
    counts = SIZES[table["size"]]
    synthetic = table["dataset"] == "synthetic"
    nodes = int(sum(counts.values()) * (table["scale"] if synthetic else 1))
    papers = int(counts["paper"] * (table["scale"] if synthetic else 1))
    store = nodes * -(-FEATURE_DIM * 4 // table["page_size"]) * table["page_size"]
    written = store * (2 if synthetic else 1)
    made = written / rates.write_bw + \
        (GENERATE_CPU_S_PER_NODE * nodes * rates.cpu if synthetic else store / rates.read_bw)
    seconds = 0.0
    hops, width = 1, 1
    for f in table["fanouts"]:
        width *= f
        hops += width
    rows = table["batch_size"] * hops
    step = STEP_CPU_S * rates.cpu * rows * table["hidden"] * table["heads"] / STEP_REFERENCE
    batches = table["epochs"] * (table["warmup"] + table["steps"] + 1 +
                                 -(-int(0.2 * papers) // table["batch_size"]))
    read = 0
    for loader in table["loaders"]:
        faults = rows / (rates.iops_4k / 4) if loader == "mmap" else 0.0
        seconds += batches * (step + faults)
        read += batches * rows * table["page_size"]
    return [Work("gnn dataset", made, bytes_written=written, space=written,
                 what=f"the IGBH {table['size']} features and their store"),
            Work("gnn training", seconds, bytes_read=read, repeated=True)]


FAMILY = Family(name=NAME, description="GIDS/BaM-style GNN feature loading vs DGL mmap, RGAT on "
                "IGBH", fields=FIELDS, metrics=METRICS, check=_check, cells=_cells, run=run,
                remove=remove, plan=_plan,
                filesystem=True, fit=lambda table, room, need: {
                    "scale": table["scale"] * room / need * FIT_MARGIN}
                if table["dataset"] == "synthetic" else {})

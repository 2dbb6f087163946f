"""The GNN family's spec: its metrics, the fields of its profile table, the table's check and
the measurement ids a table will produce."""

from __future__ import annotations

from qual.workloads.base import backend_field
from qual.family import Field
from qual.measurement import Metric, Param, measurement_id
from qual.workloads.gnn.igbh import SIZES


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
    Field("size", "choice", default="tiny", choices=tuple(SIZES),
          help="IGBH dataset size (tiny .. full), generated in its real layout"),
    Field("scale", "number", default=1.0, help="synthetic only: share of the size's nodes"),
    Field("data_seed", "count", default=0, minimum=0, help="seed of the generated graph"),
    Field("batch_size", "count", default=512, help="seed: 512 seed nodes per step"),
    Field("fanouts", "counts", default=[10, 5], help="neighbours per relation, hop 1 first"),
    Field("hidden", "count", default=128, help="RGAT hidden channels"),
    Field("heads", "count", default=4, help="RGAT attention heads"),
    Field("lr", "number", default=0.001, help="learning rate"),
    Field("epochs", "count", default=1, help="training epochs for the accuracy"),
    Field("warmup", "count", default=10, minimum=0, help="steps run before the measured ones"),
    Field("steps", "count", default=100, help="measured steps after the warm-up (seed: 100)"),
    Field("loaders", "choices", default=list(LOADERS), choices=LOADERS, aliases=("--loader",),
          words=(("both", list(LOADERS)),), help="the loaders compared"),
    Field("page_size", "size", default="4 KiB", help="bytes per feature-store page (BaM)"),
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
    Field("ssd_latency", "duration", default="11 us",
          help="the drive's read latency, for the accumulator's threshold"),
    Field("system_latency", "duration", default="20 us",
          help="the host's latency per request, for the accumulator's threshold"),
    Field("ssds", "count", default=1, help="drives the store is spread over"),
    Field("queue_depth", "count", default=128, maximum=4096, help="page reads in flight"),
    Field("max_coalesce", "count", default=32, maximum=1024,
          help="adjacent pages merged into one read at most"),
    Field("memory_budget", "choice", default="auto", choices=("auto", "cgroup", "evict"),
          help="how the mmap baseline is held to GIDS's host memory (cache + CPU buffer)"),
    backend_field(),
)


def check_table(table: dict) -> list[tuple[str, str]]:
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


def cells(table: dict) -> list[str]:
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

"""The checkpoint family's spec: its metrics, the fields of its profile table, the table's check
and the measurement ids a table will produce."""

from __future__ import annotations

from qual.family import Field
from qual.measurement import Metric, Param, measurement_id
from qual.workloads.base import backend_field
from qual.workloads.checkpoint.plan import MODELS, Plan, RECIPES, SUBSET_PROCESSES, plan_from


NAME = "checkpoint"
_PASS, _INDEX = Param("pass", "count"), Param("index", "count")
MLPERF_CHECKPOINTS = 10  # MLPerf Storage v2.0: 10 writes, then 10 reads, per run
GIB = 1 << 30  # DLIO's and mlpstorage's "GB" in these figures is GiB

METRICS = {m.name: m for m in (
    Metric("ckpt_write_s", "time", "lower", (_PASS,),
           "mean seconds per checkpoint in a pass, barrier to commit"),
    Metric("ckpt_write_bw", "bandwidth", "higher", (_PASS,),
           "checkpoint bytes over the mean seconds per checkpoint in a pass"),
    Metric("ckpt_rank_bw_min", "bandwidth", "higher", (_PASS,),
           "slowest rank's bytes per second, averaged over the pass (MLPerf Storage)"),
    Metric("ckpt_each_s", "time", "lower", (_PASS, _INDEX), "seconds of one checkpoint"),
    Metric("ckpt_size", "size", "higher", (), "bytes in one checkpoint"),
    Metric("ckpt_restore_s", "time", "lower", (), "restore of the last checkpoint, slowest rank"),
    Metric("ckpt_restore_bw", "bandwidth", "higher", (), "checkpoint bytes over restore seconds"),
    Metric("ckpt_restore_intact", "ratio", "higher", (),
           "1 when every restored byte equals what was written (CRC32C and comparison)"),
    Metric("torch_save_bw", "bandwidth", "higher", (), "torch.save + fsync of the same tensors"),
    Metric("torch_load_bw", "bandwidth", "higher", (), "torch.load from a cold cache"),
    Metric("ckpt_save_speedup", "ratio", "higher", (), "native write over torch.save bandwidth"),
    Metric("ckpt_load_speedup", "ratio", "higher", (), "native restore over torch.load bandwidth"),
    # MLPerf Storage v2.0's figures, named as DLIO's summary names them: per checkpoint the
    # slowest rank's seconds and the slowest rank's throughput, averaged over a run's
    # checkpoints, then over the runs (what MLPerf reports; each run's are in the context)
    Metric("save_checkpoint_duration", "time", "lower", (),
           "MLPerf: checkpoint write seconds, slowest rank, mean over checkpoints and runs"),
    Metric("save_checkpoint_io", "bandwidth", "higher", (),
           "MLPerf: checkpoint write throughput, slowest rank, mean over checkpoints and runs"),
    Metric("load_checkpoint_duration", "time", "lower", (),
           "MLPerf: checkpoint read seconds (cache cleared), slowest rank, mean over them"),
    Metric("load_checkpoint_io", "bandwidth", "higher", (),
           "MLPerf: checkpoint read throughput (cache cleared), slowest rank, mean over them"),
)}

FIELDS = (
    Field("model", "choice", required=True, choices=tuple(MODELS),
          help="the model whose checkpoint is written (its parameter count and layers)"),
    Field("recipe", "choice", default="mixed-adam", choices=tuple(RECIPES),
          help="what a checkpoint holds per parameter (weights, optimizer state)"),
    Field("tp", "count", default=1, help="tensor-parallel degree"),
    Field("pp", "count", default=1, help="pipeline-parallel degree"),
    Field("dp", "count", default=1, help="data-parallel degree"),
    Field("zero", "count", default=0, minimum=0, maximum=3,
          help="ZeRO stage: how the optimizer state is sharded over data-parallel ranks"),
    Field("scale", "number", default=1.0, help="shrinks every tensor (0 < scale <= 1)"),
    Field("ranks", "count", default=0, minimum=0,
          help="processes on this host (0: every rank of the layout; with subset, 8)"),
    Field("subset", "bool", default=False,
          help="MLPerf's subset mode for node-local storage: this host's processes write "
               "ranks/(tp x pp x dp) of the checkpoint, each the mean rank's share"),
    Field("passes", "count", default=3, help="training passes, each writing its checkpoints"),
    Field("per_pass", "count", default=0, minimum=0, aliases=("--count",),
          help="checkpoints per pass (0: as many as fill the target to `utilisation`)"),
    Field("utilisation", "ratio", default="60 %",
          help="share of a pass the accelerators compute between checkpoints"),
    Field("retention", "count", default=2, help="checkpoints kept after each pass",
          was=("--keep",)),
    Field("restore", "bool", default=True,
          help="read the last checkpoint back and check every chunk's CRC32C"),
    Field("procedure", "choice", default="passes", choices=("passes", "mlperf-v2"),
          help="passes: seed 004's passes that fill the target; mlperf-v2: MLPerf Storage "
               "v2.0's runs of per_pass writes (10), cache cleared, then as many reads"),
    Field("runs", "count", default=5, help="mlperf-v2: runs (MLPerf: 5, averaged)"),
    Field("write_only", "bool", default=False,
          help="write the checkpoints and stop: a complete set for a later --read-only"),
    Field("read_only", "text", default=None,
          help="a checkpoint directory (the one holding manifest.json), written by an earlier "
               "run or another host, to restore and verify; nothing is written"),
    Field("baseline", "bool", default=True, help="torch.save and torch.load for comparison"),
    Field("baseline_bytes", "size", default="512 MiB", help="per rank, for the torch baseline"),
    Field("chunk_size", "size", default="8 MiB", minimum=4096,
          help="bytes per write and read of a checkpoint file"),
    Field("queue_depth", "count", default=8, maximum=1024, help="chunks in flight per rank"),
    Field("pool", "size", default="1 GiB",
          help="random data per rank; a larger rank state repeats it"),
    backend_field(),
    Field("timeout", "duration", default="2 h", help="longest wait at a rank barrier"),
)


def plan_of(table: dict) -> Plan:
    subset = (table["ranks"] or SUBSET_PROCESSES) if table["subset"] else 0
    return plan_from({**table, "subset": subset})


def check_table(table: dict) -> list[tuple[str, str]]:
    problems = []
    if table["zero"] not in (0, 1, 3):
        problems.append(("zero", f"{table['zero']} is not a ZeRO stage qual models (0, 1, 3)"))
    if table["scale"] > 1:
        problems.append(("scale", f"{table['scale']} is above 1"))
    if table["chunk_size"] % 4096:
        problems.append(("chunk_size", "is not a multiple of 4 KiB"))
    if table["write_only"] and table.get("read_only"):
        problems.append(("read_only", "a run that only reads cannot also only write "
                                      "(write_only)"))
    layout_ranks = table["tp"] * table["pp"] * table["dp"]
    if table["ranks"] > layout_ranks:
        problems.append(("ranks", f"{table['ranks']} processes for a {layout_ranks}-rank layout"))
    elif table["subset"] and not table["ranks"] and layout_ranks < SUBSET_PROCESSES:
        problems.append(("subset", f"a subset of {SUBSET_PROCESSES} processes of a "
                                   f"{layout_ranks}-rank layout (give a larger layout, or ranks)"))
    if not problems:
        try:
            plan_of(table)
        except ValueError as e:
            problems.append(("tp", str(e)))
    return problems


def cells(table: dict) -> list[str]:
    if table["procedure"] == "mlperf-v2":
        names = ("save_checkpoint_duration", "save_checkpoint_io", "load_checkpoint_duration",
                 "load_checkpoint_io")
        return [*names, "ckpt_restore_intact"]
    ids = []
    for p in range(1, table["passes"] + 1):
        for name in ("ckpt_write_s", "ckpt_write_bw", "ckpt_rank_bw_min"):
            ids.append(measurement_id(METRICS[name], {"pass": p}))
        for i in range(1, table["per_pass"] + 1):
            ids.append(measurement_id(METRICS["ckpt_each_s"], {"pass": p, "index": i}))
    ids.append("ckpt_size")
    if table["restore"]:
        ids += ["ckpt_restore_s", "ckpt_restore_bw", "ckpt_restore_intact"]
    if table["baseline"]:
        ids += ["torch_save_bw", "torch_load_bw", "ckpt_save_speedup"]
        if table["restore"]:
            ids.append("ckpt_load_speedup")
    return ids

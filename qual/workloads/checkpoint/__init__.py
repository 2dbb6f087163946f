"""DLIO-style LLM checkpointing (seed 004): passes of checkpoints that fill the target, a
restore checked (every chunk's CRC32C against the write's; the bytes each rank's data pool
holds, byte for byte), and torch.save / torch.load of the same tensors for comparison.
Ranks are processes: qual's own meet through pipes, torchrun's in a torch.distributed (gloo)
group (qual.workloads.checkpoint.group)."""

from __future__ import annotations

import os

from qual.units import format_size
from qual.family import Family, Flags, Rates, SuiteTest, Work, declares
from qual.workloads.base import FIT_MARGIN
from qual.workloads.checkpoint.plan import MLPERF_LAYOUTS, describe
from qual.workloads.checkpoint.spec import (FIELDS, METRICS, MLPERF_CHECKPOINTS, NAME, cells,
                                            check_table, plan_of)
from qual.workloads.checkpoint.results import (CheckpointOutcome, baseline_measurements,
                                               mlperf_measurements, mlperf_summary,
                                               pass_measurements, restore_measurements)
from qual.workloads.checkpoint.workload import (checkpoints_per_pass, launch, read_back, remove,
                                                run)

# the family's face to suites, tests and other hosts' tooling; the rest stays in its modules
__all__ = ["FAMILY", "NAME", "METRICS", "FIELDS", "plan_of", "run", "read_back", "remove",
           "launch", "checkpoints_per_pass", "CheckpointOutcome", "pass_measurements",
           "restore_measurements", "baseline_measurements", "mlperf_measurements",
           "mlperf_summary"]


def _plan_document(table: dict) -> tuple[dict, list[str]]:
    """`qual checkpoint --plan`: every rank's size and the arithmetic, nothing written."""
    plan = plan_of(table)
    text = describe(plan)
    return {**plan.summary(), "derivation": text}, text.splitlines()


def _defaults(given: dict) -> dict:
    """A quick run without a profile: the 8B model, one pass of one checkpoint (ten a run with
    the MLPerf procedure), no restore or torch baseline unless asked for. The MLPerf procedure
    or its subset mode, with no layout given, runs the model in MLPerf's layout."""
    mlperf = given.get("procedure") == "mlperf-v2"
    out = {"model": "llama3.1-8b", "passes": 1,
           "per_pass": MLPERF_CHECKPOINTS if mlperf else 1,
           "restore": False, "baseline": False}
    layout = MLPERF_LAYOUTS.get(given.get("model", out["model"]))
    if (mlperf or given.get("subset")) and layout and \
            not any(k in given for k in ("tp", "pp", "dp", "zero")):
        out.update(zip(("tp", "pp", "dp", "zero"), layout))
    return out


# CPU seconds a run of the ranks takes besides its I/O on qual's reference host (2 cores,
# KVM): Python, numpy and the engine imported once, by the process that forks every local
# rank (0.3 s), the forks, each rank's pool filled with random bytes and its restore compared
# (ci, 2026-12-07: three runs took 5.4 s beside about 0.6 s of I/O); torch only where the
# ranks time torch.save (`python3 -c "import torch"`: 1.6 s more)
RANK_START_CPU_S = 1.5
TORCH_IMPORT_CPU_S = 1.6
def _unless(procedure: str, wanted: str | None = None, said: str = ""):
    """A test's skip: a profile of another procedure, or one without the table key it needs."""
    def why(table: dict) -> str | None:
        if table["procedure"] != procedure:
            return f"the profile's checkpoint procedure is {table['procedure']}"
        return said if wanted and not table[wanted] else None
    return why


TESTS = (
    SuiteTest("mlperf_v2", "MLPerf Storage v2.0 checkpointing", "Per run: the writes, the page "
              "cache cleared, every checkpoint read back from the device and verified; MLPerf's "
              "figures (slowest rank) per run and over the runs.", section="mlperf",
              skip=_unless("mlperf-v2")),
    SuiteTest("passes", "checkpoint passes", "Mean seconds per checkpoint in every pass, and "
              "each checkpoint's own seconds.", section="passes",
              charts=("seconds per checkpoint",), skip=_unless("passes")),
    SuiteTest("restore", "checkpoint restore", "The last checkpoint read back, every chunk's "
              "CRC32C checked, every byte compared.", section="restore",
              skip=_unless("passes", "restore", "the profile does not restore")),
    SuiteTest("torch_baseline", "torch baseline", "torch.save (+ fsync) and torch.load of the "
              "same tensors on the same target.", section="baseline",
              skip=_unless("passes", "baseline", "the profile has no torch baseline")),
)


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one workload run (its module's `outcome`): the rank processes
    started, the checkpoints written and read back, the torch baseline."""
    if not declares(TESTS, test) or table.get("read_only"):
        return []
    plan = plan_of(table)
    processes = table["ranks"] or len(plan.ranks)
    one = sum(r.nbytes for r in plan.ranks[:processes])
    start = RANK_START_CPU_S
    if table["procedure"] == "mlperf-v2":
        per_pass = table["per_pass"] or MLPERF_CHECKPOINTS
        written = read = table["runs"] * per_pass * one
    else:
        fits = int(table["utilisation"] * rates.room // one) if rates.room else 1
        per_pass = table["per_pass"] or max(1, fits)
        written = table["passes"] * per_pass * one
        read = one if table["restore"] and not table["write_only"] else 0
        if table["baseline"] and not table["write_only"]:
            torch_bytes = min(table["baseline_bytes"], max(r.nbytes for r in plan.ranks))
            written += torch_bytes * processes
            read += torch_bytes * processes
            start += TORCH_IMPORT_CPU_S
    return [Work("checkpoint run",
                 start * rates.cpu + written / rates.write_bw + read / rates.read_bw,
                 bytes_written=written, bytes_read=read, space=per_pass * one, repeated=True,
                 what=f"{per_pass} checkpoint(s) of {format_size(one)} ({table['model']}, "
                      f"{processes} rank(s))")]


FAMILY = Family(name=NAME, description="DLIO-style LLM checkpoint write, restore and torch.save",
                fields=FIELDS, metrics=METRICS, check=check_table, cells=cells, run=run,
                remove=remove, plan=_plan, filesystem=True, tests=TESTS,
                reads_from=lambda table: table.get("read_only"),
                fit=lambda table, room, need: {"scale": table["scale"] * room / need * FIT_MARGIN},
                flags=Flags(defaults=_defaults, keeps=True, explain=_plan_document,
                            shared_target=lambda: "RANK" in os.environ and
                            "WORLD_SIZE" in os.environ))

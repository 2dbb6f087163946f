"""GNN training from SSD (seeds 000/002): RGAT on an IGBH graph with a GIDS/BaM-style loader
and the DGL-style mmap baseline; accuracy of both, GIDS's speedup, its cache behaviour."""

from __future__ import annotations

from qual.workloads.base import FIT_MARGIN
from qual.family import Family, Rates, SuiteTest, Work, declares
from qual.workloads.gnn.igbh import FEATURE_DIM, SIZES
from qual.workloads.gnn.spec import FIELDS, LOADERS, METRICS, NAME, STAGES, cells, check_table
from qual.workloads.gnn.results import GnnOutcome, equal_memory, measurements
from qual.workloads.gnn.workload import (cache_pages, cpu_buffer_rows, dataset_of,
                                         feature_memory, open_loader, remove, run)

# the family's face to suites, tests and tooling; the rest stays in its modules
__all__ = ["FAMILY", "NAME", "METRICS", "FIELDS", "LOADERS", "STAGES", "run", "remove",
           "dataset_of", "cache_pages", "cpu_buffer_rows", "feature_memory", "open_loader",
           "measurements", "equal_memory", "GnnOutcome"]


# qual's reference host (2 cores, KVM), ci profile (IGBH tiny at 0.2, batch 512, fanouts 5,3,
# hidden 64, 2 heads): generating the synthetic IGBH and its feature store took 9 s of CPU for
# 110 k nodes, and an RGAT step through the GIDS loader 0.38 s
GENERATE_CPU_S_PER_NODE = 80e-6
STEP_CPU_S = 0.38
# the GIDS-style loader's own work per row gathered (cache look-ups, the CPU buffer, staging
# copies): ci on the reference host, 2026-12-07, 2.2 s of gather for 14 steps of 10,752 rows
GIDS_ROW_CPU_S = 15e-6
STEP_REFERENCE = 512 * (1 + 5 + 5 * 3) * 64 * 2  # seed nodes x sampled hops x hidden x heads
TESTS = (
    SuiteTest("accuracy", "GNN accuracy", "Validation accuracy of RGAT trained through each "
              "loader.", section="accuracy"),
    SuiteTest("speedup", "GNN speedup", "End-to-end seconds of the measured steps per loader, "
              "their stages, GIDS's speedup.", section="speedup", charts=("stage breakdown",)),
    SuiteTest("cache", "GNN cache", "GIDS's hit rate, the bandwidth it drew from the SSD, and "
              "each loader's delivered rate.", section="cache", charts=("GIDS cache",),
              skip=lambda table: None if "gids" in table["loaders"] else
              "the profile does not run the GIDS loader"),
)


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one run (its module's `outcome`): the synthetic IGBH and its
    feature store written, then each loader's training steps and validation batches; RGAT
    computes on the host's CPU, and the mmap baseline also waits for its page faults (reads
    at low depth: a quarter of the 4 KiB IOPS)."""
    if not declares(TESTS, test):
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
    batches = table["epochs"] * (table["warmup"] + table["steps"] + 1)
    checks = -(-int(0.2 * papers) // table["batch_size"])  # validated once a run
    read = 0
    for loader in table["loaders"]:
        gather = rows / (rates.iops_4k / 4) if loader == "mmap" else \
            rows * GIDS_ROW_CPU_S * rates.cpu
        seconds += step + gather
        read += rows * table["page_size"]
    return [Work("gnn dataset", made, bytes_written=written, space=written,
                 what=f"the IGBH {table['size']} features and their store"),
            Work("gnn training", batches * seconds, bytes_read=batches * read, repeated=True),
            Work("gnn validation", checks * seconds, bytes_read=checks * read)]


FAMILY = Family(name=NAME, description="GIDS/BaM-style GNN feature loading vs DGL mmap, RGAT on "
                "IGBH", fields=FIELDS, metrics=METRICS, check=check_table, cells=cells, run=run,
                remove=remove, plan=_plan, tests=TESTS,
                filesystem=True, measures_once=True, fit=lambda table, room, need: {
                    "scale": table["scale"] * room / need * FIT_MARGIN}
                if table["dataset"] == "synthetic" else {})

"""Vector database (MLPerf Storage v3.0's vector-database workload, its Rules §5) on DiskANN
itself, the engine under Milvus's DISKANN index: seeded clustered vectors, DiskANN's disk index
built on the drive (a Vamana graph, each node's vector and neighbours in 4 KiB sectors), then
searched by beams of dependent O_DIRECT sector reads, many queries in flight: QPS, latency
percentiles, recall@k against an exact search, and the drive's bytes per query, proven by its
counters. It works on files: on a raw namespace, on the filesystem qual makes there."""

from __future__ import annotations

import errno
import importlib.util
import math
import os

from qual.errors import BackendUnavailable
from qual.family import Family, Flags, Rates, Repetition, SuiteTest, Work, declares
from qual.targets import Target
from qual.workloads.base import FIT_MARGIN
from qual.workloads.vectordb import workload
from qual.workloads.vectordb.results import VectorDbOutcome
from qual.workloads.vectordb.spec import (FIELDS, METRICS, NAME, REFERENCE, cells, check_table,
                                          data_bytes, index_bytes, memory, node_bytes,
                                          pq_chunks, sectors_per_node, space)

def _missing(table: dict | None = None) -> str | None:
    """Why the family cannot run here: DiskANN's package is not installed (None: it is)."""
    if importlib.util.find_spec("diskannpy") is None:
        return "DiskANN's Python package diskannpy is not installed (scripts/setup installs it)"
    return None


TESTS = (
    SuiteTest("index_build", "vector database", "DiskANN's disk index built from the vectors on "
              "the drive: its time (durable), the bytes the drive wrote, its size.",
              section="build", skip=_missing),
    SuiteTest("search", "vector database", "Every search list swept with the profile's beam "
              "width and queries in flight: QPS, mean and p95/p99/p99.9 latency, recall@k "
              "against an exact search, the drive's bytes per query; the recall-versus-QPS "
              "curve.", section="search", charts=None, skip=_missing),
)


def run(target: Target, table: dict, *, seed: int = 1, progress=None,
        repetition: Repetition = Repetition()) -> VectorDbOutcome:
    """The run (its data from the table's data_seed: `seed` draws nothing here); the index
    built in a repeated run's first repetition only, and searched in each."""
    if _missing():
        raise BackendUnavailable(errno.ENOPKG, _missing(), target=target.spec)
    return VectorDbOutcome(workload.run(target, table, progress=progress, repetition=repetition),
                           target=target)


def explain(table: dict) -> tuple[dict, list[str]]:
    """`qual vectordb --plan`: the index's layout and what the run needs, nothing touched."""
    doc = {"vectors": table["vectors"], "dimensions": table["dimensions"],
           "node_bytes": node_bytes(table), "sectors_per_node": sectors_per_node(table),
           "disk_index_bytes": index_bytes(table), "vectors_bytes": data_bytes(table),
           "pq_bytes_per_vector": pq_chunks(table), "space_bytes": space(table),
           "memory_bytes": memory(table), "reference": REFERENCE}
    lines = [f"{table['vectors']:,} vectors x {table['dimensions']} float32 = "
             f"{data_bytes(table):,} B of vectors",
             f"a node: {table['dimensions']} x 4 B + 4 + {table['graph_degree']} neighbours x 4 "
             f"= {node_bytes(table):,} B, {sectors_per_node(table)} sector(s) of 4 KiB: disk "
             f"index {index_bytes(table):,} B",
             f"PQ code in memory: {pq_chunks(table)} B a vector, per searcher",
             f"room on the target at once: {space(table):,} B; host memory: {memory(table):,} B",
             f"{table['queries']:,} queries at each search list {table['search_lists']}, "
             f"{table['searchers']} in flight, beam width {table['beam_width']}"]
    return doc, lines


def _plan(table: dict, test: str, _param, rates: Rates) -> list[Work]:
    """The suite's tests share one run: the vectors written and the index built once (its
    graph's distance computations: about build_list x degree x dims per vector and pass), then
    in each repetition each search list's queries, whose hops read about L nodes' sectors
    each."""
    if not declares(TESTS, test):
        return []
    n, d = table["vectors"], table["dimensions"]
    written = data_bytes(table) + index_bytes(table)
    threads = table["build_threads"] or os.cpu_count() or 1
    # two passes of L x R distances a vector at ~10 GFLOP/s a core, and PQ's k-means (about
    # 3 s of the 3.7 s that 10,000 x 128 with 64 B of code took on the reference host)
    build_s = 3 + n * table["build_list"] * table["graph_degree"] * d * 4 / (1e10 * threads) \
        * rates.cpu
    per_query = [L * sectors_per_node(table) * 4096 for L in table["search_lists"]]
    read = table["queries"] * sum(per_query)
    search_s = sum(table["queries"] * L * sectors_per_node(table) / rates.iops_4k
                   for L in table["search_lists"])
    exact_s = table["recall_queries"] * n * d * 2e-10 * rates.cpu
    return [Work("vectordb index", written / rates.write_bw + build_s, bytes_written=written,
                 space=space(table), memory=memory(table),
                 what=f"the vectors and DiskANN's disk index ({n:,} x {d})"),
            Work("vectordb searches", search_s + exact_s + 2, bytes_read=read,  # searchers start
                 repeated=True, memory=memory(table))]


def _fit(table: dict, room: int, need: int) -> dict:
    """Fewer vectors, so the vectors and the index fit the room (--qual-fit)."""
    per = space({**table, "vectors": 1_000_000}) / 1_000_000
    vectors = math.floor(room * FIT_MARGIN / per)
    return {"vectors": vectors} if table["clusters"] <= vectors < table["vectors"] else {}


QUICK = {"vectors": 20_000, "dimensions": 128, "clusters": 64, "queries": 2000,
         "recall_queries": 200, "search_lists": [10, 20, 50, 100], "searchers": 2}


FAMILY = Family(name=NAME, description="MLPerf Storage v3.0 vector database on DiskANN: an "
                "index built on the drive, searched by beams of O_DIRECT reads",
                fields=FIELDS, metrics=METRICS, check=check_table, cells=cells, run=run,
                remove=workload.remove, plan=_plan, filesystem=True, fit=_fit,
                measures_once=True,
                flags=Flags(defaults=lambda given: QUICK, explain=explain), tests=TESTS)

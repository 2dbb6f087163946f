"""The vector-database family's spec (MLPerf Storage v3.0's vector database, its Rules §5; docs/
ARCHITECTURE.md §9): the fields of its profile table, its metrics, and the arithmetic of
DiskANN's disk index (how many bytes a node takes on the drive, how many bytes of PQ code each
vector keeps in memory) from which a plan says a build's room, memory and time before any I/O."""

from __future__ import annotations

import math

from qual.family import Field
from qual.measurement import Metric, Param, measurement_id

NAME = "vectordb"
REFERENCE = "diskannpy 0.7.0 (microsoft/DiskANN): build_disk_index, StaticDiskIndex"

SECTOR = 4096  # DiskANN lays its disk index out in sectors of this, read with O_DIRECT
MAX_PQ_CHUNKS = 512  # DiskANN's limit on PQ chunks (bytes of code per vector)
FLOAT = 4  # bytes per element: float32 vectors
PERCENTILES = (95.0, 99.0, 99.9)

_L, _PCT, _K = Param("search_list", "count"), Param("pct", "percentile"), Param("k", "count")
METRICS = {m.name: m for m in (
    Metric("vdb_qps", "queries", "higher", (_L,),
           "queries answered per second of wall clock, every searcher busy"),
    Metric("vdb_latency", "time", "lower", (_L, _PCT),
           "one query's search, handed to DiskANN to its answer, at a percentile"),
    Metric("vdb_latency_mean", "time", "lower", (_L,), "one query's search, the mean"),
    Metric("vdb_recall", "ratio", "higher", (_L, _K),
           "share of the exact k nearest neighbours (numpy, brute force) the search returned, "
           "over the recall sample"),
    Metric("vdb_read_per_query", "size", "lower", (_L,),
           "bytes the drive read per query (DiskANN's O_DIRECT sector reads), proven by its "
           "counters"),
    Metric("vdb_build_time", "time", "lower", (),
           "building the disk index from the vectors, durable (fsync) included"),
    Metric("vdb_build_written", "size", "higher", (),
           "bytes the drive wrote while the index was built, by its counters"),
    Metric("vdb_index_size", "size", "lower", (), "the disk index's files on the target"),
)}

FIELDS = (
    Field("vectors", "count", default=1_000_000, maximum=1_000_000_000,
          help="base vectors in the index (the release: 1M, or 10M)"),
    Field("dimensions", "count", default=1536, maximum=4096,
          help="elements per vector (float32; the release: 1536)"),
    Field("clusters", "count", default=1000, maximum=1_000_000,
          help="clusters the seeded vectors are drawn around (real embeddings cluster)"),
    Field("data_seed", "count", default=0, minimum=0, help="seed of the vectors and queries"),
    Field("graph_degree", "count", default=64, maximum=512,
          help="the Vamana graph's most neighbours per node (the release's max degree 64)"),
    Field("build_list", "count", default=100, maximum=10_000,
          help="the build's candidate list (DiskANN's build complexity)"),
    Field("pq_ratio", "ratio", default="12.5 %",
          help="PQ code kept in memory per vector, as a share of its raw bytes (Milvus "
               "DISKANN's PQCodeBudgetGBRatio; DiskANN caps it at 512 bytes and the dims)"),
    Field("build_memory", "size", default="8 GiB", minimum=1 << 26,
          help="memory the build may use (DiskANN builds in shards beyond it)"),
    Field("build_threads", "count", default=0, minimum=0, maximum=1024,
          help="threads of the build (0: every CPU)"),
    Field("queries", "count", default=10_000, help="queries searched at each search list"),
    Field("recall_queries", "count", default=1000,
          help="queries whose exact neighbours numpy finds by brute force, for recall"),
    Field("k", "count", default=10, maximum=1000, help="neighbours a query asks for"),
    Field("search_lists", "counts", default=[10, 20, 50, 100, 200], maximum=10_000,
          help="search list sizes swept (DiskANN's L; the release: 200): each a point of the "
               "recall-versus-QPS curve"),
    Field("beam_width", "count", default=4, maximum=128,
          help="sector reads a query issues at once per hop (DiskANN's W)"),
    Field("searchers", "count", default=8, maximum=256,
          help="queries in flight: searcher processes, each answering one query at a time"),
    Field("cache_nodes", "count", default=0, minimum=0,
          help="graph nodes DiskANN keeps in memory near the entry point (0: every hop reads "
               "the drive)"),
    Field("timeout", "duration", default="2 h",
          help="the longest a build or a search sweep may take before it is stopped"),
)


def check_table(table: dict) -> list[tuple[str, str]]:
    problems = []
    if table["k"] > min(table["search_lists"]):
        problems.append(("k", f"{table['k']} neighbours need a search list of at least as "
                         f"many; the smallest is {min(table['search_lists'])}"))
    if table["recall_queries"] > table["queries"]:
        problems.append(("recall_queries", f"{table['recall_queries']} is more than the "
                         f"{table['queries']} queries searched"))
    if table["clusters"] > table["vectors"]:
        problems.append(("clusters", f"{table['clusters']} clusters for {table['vectors']} "
                         "vectors"))
    if table["k"] >= table["vectors"]:
        problems.append(("k", f"{table['k']} neighbours of {table['vectors']} vectors"))
    if not 0 < table["pq_ratio"] <= 1:
        problems.append(("pq_ratio", "is a share of a vector's bytes: above 0, at most 100 %"))
    return problems


def node_bytes(table: dict) -> int:
    """A node of the disk index: its full vector, its neighbour count, its neighbours."""
    return table["dimensions"] * FLOAT + 4 + table["graph_degree"] * 4


def index_bytes(table: dict) -> int:
    """The disk index file: a metadata sector, then the nodes, several to a sector where they
    fit, else whole sectors each."""
    node = node_bytes(table)
    n = table["vectors"]
    per = SECTOR // node
    sectors = math.ceil(n / per) if per else n * math.ceil(node / SECTOR)
    return SECTOR + sectors * SECTOR


def sectors_per_node(table: dict) -> int:
    return max(1, math.ceil(node_bytes(table) / SECTOR))


def pq_chunks(table: dict) -> int:
    """Bytes of PQ code per vector: pq_ratio of its raw bytes, as DiskANN caps them."""
    raw = table["dimensions"] * FLOAT
    return max(1, min(int(table["pq_ratio"] * raw), table["dimensions"], MAX_PQ_CHUNKS))


def pq_budget_gb(table: dict) -> float:
    """The search memory budget (GB) DiskANN's build turns into exactly pq_chunks bytes a
    vector: it takes floor(budget / vectors) chunks, after keeping 0.25 GB for cached nodes
    from a budget over 1.25 GB (DiskANN's get_memory_budget)."""
    n = table["vectors"]
    budget = (pq_chunks(table) * n + n // 2) / 2**30
    return budget + 0.25 if budget > 1.0 else budget


def data_bytes(table: dict) -> int:
    """The vectors' file (DiskANN's .bin: two int32 counts, then the rows)."""
    return 8 + table["vectors"] * table["dimensions"] * FLOAT


def space(table: dict) -> int:
    """Room on the target at once: the vectors' file, the disk index, the PQ code and pivots,
    and the in-memory graph DiskANN writes while it builds (a tenth more for its headers)."""
    n = table["vectors"]
    graph = n * (table["graph_degree"] + 1) * 4
    pivots = 256 * table["dimensions"] * FLOAT
    return int(1.1 * (data_bytes(table) + index_bytes(table) + n * pq_chunks(table) + pivots
                      + graph))


def search_memory(table: dict) -> int:
    """Host memory of one searcher: the PQ code of every vector, its pivots, the cached nodes,
    and its own interpreter and scratch (64 MiB)."""
    return (table["vectors"] * pq_chunks(table) + 256 * table["dimensions"] * FLOAT
            + table["cache_nodes"] * node_bytes(table) + (64 << 20))


def memory(table: dict) -> int:
    """Host memory the run needs at once: the build's budget (or the vectors, where they are
    fewer), or every searcher's."""
    build = min(table["build_memory"], data_bytes(table) * 2) + (256 << 20)
    return max(build, table["searchers"] * search_memory(table))


def cells(table: dict) -> list[str]:
    out = ["vdb_build_time", "vdb_build_written", "vdb_index_size"]
    for L in table["search_lists"]:
        out += [measurement_id(METRICS["vdb_qps"], {"search_list": L}),
                measurement_id(METRICS["vdb_latency_mean"], {"search_list": L}),
                measurement_id(METRICS["vdb_recall"], {"search_list": L, "k": table["k"]}),
                measurement_id(METRICS["vdb_read_per_query"], {"search_list": L})]
        out += [measurement_id(METRICS["vdb_latency"], {"search_list": L, "pct": p})
                for p in PERCENTILES]
    return out

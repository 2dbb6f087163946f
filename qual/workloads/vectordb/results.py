"""A vector-database run's results as measurements (the build's time, writes and index size;
per search list QPS, latency, recall and the drive's bytes per query) and as the outcome the
command and the suite read."""

from __future__ import annotations

from qual.family import in_section
from qual.measurement import Measurement, measure
from qual.workloads.base import ResultOutcome
from qual.workloads.vectordb import charts
from qual.workloads.vectordb.spec import METRICS, NAME, PERCENTILES

BACKEND = "DiskANN (libaio)"  # DiskANN's own O_DIRECT sector reads, not qual's engine
SECTIONS = {"build": ("vdb_build_time", "vdb_build_written", "vdb_index_size"),
            "search": ("vdb_qps", "vdb_latency", "vdb_latency_mean", "vdb_recall",
                       "vdb_read_per_query")}


class VectorDbOutcome(ResultOutcome):
    def measurements(self, section: str | None = None) -> list[Measurement]:
        """All, or one section: build or search."""
        return in_section(self._all(), SECTIONS, section)

    def _all(self) -> list[Measurement]:
        r = self.result
        ctx = {"target": r["target"], "backend": BACKEND, "path": "O_DIRECT",
               "diskannpy": r["diskannpy"], "vectors": r["vectors"],
               "dimensions": r["dimensions"], "graph_degree": r["graph_degree"],
               "pq_chunks": r["pq_chunks"]}
        b, out = r["build"], []
        if b:  # built in this run (a repeated run's first repetition builds for every one)
            built = {**ctx, **b["truth"], "index_bytes": b["index_bytes"]}
            out += [measure(NAME, METRICS["vdb_build_time"], {}, b["seconds"], context=built),
                    measure(NAME, METRICS["vdb_build_written"], {}, b["written"] or 0,
                            context=built),
                    measure(NAME, METRICS["vdb_index_size"], {}, b["index_bytes"], context=ctx)]
        for s in r["searches"]:
            L = {"search_list": s["search_list"]}
            here = {**ctx, "searchers": r["searchers"], "beam_width": r["beam_width"],
                    "queries": r["queries"], "wall_s": s["wall_s"]}
            bins = s["latency_bins"]
            out += [measure(NAME, METRICS["vdb_qps"], L, s["qps"], context=here),
                    measure(NAME, METRICS["vdb_latency_mean"], L, s["latency_s"]["mean"],
                            context=here, samples=bins)]
            out += [measure(NAME, METRICS["vdb_latency"], {**L, "pct": p},
                            s["latency_s"][f"{p:g}"], context=here, samples=bins)
                    for p in PERCENTILES]
            out.append(measure(NAME, METRICS["vdb_recall"], {**L, "k": r["k"]}, s["recall"],
                               context={**here, "recall_queries": r["recall_queries"]}))
            out.append(measure(NAME, METRICS["vdb_read_per_query"], L, s["read_per_query"],
                               context={**here, **s["truth"], "read_bytes": s["read_bytes"],
                                        "device_read_bytes": s["device_read_bytes"]}))
        return out

    def charts(self) -> dict[str, bytes]:
        return {"vector search: recall against QPS": charts.recall_qps_chart(self.result)}

    def document(self) -> dict:
        r = self.result
        return {**{k: v for k, v in r.items() if k != "searches"},
                "searches": [{k: v for k, v in s.items() if k != "latency_bins"}
                             for s in r["searches"]]}

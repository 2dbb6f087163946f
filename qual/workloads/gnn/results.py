"""A GNN run's results as measurements (accuracy with its interval, GIDS's speedup at equal
memory, cache behaviour, stage times) and as the outcome the command and the suite read."""

from __future__ import annotations

from qual import honesty
from qual.units import format_quantity
from qual.family import in_section
from qual.workloads.base import ResultOutcome
from qual.measurement import Measurement, measure
from qual.workloads.gnn import charts
from qual.workloads.gnn.spec import LOADERS, METRICS, NAME


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
        if r["accuracy"] is not None:  # validated (the last repetition)
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


# the suite records these apart: whether the loaders delivered, how fast, the GIDS cache
SECTIONS = {"accuracy": ("gnn_accuracy",),
            "speedup": ("gnn_e2e_s", "gnn_stage_s", "gnn_speedup"),
            "cache": ("gnn_hit_rate", "gnn_ssd_bw", "gnn_effective_bw")}


class GnnOutcome(ResultOutcome):
    """What each loader measured (a dict, as `run` assembles it) and the protocol's views."""

    def measurements(self, section: str | None = None) -> list[Measurement]:
        return in_section(measurements(self.result, self.target), SECTIONS, section)

    def document(self) -> dict:
        loaders = self.result["loaders"]
        row = self.result["store"]["row_bytes"]
        doc = {"dataset": self.result["dataset"], "steps": next(iter(loaders.values()))["measured"],
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
        out = {"stage breakdown": charts.stage_chart(self.result)}
        if self.result["loaders"].get("gids", {}).get("cache"):
            out["GIDS cache"] = charts.cache_chart(self.result)
        return out

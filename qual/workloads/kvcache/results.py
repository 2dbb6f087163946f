"""A KV-cache run's results as measurements (storage latency of prefill writes and decode reads,
end-to-end latency per QoS class, queue wait, tokens per second, decode bytes read, hit rate per
tier) and as the outcome the command and the suite read."""

from __future__ import annotations

from qual.engine import LatencyHistogram
from qual.measurement import Measurement, measure
from qual.family import Outcome, in_section
from qual.workloads.kvcache import charts
from qual.workloads.kvcache.spec import METRICS, NAME, PERCENTILES


def _percentiles(hist: LatencyHistogram, pcts, metric, params: dict,
                 context: dict) -> list[Measurement]:
    """A latency's percentiles (seconds) read from its histogram, each with the histogram's
    bins (ns: count) as its samples; none where the run served nothing there."""
    if not hist.count:
        return []
    bins = hist.to_bins()
    return [measure(NAME, metric, {**params, "pct": p}, hist.percentile(p) / 1e9,
                    context=context, samples=bins) for p in pcts]


# the suite records these apart: the drive's figures, and what the users saw
SECTIONS = {"storage": ("kv_storage_lat", "kv_decode_bytes_read", "kv_hit_rate"),
            "service": ("kv_e2e_lat", "kv_queue_wait", "kv_tokens_per_s",
                        "kv_storage_tokens_per_s", "kv_max_users", "kv_peak_users")}


class KvCacheOutcome(Outcome):
    def __init__(self, result: dict, target: str):
        self.result, self.target = result, target

    def measurements(self, section: str | None = None) -> list[Measurement]:
        """All, or one section: storage (the drive's figures) or service (the users')."""
        return in_section(self._all(), SECTIONS, section)

    def _all(self) -> list[Measurement]:
        r = self.result
        lat = r["latency"]
        ctx = {"target": self.target, "model": r["model"], "backend": r["backend"],
               "path": "O_DIRECT", "bytes_per_token": r["bytes_per_token"]}
        out = []
        for op, truth in (("write", r["write_truth"]), ("read", r["read_truth"])):
            out += _percentiles(lat[op], PERCENTILES, METRICS["kv_storage_lat"], {"op": op},
                                {**ctx, **truth})
        for c in r["qos"]:
            out += _percentiles(lat["e2e"][c], PERCENTILES[1:], METRICS["kv_e2e_lat"],
                                {"class": c}, ctx)
        out += _percentiles(lat["wait"], PERCENTILES, METRICS["kv_queue_wait"], {}, ctx)
        out.append(measure(NAME, METRICS["kv_tokens_per_s"], {}, r["tokens"] / r["wall_s"],
                           context=ctx))
        if r["storage_s"]:
            out.append(measure(NAME, METRICS["kv_storage_tokens_per_s"], {},
                               r["tokens"] / r["storage_s"], context=ctx))
        out.append(measure(NAME, METRICS["kv_decode_bytes_read"], {}, r["read"],
                           context={**ctx, **r["read_truth"]}))
        total = sum(r["hits"].values())
        out += [measure(NAME, METRICS["kv_hit_rate"], {"tier": tier}, n / total, context=ctx)
                for tier, n in r["hits"].items() if total]
        if r["mode"] != "fixed":  # the search's answer, with every trial it ran
            found = {**ctx, "trials": r["trials"], "users_of_figures_above": r["users"]}
            if r["mode"] == "qos":
                out.append(measure(NAME, METRICS["kv_max_users"], {}, r["max_users"],
                                   context={**found, "failed_at": r["failed_at"],
                                            "targets": r["qos"]}))
            else:
                out.append(measure(NAME, METRICS["kv_peak_users"], {}, r["peak_users"],
                                   context=found))
        return out

    def charts(self) -> dict[str, bytes]:
        out = {"KV-cache latency per request": charts.latency_chart(self.result)}
        if self.result["mode"] != "fixed":
            out[f"KV-cache {self.result['mode']} search"] = charts.search_chart(self.result)
        return out

    def document(self) -> dict:
        r = self.result
        keys = ("mode", "model", "bytes_per_token", "backend", "users", "wall_s", "storage_s",
                "written", "read", "hits", "tokens", "tokens_per_s", "storage_tokens_per_s",
                "e2e", "qos", "device", "max_users", "failed_at", "peak_users", "trials")
        return {k: r[k] for k in keys if k in r} | {"requests": r["served"]}

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
        starved = [c for c in r["qos"] if not lat["e2e"][c].count]
        said = [f"class {c} served no request: the server serves the highest class that has "
                "arrived first, and the higher ones kept it busy (give think_time)"
                for c in starved]
        out += _percentiles(lat["wait"], PERCENTILES, METRICS["kv_queue_wait"], {}, ctx)
        out.append(measure(NAME, METRICS["kv_tokens_per_s"], {}, r["tokens"] / r["wall_s"],
                           context=ctx, caveats=said))
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


class ClosedOutcome(Outcome):
    """Several clients' trials (qual.workloads.kvcache.clients): the release's scored figures,
    under its names, with every client's and trial's figures and the rules qual departs from
    in their context."""

    def __init__(self, result: dict, target: str):
        self.result, self.target = result, target

    def measurements(self, section: str | None = None) -> list[Measurement]:
        if section == "service":
            return []
        r = self.result
        ctx = {"target": self.target, "backend": r["trials"][-1]["clients"][0]["backend"],
               "path": "O_DIRECT", "model": r["model"], "users_per_client": r["users"],
               "clients": r["clients"], "trials": len(r["trials"]), "seed": r["seed"],
               "mlperf_option": r["option"], "departures": r["departures"],
               "per_trial": [[{k: c[k] for k in ("client", "read", "written", "wall_s",
                                                  "storage_tokens_per_s", "entry_read_p95",
                                                  "entry_write_p95")}
                              for c in t["clients"]] for t in r["trials"]]}
        read = {**ctx, **r["trials"][-1]["read_truth"]}
        write = {**ctx, **r["trials"][-1]["write_truth"]}
        return [measure(NAME, METRICS["kv_aggregate_read_bw"], {}, r["read_bw"], context=read),
                measure(NAME, METRICS["kv_aggregate_write_bw"], {}, r["write_bw"],
                        context=write),
                measure(NAME, METRICS["kv_aggregate_storage_tokens_per_s"], {},
                        r["storage_tokens_per_s"], context=ctx),
                measure(NAME, METRICS["kv_worst_client_read_p95"], {}, r["worst_read_p95"],
                        context=read),
                measure(NAME, METRICS["kv_worst_client_write_p95"], {}, r["worst_write_p95"],
                        context=write)]

    def document(self) -> dict:
        return self.result

    def lines(self) -> list[str]:
        r = self.result
        what = (f"MLPerf Storage v3.0 KV cache, closed option {r['option']} "
                f"({r['option_name']})" if r["option"] else "KV cache, several clients")
        out = [f"{what}: {r['model']}, {r['users']} users per client x {r['clients']} "
               f"client(s), {len(r['trials'])} trial(s) of {r['duration']:g} s, seed "
               f"{r['seed']}"]
        out += [f"{m.id} = {m.shown()}" for m in self.measurements()]
        out += [f"departs from the release: {d}" for d in r["departures"]]
        return out

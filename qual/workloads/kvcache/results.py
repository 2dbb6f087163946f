"""A KV-cache run's results as measurements (storage latency of prefill writes and decode reads,
end-to-end latency per QoS class, queue wait, tokens per second, decode bytes read, hit rate per
tier) and as the outcome the command and the suite read."""

from __future__ import annotations

from qual.engine import LatencyHistogram
from qual.measurement import Measurement, measure
from qual.family import Outcome, in_section
from qual.workloads.kvcache import charts
from qual.workloads.kvcache.spec import METRICS, NAME, OVERWRITTEN_SAID, PERCENTILES


def said(r: dict) -> list[str]:
    """What limits a run's figures, said beside them and in its lines: a store too small for
    what the users hold at once (run with accept_misses), decode reads the ring left nothing
    for above OVERWRITTEN_SAID, a QoS class that was served nothing."""
    out = [r["store_short"]] if r.get("store_short") else []
    if r["overwritten_share"] > OVERWRITTEN_SAID:
        out.append(f"{r['overwritten_share']:.0%} of decode's reads found their entry "
                   "overwritten by the ring and read nothing: the figures are of a store that "
                   "did not hold what it served")
    out += [f"class {c} served no request: the server serves the highest class that has "
            "arrived first, and the higher ones kept it busy"
            for c, n in r["served_by_class"].items() if not n]
    return out


def mlperf(r: dict) -> dict:
    """The release's scored figures under its own names and units (GiB/s as its `_gbps`)."""
    return {"storage_throughput_tokens_per_sec": r["storage_tokens_per_s"],
            "avg_throughput_tokens_per_sec": r["tokens_per_s"],
            "tier_storage_read_bandwidth_gbps": r["read_bw"] / 2**30,
            "tier_storage_write_bandwidth_gbps": r["write_bw"] / 2**30}


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
SECTIONS = {"storage": ("kv_storage_lat", "kv_decode_bytes_read", "kv_hit_rate", "kv_tier_bw",
                        "kv_overwritten_reads"),
            "service": ("kv_e2e_lat", "kv_queue_wait", "kv_requests_served", "kv_tokens_per_s",
                        "kv_storage_tokens_per_s", "kv_drive_busy_tokens_per_s", "kv_max_users",
                        "kv_peak_users")}


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
        caveats = said(r)
        out += _percentiles(lat["wait"], PERCENTILES, METRICS["kv_queue_wait"], {}, ctx)
        out += [measure(NAME, METRICS["kv_requests_served"], {"class": c}, n, context=ctx)
                for c, n in r["served_by_class"].items()]
        timed = {**ctx, "duration_s": r["wall_s"], "request_io_s": r["request_io_s"]}
        out.append(measure(NAME, METRICS["kv_tokens_per_s"], {}, r["tokens_per_s"],
                           context=timed, caveats=caveats))
        if r["request_io_s"]:
            out.append(measure(NAME, METRICS["kv_storage_tokens_per_s"], {},
                               r["storage_tokens_per_s"], context=timed, caveats=caveats))
        if r["storage_s"]:
            out.append(measure(NAME, METRICS["kv_drive_busy_tokens_per_s"], {},
                               r["drive_busy_tokens_per_s"],
                               context={**ctx, "storage_s": r["storage_s"]}))
        out += [measure(NAME, METRICS["kv_tier_bw"], {"op": op}, r[f"{op}_bw"],
                        context={**timed, **truth}, caveats=caveats)
                for op, truth in (("read", r["read_truth"]), ("write", r["write_truth"]))]
        out.append(measure(NAME, METRICS["kv_overwritten_reads"], {}, r["overwritten_share"],
                           context={**ctx, "misses": r["misses"]}))
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
                "request_io_s", "written", "read", "hits", "misses", "overwritten_share",
                "tokens", "tokens_per_s", "storage_tokens_per_s", "drive_busy_tokens_per_s",
                "read_bw", "write_bw", "served_by_class", "e2e", "qos", "device", "max_users",
                "failed_at", "peak_users", "trials")
        return {k: r[k] for k in keys if k in r} | {"requests": r["served"], "mlperf": mlperf(r),
                                                    "caveats": said(r)}

    def lines(self) -> list[str]:
        return super().lines() + [f"CAVEAT: {c}" for c in said(self.result)]


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
                                                  "request_io_s", "tokens",
                                                  "storage_tokens_per_s", "entry_read_p95",
                                                  "entry_write_p95")}
                              for c in t["clients"]] for t in r["trials"]]}
        read = {**ctx, **r["trials"][-1]["read_truth"]}
        write = {**ctx, **r["trials"][-1]["write_truth"]}
        caveats = said(r)
        return [measure(NAME, METRICS["kv_aggregate_read_bw"], {}, r["read_bw"], context=read,
                        caveats=caveats),
                measure(NAME, METRICS["kv_aggregate_write_bw"], {}, r["write_bw"],
                        context=write, caveats=caveats),
                measure(NAME, METRICS["kv_aggregate_avg_tokens_per_s"], {}, r["tokens_per_s"],
                        context=ctx, caveats=caveats),
                measure(NAME, METRICS["kv_aggregate_storage_tokens_per_s"], {},
                        r["storage_tokens_per_s"], context=ctx, caveats=caveats),
                measure(NAME, METRICS["kv_overwritten_reads"], {}, r["overwritten_share"],
                        context=ctx),
                *(measure(NAME, METRICS["kv_requests_served"], {"class": c}, n, context=ctx)
                  for c, n in r["served_by_class"].items()),
                measure(NAME, METRICS["kv_worst_client_read_p95"], {}, r["worst_read_p95"],
                        context=read),
                measure(NAME, METRICS["kv_worst_client_write_p95"], {}, r["worst_write_p95"],
                        context=write)]

    def document(self) -> dict:
        return {**self.result, "mlperf": mlperf(self.result), "caveats": said(self.result)}

    def lines(self) -> list[str]:
        r = self.result
        what = (f"MLPerf Storage v3.0 KV cache, closed option {r['option']} "
                f"({r['option_name']})" if r["option"] else "KV cache, several clients")
        out = [f"{what}: {r['model']}, {r['users']} users per client x {r['clients']} "
               f"client(s), {len(r['trials'])} trial(s) of {r['duration']:g} s, seed "
               f"{r['seed']}"]
        out += [f"{m.id} = {m.shown()}" for m in self.measurements()]
        out += [f"departs from the release: {d}" for d in r["departures"]]
        out += [f"CAVEAT: {c}" for c in said(r)]
        return out

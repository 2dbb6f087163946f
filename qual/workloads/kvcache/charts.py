"""The KV-cache family's charts: what the users saw and what the drive took, per request; and
a search's trials."""

from __future__ import annotations

import numpy as np

from qual.charts import png, subplots


def _cdf(ax, hist, **kw) -> None:
    """A latency histogram as the share of requests at or under each bucket's value."""
    bins = sorted(hist.to_bins().items())
    xs = np.array([ns for ns, _ in bins]) / 1e6
    ax.step(xs, np.cumsum([n for _, n in bins]) / hist.count * 100, where="post", **kw)


def latency_chart(result: dict) -> bytes:
    """Each request's end-to-end latency by QoS class, with the class's p95 target, and the
    drive's write and read latency, as distributions (share of requests at or under)."""
    lat = result["latency"]
    fig, (ax, bx) = subplots(1, 2, figsize=(8.4, 3.6))
    from matplotlib.ticker import NullFormatter  # loaded by subplots, as qual.charts loads it

    for c, (p95, _) in result["qos"].items():
        if lat["e2e"][c].count:
            line, = ax.plot([], [])
            _cdf(ax, lat["e2e"][c], color=line.get_color(), label=c)
            ax.axvline(p95 * 1e3, color=line.get_color(), linestyle="dashed", alpha=0.6)
    ax.set_title("end to end, by class (dashed: p95 target)")
    for op in ("write", "read"):
        if lat[op].count:
            _cdf(bx, lat[op], label=f"prefill {op}" if op == "write" else f"decode {op}")
    bx.set_title(f"on the drive ({result['backend']}, O_DIRECT)")
    for a in (ax, bx):
        a.set_xscale("log")
        a.xaxis.set_minor_formatter(NullFormatter())
        a.set_xlabel("latency (ms)")
        a.set_ylabel("requests at or under (%)")
        a.grid(True, alpha=0.3)
        if a.lines:
            a.legend()
    fig.suptitle(f"{result['model']}: {result['users']} users, {result['served']:,} requests")
    return png(fig)


def search_chart(result: dict) -> bytes:
    """A search's trials: tokens per second and each class's p95 end-to-end latency against
    the users, the answer marked."""
    trials = result["trials"]
    users = [t["users"] for t in trials]
    fig, (ax, bx) = subplots(1, 2, figsize=(8.4, 3.6))
    ax.plot(users, [t["tokens_per_s"] for t in trials], "o-", label="wall clock")
    ax.plot(users, [t["storage_tokens_per_s"] for t in trials], "s--", label="storage time")
    ax.set_ylabel("tokens per second")
    for c in result["qos"]:
        pts = [(t["users"], t["e2e"][c][0] * 1e3) for t in trials if c in t["e2e"]]
        if pts:
            bx.plot(*zip(*pts), "o-", label=f"{c} p95")
    bx.set_ylabel("end-to-end latency (ms)")
    answer = result.get("max_users", result.get("peak_users"))
    for a in (ax, bx):
        a.set_xlabel("users")
        if answer:
            a.axvline(answer, color="k", linestyle="dotted", label=f"answer: {answer}")
        a.grid(True, alpha=0.3)
        a.legend()
    fig.suptitle(f"{result['mode']} search: {len(trials)} trials")
    return png(fig)

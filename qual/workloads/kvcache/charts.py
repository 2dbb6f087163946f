"""The KV-cache family's charts: what the users saw and what the drive took, per request; and
a search's trials."""

from __future__ import annotations

import numpy as np

from qual.charts import png, subplots


def _cdf(ax, values: list[float], **kw) -> None:
    xs = np.sort(np.asarray(values)) * 1e3
    ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs) * 100, **kw)


def latency_chart(result: dict) -> bytes:
    """Each request's end-to-end latency by QoS class, with the class's p95 target, and the
    drive's write and read latency, as distributions (share of requests at or under)."""
    reqs = result["requests"]
    fig, (ax, bx) = subplots(1, 2, figsize=(8.4, 3.6))
    from matplotlib.ticker import NullFormatter  # loaded by subplots, as qual.charts loads it

    for c, (p95, _) in result["qos"].items():
        e2e = [q["done"] - q["arrival"] for q in reqs if q["qos"] == c]
        if e2e:
            line, = ax.plot([], [])
            _cdf(ax, e2e, color=line.get_color(), label=c)
            ax.axvline(p95 * 1e3, color=line.get_color(), linestyle="dashed", alpha=0.6)
    ax.set_title("end to end, by class (dashed: p95 target)")
    for op, key in (("write", "write_s"), ("read", "read_s")):
        lat = [q[key] for q in reqs if q[key] is not None]
        if lat:
            _cdf(bx, lat, label=f"prefill {op}" if op == "write" else f"decode {op}")
    bx.set_title(f"on the drive ({result['backend']}, O_DIRECT)")
    for a in (ax, bx):
        a.set_xscale("log")
        a.xaxis.set_minor_formatter(NullFormatter())
        a.set_xlabel("latency (ms)")
        a.set_ylabel("requests at or under (%)")
        a.grid(True, alpha=0.3)
        if a.lines:
            a.legend()
    fig.suptitle(f"{result['model']}: {result['users']} users, {len(reqs)} requests")
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

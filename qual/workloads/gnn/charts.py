"""The GNN family's charts: stage breakdown per loader, GIDS's cache."""

from __future__ import annotations

from qual.charts import png, subplots


def stage_chart(result: dict) -> bytes:
    """Seconds of the measured steps per stage, one bar per loader, and GIDS's hit rate."""
    loaders = list(result["loaders"])
    stages = ("sample", "gather", "transfer", "train")
    fig, ax = subplots(figsize=(6.4, 3.8))
    bottom = [0.0] * len(loaders)
    for stage in stages:
        values = [result["loaders"][ld]["stages"][stage] for ld in loaders]
        ax.bar(loaders, values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    steps = result["loaders"][loaders[0]]["measured"]
    ax.set_ylabel(f"seconds for {steps} training steps")
    ax.set_xlabel("feature loader")
    cache = result["loaders"].get("gids", {}).get("cache")
    rate = f"; GIDS hit rate {cache['hit_rate'] * 100:.0f} %" if cache else ""
    ax.set_title(f"IGBH {result['dataset']['size']}: stage breakdown{rate}")
    ax.legend()
    return png(fig)


def cache_chart(result: dict) -> bytes:
    """Where GIDS's feature requests were served from (CPU buffer, page cache, SSD), and its
    page reads; the hit rate in the title."""
    c = result["loaders"]["gids"]["cache"]
    fig, (ax, bx) = subplots(1, 2, figsize=(7.6, 3.6))
    served = {"CPU buffer": c["cpu_hits"], "page cache": c["hits"], "SSD (miss)": c["misses"]}
    ax.bar(list(served), list(served.values()), color=["tab:green", "tab:blue", "tab:red"])
    ax.set_ylabel("feature requests (count)")
    ax.set_title(f"served from; hit rate {c['hit_rate'] * 100:.0f} %")
    bx.bar(["SSD page reads"], [c["reads"]], color="tab:red")
    bx.set_ylabel("reads (count)")
    bx.set_title(f"{c['read_bytes'] / 2**20:.0f} MiB read from the SSD")
    for a in (ax, bx):
        a.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"IGBH {result['dataset']['size']}: GIDS cache over the measured steps")
    return png(fig)

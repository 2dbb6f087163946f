"""The bandwidth family's charts: the matrix as heatmaps, the latency percentile curve."""

from __future__ import annotations

import math

from qual import units
from qual.charts import png, subplots


def heatmaps(measurements: list[dict], title: str) -> bytes:
    """One heatmap per pattern: block size (rows) x queue depth (columns) -> GiB/s."""
    cells = [m for m in measurements if m["metric"].endswith("_bw")]
    patterns = sorted({m["metric"][:-3] for m in cells})
    fig, axes = subplots(1, max(1, len(patterns)), figsize=(4.2 * max(1, len(patterns)), 3.6),
                             squeeze=False)
    for ax, pattern in zip(axes[0], patterns):
        mine = [m for m in cells if m["metric"] == f"{pattern}_bw"]
        sizes = sorted({m["params"]["bs"] for m in mine}, reverse=True)
        depths = sorted({m["params"]["qd"] for m in mine})
        grid = [[math.nan] * len(depths) for _ in sizes]
        for m in mine:
            grid[sizes.index(m["params"]["bs"])][depths.index(m["params"]["qd"])] = \
                units.convert(m["value"], "GiB/s")
        im = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(depths)), [str(d) for d in depths])
        ax.set_yticks(range(len(sizes)), [units.format_quantity(s, "KiB").replace(" KiB", "K")
                                          for s in sizes])
        ax.set_xlabel("queue depth (I/Os in flight)")
        ax.set_ylabel("block size (KiB)")
        ax.set_title(pattern.replace("_", " "))
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w", fontsize=8)
        fig.colorbar(im, ax=ax, label="bandwidth (GiB/s)")
    fig.suptitle(title)
    return png(fig)


def latency_percentile_curve(bins: dict, title: str) -> bytes:
    """Completion latency (us, log) against percentile, from histogram bins {ns: count}."""
    points = sorted((int(k), int(v)) for k, v in bins.items())
    total = sum(c for _, c in points)
    xs, ys, seen = [], [], 0
    for value, count in points:
        seen += count
        xs.append(100.0 * seen / total)
        ys.append(value / 1e3)
    fig, ax = subplots(figsize=(6.4, 3.8))
    # percentile axis stretched toward the tail: plot against -log10(1 - p)
    tail = [-math.log10(max(1e-7, 1 - x / 100)) for x in xs]
    ax.step(tail, ys, where="post")
    ticks = [50, 90, 99, 99.9, 99.99, 99.999]
    ax.set_xticks([-math.log10(1 - t / 100) for t in ticks], [f"{t:g}" for t in ticks])
    ax.set_yscale("log")
    ax.set_xlabel("percentile (%)")
    ax.set_ylabel("completion latency (us)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return png(fig)

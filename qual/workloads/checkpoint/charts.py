"""The checkpoint family's chart: seconds per checkpoint, pass by pass."""

from __future__ import annotations

from qual.charts import png, subplots


def seconds_chart(result: dict) -> bytes:
    """Seconds per checkpoint, in the order written, one colour per pass with its mean."""
    fig, ax = subplots(figsize=(6.4, 3.8))
    n = 0
    for p in range(1, result["passes"] + 1):
        mine = [c["seconds"] for c in result["checkpoints"] if c["pass"] == p]
        xs = list(range(n + 1, n + len(mine) + 1))
        ax.plot(xs, mine, "o-", label=f"pass {p}")
        if mine:
            ax.hlines(sum(mine) / len(mine), xs[0] - 0.3, xs[-1] + 0.3, linestyles="dashed")
        n += len(mine)
    size = result["checkpoints"][0]["bytes"] / 1e9 if result["checkpoints"] else 0
    ax.set_xlabel("checkpoint (in the order written)")
    ax.set_ylabel("seconds per checkpoint (barrier to commit)")
    ax.set_title(f"{result['plan']['model']} {size:.3g} GB checkpoints; dashed: pass mean")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(True, alpha=0.3)
    return png(fig)

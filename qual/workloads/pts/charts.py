"""The PTS report's figures: the IOPS surface (read share x block size), each test's tracking
variable by round with its steady-state window, and write saturation's IOPS against bytes
written."""

from __future__ import annotations

from qual import units
from qual.charts import png, pyplot, subplots
from qual.measurement import format_block


def iops_surface(rows: list[dict]) -> bytes:
    """3-D bars of IOPS over read share and block size, as PTS reports show the IOPS test."""
    pyplot()
    mixes = sorted({r["rwmixread"] for r in rows}, reverse=True)
    sizes = sorted({r["bs"] for r in rows})
    fig = pyplot().figure(figsize=(7.5, 5.5), layout="constrained")
    ax = fig.add_subplot(projection="3d")
    for r in rows:
        x, y = mixes.index(r["rwmixread"]), sizes.index(r["bs"])
        ax.bar3d(x, y, 0, 0.6, 0.6, r["iops"], shade=True)
    ax.set_xticks(range(len(mixes)), [f"{m}/{100 - m}" for m in mixes])
    ax.set_yticks(range(len(sizes)), [format_block(s) for s in sizes])
    ax.set_xlabel("read/write mix (%)")
    ax.set_ylabel("block size (bytes)")
    ax.set_zlabel("IOPS (I/O per s)")
    ax.set_title("PTS IOPS test: steady-state window means")
    return png(fig)


def steady_state(sections: dict) -> bytes:
    """Each test's tracking variable by round, its window marked."""
    tests = [(t, s["steady_state"]) for t, s in sections.items() if s.get("steady_state")]
    fig, axes = subplots(1, len(tests), figsize=(4.2 * len(tests), 3.4), squeeze=False)
    for ax, (test, ss) in zip(axes[0], tests):
        unit = {"throughput": "MiB/s", "latency": "us"}.get(test, "IOPS")
        values = [units.convert(v, unit) for v in ss["values"]]
        rounds = range(1, len(values) + 1)
        ax.plot(rounds, values, marker="o")
        lo, hi = ss["window_rounds"]
        ax.axvspan(lo - 0.5, hi + 0.5, alpha=0.15, color="tab:green" if ss["reached"] else "red",
                   label="window" + ("" if ss["reached"] else " (not steady)"))
        ax.set_xlabel("round")
        ax.set_ylabel(f"{ss['tracking']} ({unit})")
        ax.set_title(test)
        ax.legend(fontsize=8)
    fig.suptitle("PTS steady state")
    return png(fig)


def wsat(section: dict) -> bytes:
    fig, ax = subplots(figsize=(6.5, 3.6))
    gib = [r["bytes_written"] / (1 << 30) for r in section["rounds"]]
    ax.plot(gib, [r["iops"] for r in section["rounds"]], marker=".")
    ax.set_xlabel("bytes written (GiB)")
    ax.set_ylabel("4K random-write IOPS (I/O per s)")
    ax.set_title(f"PTS write saturation: {section['multiple']:.1f}x the region written")
    return png(fig)


def all_charts(sections: dict) -> dict[str, bytes]:
    out = {}
    if sections.get("iops", {}).get("table"):
        out["PTS IOPS surface"] = iops_surface(sections["iops"]["table"])
    if any(s.get("steady_state") and t != "wsat" for t, s in sections.items()):
        out["PTS steady state"] = steady_state({t: s for t, s in sections.items() if t != "wsat"})
    if sections.get("wsat", {}).get("rounds"):
        out["PTS write saturation"] = wsat(sections["wsat"])
    return out

"""The vector database's charts: recall against queries per second over the search lists swept
(the curve a vector database is chosen by), and each search list's latency percentiles."""

from __future__ import annotations

from qual.charts import png, subplots


def recall_qps_chart(result: dict) -> bytes:
    """Each search list a point: recall@k across, QPS up; a longer list finds more neighbours
    and reads more of the drive per query."""
    s = result["searches"]
    fig, (ax, bx) = subplots(1, 2, figsize=(8.4, 3.6))
    recall = [x["recall"] * 100 for x in s]
    ax.plot(recall, [x["qps"] for x in s], marker="o")
    for x, r in zip(s, recall):
        ax.annotate(f"L={x['search_list']}", (r, x["qps"]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)
    ax.set_xlabel(f"recall@{result['k']} (%)")
    ax.set_ylabel("queries per second")
    ax.set_title(f"{result['vectors']:,} x {result['dimensions']}, {result['searchers']} in "
                 f"flight, beam {result['beam_width']}", fontsize=9)
    lists = [x["search_list"] for x in s]
    for p in ("mean", "95", "99", "99.9"):
        bx.plot(lists, [x["latency_s"][p] * 1e3 for x in s], marker=".",
                label=p if p == "mean" else f"p{p}")
    bx.set_xscale("log")
    bx.set_xlabel("search list (L)")
    bx.set_ylabel("latency (ms)")
    bx.set_title("a query's search (DiskANN, O_DIRECT)", fontsize=9)
    bx.legend(fontsize="x-small")
    for a in (ax, bx):
        a.grid(True, alpha=0.3)
    return png(fig)

"""A drive model's history (docs/store.md, "History"): how each figure moved over firmware
versions and time, from the store. A table (per figure and firmware: runs, drives, the median,
the first and last run) and a chart per figure (a point per drive and run, coloured by
firmware, each firmware's median as a line over its runs)."""

from __future__ import annotations

from qual import units
from qual.accept import DIMENSION
from qual.charts import png, subplots
from qual.report import table_lines
from qual.stats import median

HEADER = ("figure", "firmware", "runs", "drives", "median", "first run (UTC)", "last run (UTC)")


def by_figure(points: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """{figure: {firmware: points}}, firmwares in the order they were first run."""
    out: dict[str, dict[str, list[dict]]] = {}
    for p in points:  # the store gives them oldest first
        out.setdefault(p["measurement"], {}).setdefault(p["firmware"], []).append(p)
    return out


def rows(points: list[dict]) -> list[dict]:
    """One row per figure and firmware."""
    out = []
    for figure, firmwares in by_figure(points).items():
        for firmware, ps in firmwares.items():
            out.append({"figure": figure, "firmware": firmware, "unit": ps[0]["unit"],
                        "runs": len({p["run_id"] for p in ps}),
                        "drives": len({p["serial"] for p in ps}),
                        "median": median([p["value"] for p in ps]),
                        "first": ps[0]["started"].strftime("%Y-%m-%d %H:%M"),
                        "last": ps[-1]["started"].strftime("%Y-%m-%d %H:%M")})
    return out


def shown(value: float, unit: str) -> str:
    return units.format_quantity(value, dimension=DIMENSION.get(unit))


def lines(model: str, points: list[dict]) -> list[str]:
    table = [(r["figure"], r["firmware"] or "-", r["runs"], r["drives"],
              shown(r["median"], r["unit"]), r["first"], r["last"]) for r in rows(points)]
    return [f"qual history: model {model}: {len({p['run_id'] for p in points})} run(s) of "
            f"{len({p['serial'] for p in points})} drive(s)", *table_lines(table, header=HEADER)]


def chart(model: str, figure: str, firmwares: dict[str, list[dict]]) -> bytes:
    """One figure over time: each drive's runs as points, coloured by firmware; each
    firmware's median as a line from its first run to its last (a diamond at its middle),
    and a dashed line from each firmware's median to the next's."""
    unit = next(iter(firmwares.values()))[0]["unit"]
    dimension = DIMENSION.get(unit)
    values = [p["value"] for ps in firmwares.values() for p in ps]
    shown_unit = units.best_unit(median(values), dimension) if dimension else unit
    scale = units.convert(1.0, shown_unit) if dimension else 1.0
    fig, ax = subplots(figsize=(8, 4))
    medians = []
    for i, (firmware, ps) in enumerate(firmwares.items()):
        colour = f"C{i % 10}"
        ax.scatter([p["started"] for p in ps], [p["value"] * scale for p in ps], s=18,
                   color=colour, label=f"firmware {firmware or '-'} ({len(ps)} runs)")
        mid = median([p["value"] for p in ps]) * scale
        start, end = ps[0]["started"], ps[-1]["started"]
        ax.plot([start, end], [mid, mid], color=colour, linewidth=2)
        medians.append((start + (end - start) / 2, mid))
        ax.plot(*medians[-1], marker="D", markersize=7, color=colour, markeredgecolor="black")
    # the median line: from each firmware's median to the next one's
    ax.plot([t for t, _ in medians], [m for _, m in medians], color="grey", linestyle="--",
            linewidth=1, label="median of each firmware")
    ax.set_title(f"{model}: {figure}")
    ax.set_xlabel("run started (UTC)")
    ax.set_ylabel(f"{figure.split('[')[0]} ({shown_unit})")
    ax.legend(fontsize="small")
    fig.autofmt_xdate()
    return png(fig)

"""What people read: Allure metadata files, the terminal verdict table, and charts."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from qual import units

# Allure categories, matched in order (allurereport.org: categories file). A threshold or
# baseline violation is an AssertionError (status failed); an engine or target error is any
# other exception (status broken).
CATEGORIES = [
    {"name": "Threshold violations", "matchedStatuses": ["failed"],
     "messageRegex": r"(?s).*\] = .* (<|>) (min|max) .*"},
    {"name": "Baseline regressions", "matchedStatuses": ["failed"],
     "messageRegex": r"(?s).*worse than baseline.*"},
    {"name": "Unsafe target refused", "matchedStatuses": ["broken"],
     "traceRegex": r"(?s).*UnsafeTarget.*"},
    {"name": "Implausible measurements", "matchedStatuses": ["broken"],
     "traceRegex": r"(?s).*ImplausibleMeasurement.*"},
    {"name": "Engine errors", "matchedStatuses": ["broken"],
     "traceRegex": r"(?s).*(QualError|DeviceIoError|DataMismatch|NoSpace|TargetUnavailable|"
                   r"InvalidJob|BackendUnavailable|Cancelled).*"},
    {"name": "Infrastructure errors", "matchedStatuses": ["broken"]},
    {"name": "Not applicable", "matchedStatuses": ["skipped"]},
]


def environment(record: dict) -> dict[str, str]:
    """The drive, host, kernel, engine and profile, for Allure's environment widget."""
    ident = record["target"].get("identity") or {}
    host = record["host"]
    env = {
        "drive.model": ident.get("model"),
        "drive.serial": ident.get("serial"),
        "drive.firmware": ident.get("firmware"),
        "drive.device": ident.get("device"),
        "drive.link": " x".join(filter(None, [ident.get("link_speed"), ident.get("link_width")])),
        "target": record["target"].get("spec"),
        "target.kind": record["target"].get("kind"),
        "host": host.get("hostname"),
        "host.cpu": host.get("cpu"),
        "host.os": host.get("os"),
        "kernel": host.get("kernel"),
        "engine.backend": ", ".join(record["engine"].get("backends_used", [])) or "none",
        "engine.io_uring": record["engine"].get("io_uring"),
        "profile": f"{record['profile']['name']} ({record['profile']['digest']})",
        "qual": record.get("qual_version"),
    }
    return {k: str(v) for k, v in env.items() if v not in (None, "")}


def write_allure_metadata(alluredir: Path, record: dict) -> None:
    """environment.properties, executor.json and categories.json (written once, by the
    controller: the files are per run, not per worker)."""
    alluredir.mkdir(parents=True, exist_ok=True)
    lines = [f"{k}={_escape(v)}" for k, v in environment(record).items()]
    (alluredir / "environment.properties").write_text("\n".join(lines) + "\n")
    ident = record["target"].get("identity") or {}
    drive = " ".join(filter(None, [ident.get("model"), ident.get("firmware")])) or record["target"]["spec"]
    executor = {
        "name": "qual",
        "type": "qual",
        "buildName": f"qual {record.get('qual_version')} on {record['host'].get('hostname')}",
        "reportName": f"Qualification: {drive} / {record['profile']['name']}",
    }
    (alluredir / "executor.json").write_text(json.dumps(executor, indent=2))
    (alluredir / "categories.json").write_text(json.dumps(CATEGORIES, indent=2))


def _escape(value: str) -> str:
    """A value for a Java .properties file."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")


# ------------------------------------------------------------------ terminal summary


def verdict_rows(tests: list[dict]) -> list[tuple[str, ...]]:
    """(metric, parameters, measured, bound, margin, verdict) for every judged measurement."""
    rows = []
    for t in tests:
        for v in t.get("verdicts", []):
            metric, _, params = v["id"].partition("[")
            rows.append((metric, params.rstrip("]"), units.format_quantity(v["value"], v["unit"]),
                         f"{v['bound']} {units.format_quantity(v['limit'], v['unit'])}",
                         f"{v['margin'] * 100:+.1f} %" if math.isfinite(v["margin"]) else "n/a",
                         "PASS" if v["passed"] else "FAIL"))
        for r in t.get("regressions", []):
            metric, _, params = r["id"].partition("[")
            rows.append((metric, params.rstrip("]"), "", "baseline", f"{r['change'] * 100:+.1f} %",
                         "REGRESSED" if not r["passed"] else ("IMPROVED" if r["improved"] else "PASS")))
    return rows


def table_lines(rows: list[tuple[str, ...]]) -> list[str]:
    header = ("metric", "parameters", "measured", "bound", "margin", "verdict")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + \
           [fmt.format(*r) for r in rows]


# ------------------------------------------------------------------ charts


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _figure().close(fig)
    return buf.getvalue()


def bandwidth_heatmaps(measurements: list[dict], title: str) -> bytes:
    """One heatmap per pattern: block size (rows) x queue depth (columns) -> GiB/s."""
    plt = _figure()
    cells = [m for m in measurements if m["metric"].endswith("_bw")]
    patterns = sorted({m["metric"][:-3] for m in cells})
    fig, axes = plt.subplots(1, max(1, len(patterns)), figsize=(4.2 * max(1, len(patterns)), 3.6),
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
    return _png(fig)


def latency_percentile_curve(bins: dict, title: str) -> bytes:
    """Completion latency (us, log) against percentile, from histogram bins {ns: count}."""
    plt = _figure()
    points = sorted((int(k), int(v)) for k, v in bins.items())
    total = sum(c for _, c in points)
    xs, ys, seen = [], [], 0
    for value, count in points:
        seen += count
        xs.append(100.0 * seen / total)
        ys.append(value / 1e3)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
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
    return _png(fig)


def checkpoint_seconds_chart(result: dict) -> bytes:
    """Seconds per checkpoint, in the order written, one colour per pass with its mean."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
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
    return _png(fig)


def gnn_stage_chart(result: dict) -> bytes:
    """Seconds of the measured steps per stage, one bar per loader, and GIDS's hit rate."""
    plt = _figure()
    loaders = list(result["loaders"])
    stages = ("sample", "gather", "transfer", "train")
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
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
    return _png(fig)


def training_sweep_chart(result: dict, what: str) -> bytes:
    """Training ingestion against the accelerator count, one line per epochs value: AU (with
    the floor and the no-storage ceiling) when what is "au", else MiB/s read."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for epochs in sorted({r["epochs"] for r in result["runs"]}):
        runs = sorted((r for r in result["runs"] if r["epochs"] == epochs),
                      key=lambda r: r["accelerators"])
        xs = [r["accelerators"] for r in runs]
        ys = [r["au_mean"] * 100 if what == "au" else r["bw_bytes"] / 2**20 for r in runs]
        ax.plot(xs, ys, "o-", label=f"{epochs} epoch(s)")
    if what == "au":
        ax.axhline(result["au_floor"] * 100, color="r", linestyle="dashed", label="AU floor")
        calib = sorted(result["calibration"].items())
        if calib:
            ax.plot([n for n, _ in calib], [c["au_mean"] * 100 for _, c in calib], "k:",
                    label="no storage (ceiling)")
        ax.set_ylabel("accelerator utilisation (%)")
        ax.set_ylim(0, 105)
    else:
        ax.set_ylabel("sample bytes read (MiB/s)")
        ax.set_ylim(bottom=0)
    ax.set_xlabel("simulated accelerators")
    ax.set_title(f"{result['workload']['name']}: {result['dataset']['files']} files, "
                 f"mean {result['dataset']['mean_file_bytes'] / 2**20:.3g} MiB")
    ax.legend()
    ax.grid(True, alpha=0.3)
    return _png(fig)

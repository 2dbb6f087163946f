"""The training family's charts: AU and bandwidth against the accelerator count."""

from __future__ import annotations

from qual.charts import png, subplots


def sweep_chart(result: dict, what: str) -> bytes:
    """Training ingestion against the accelerator count, one line per epochs value: AU (with
    the floor and the no-storage ceiling) when what is "au", else MiB/s read."""
    fig, ax = subplots(figsize=(6.4, 3.8))
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
    return png(fig)

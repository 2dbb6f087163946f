"""The population report (`qual report --population`, docs/store.md): one self-contained HTML
page (its charts inline, no script, nothing fetched), so it opens from disk as a person opens
a report someone sent. The verdict and its reasons first; then per judged figure a strip plot
of the drives (each drive a point, outliers in red and named, the median and the max_spread
band); then the table of drives and the table of figures."""

from __future__ import annotations

import base64
import html
import math

from qual import units
from qual.accept import DIMENSION, Acceptance, Figure
from qual.charts import png, subplots

COLOURS = {"ACCEPT": "#1a7f37", "REJECT": "#cf222e", "INCOMPLETE": "#9a6700"}


def _plot_text(f: Figure) -> str:
    """What the strip plot shows, in words (its image's alt text): a reader without the image
    still learns which drive is the outlier."""
    return f"{f.id}: the drives' values" + "".join(f"; outlier {s}" for s in f.outliers)


def strip_plot(f: Figure) -> bytes:
    """The strip plot (strip_figure) as PNG bytes."""
    return png(strip_figure(f))


def strip_figure(f: Figure):
    """Each drive's value of one figure as a point on one axis; outliers red and labelled;
    the median as a line, and a band of +-max_spread around it as a guide to the eye."""
    dimension = DIMENSION.get(f.unit)
    shown_unit = units.best_unit(f.median, dimension) if dimension else f.unit
    scale = units.convert(1.0, shown_unit) if dimension else 1.0
    fig, ax = subplots(figsize=(7, 1.9))
    serials = sorted(f.values)
    for i, s in enumerate(serials):
        out = s in f.outliers
        y = (i % 5) * 0.12  # a little lift, so drives with equal values stay apart
        ax.scatter([f.values[s] * scale], [y], s=46 if out else 30,
                   color="#cf222e" if out else "#0969da", zorder=3)
        if out:
            ax.annotate(f"{s} (z {f.z[s]:+.1f})" if math.isfinite(f.z[s]) else s,
                        (f.values[s] * scale, y), textcoords="offset points", xytext=(0, 8),
                        ha="center", fontsize=8, color="#cf222e")
    mid = f.median * scale
    ax.axvline(mid, color="black", linewidth=1, label=f"median {f.shown(f.median)}")
    ax.axvspan(mid * (1 - f.max_spread), mid * (1 + f.max_spread), color="#8c959f", alpha=0.15,
               label=f"median +-{f.max_spread * 100:g} %")
    ax.set_yticks([])
    ax.set_ylim(-0.3, 0.9)
    ax.set_xlabel(f"{f.id} ({shown_unit})")
    ax.legend(fontsize="x-small", loc="upper right")
    return fig


def _table(header: tuple[str, ...], rows: list[tuple], marked: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    bad = ' class="bad"'
    body = "".join(
        f"<tr{bad if i in marked else ''}>" +
        "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
        for i, row in enumerate(rows))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(a: Acceptance) -> str:
    title = (f"Acceptance: {a.model}, firmware {a.firmware or '(none reported)'}, "
             f"profile {a.profile}")
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in a.reasons) or \
        "<li>every drive passed, every spread within its bound, no outlier</li>"
    outlying = {s for f in a.figures for s in f.outliers}
    failed = {d.serial for d in a.drives if d.verdict != "PASS"}
    worst = {d.serial: max(((abs(f.z[d.serial]), f.id) for f in a.figures if d.serial in f.z),
                           default=(0.0, "")) for d in a.drives}
    drives = _table(("drive", "run verdict", "started (UTC)", "rig", "run", "largest |z|", "on"),
                    [(d.serial, d.verdict, d.started, d.rig, d.run_id,
                      f"{worst[d.serial][0]:.1f}", worst[d.serial][1]) for d in a.drives],
                    {i for i, d in enumerate(a.drives) if d.serial in outlying | failed})
    figures = _table(("figure", "median", "MAD", "spread (CV)", "max_spread", "outliers"),
                     [(f.id, f.shown(f.median), f.shown(f.mad), f"{f.cv * 100:.1f} %",
                       f"{f.max_spread * 100:g} %", ", ".join(f.outliers) or "-")
                      for f in a.figures],
                     {i for i, f in enumerate(a.figures) if f.outliers or f.cv > f.max_spread})
    plots = "".join(
        f'<figure><img alt="{html.escape(_plot_text(f))}" src="data:image/png;'
        f'base64,{base64.b64encode(strip_plot(f)).decode()}"><figcaption>{html.escape(f.id)}'
        f"</figcaption></figure>" for f in a.figures)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #1f2328; }}
.verdict {{ font-size: 2em; font-weight: bold; color: #fff; padding: 0.3em 0.6em;
  display: inline-block; border-radius: 6px; background: {COLOURS.get(a.answer, '#57606a')}; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #d0d7de; padding: 0.3em 0.6em; text-align: left; }}
tr.bad td {{ background: #ffebe9; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="verdict" id="verdict">{a.answer}</p>
<p>{len(a.drives)} drive(s), the profile asks for at least {a.min_drives}: each drive's latest
run of profile {html.escape(a.profile)}.</p>
<ul id="reasons">{reasons}</ul>
<h2>Figures</h2>
{plots}
<h2>Drives</h2>
{drives}
<h2>Spread of each figure</h2>
{figures}
</body></html>
"""

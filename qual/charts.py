"""Figures as PNG bytes, readable by construction: constrained layout (no title, colour bar or
label overlaps another) and a unit on every axis label, which each chart supplies."""

from __future__ import annotations

import io


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(*args, **kw):
    """A figure whose titles, colour bars and labels are laid out not to overlap."""
    return pyplot().subplots(*args, layout="constrained", **kw)


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()



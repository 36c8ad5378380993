"""Figures: speed-vs-cost frontiers, parameter sensitivity, SPIDE's mapping, timelines, live
against predicted.

Every function builds and returns a :class:`matplotlib.figure.Figure` without pyplot (no
global state, no display needed), so tests and notebooks can inspect or show it and
:func:`save` writes it in the format its file name asks for.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from simlab.common.atomic import check_output, replace_file
from simlab.common.errors import SimlabError

FORMATS = (".png", ".svg", ".pdf")
DPI = 150


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as PNG, SVG or PDF, chosen by the suffix of ``path``."""
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise SimlabError(f"plot file must end in {', '.join(FORMATS)}; got {out.name!r}")
    check_output(out, "plot file", force=True)
    return replace_file(out, lambda tmp: fig.savefig(tmp, dpi=DPI, bbox_inches="tight"))

"""A picture of a latency fit: measured samples, their medians and the fitted curves.

One panel per fitted series (draft step, early-exit step, target forward, tree verification and
expansion, exit head; solo and co-running): seconds against k (or the exit layer, or the nodes), one colour
per measured context length; the draft-model step, which has no size, against the context length.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simlab.common.atomic import replace_file
from simlab.common.errors import SimlabError
from simlab.latency.fitted import FittedLatency, series_of, size_of
from simlab.trace.schema import with_defaults

FORMATS = (".png", ".svg", ".pdf")
PANELS_PER_ROW = 3
TITLES = {"draft": "draft step", "exit": "early-exit draft step", "target": "target forward",
          "target_tree": "target tree verification", "draft_tree": "draft tree expansion",
          "exit_head": "exit head (shadow tokens)", "target_step": "plain decoding step",
          "target_prefill": "target prefill", "draft_prefill": "draft prefill"}
X_LABELS = {"exit": "exit layer", "target": "k (new tokens)", "target_tree": "k (last token + nodes)",
            "draft_tree": "nodes", "exit_head": "rows of hidden state", "target_prefill": "k (prompt tokens)",
            "draft_prefill": "k (prompt tokens)", "target_step": "k (one token)"}


def plot_fit(model: FittedLatency, samples: pd.DataFrame, path: str | Path) -> Path:
    """Write the figure to ``path`` (PNG, SVG or PDF, by suffix)."""
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise SimlabError(f"--plot must end in {', '.join(FORMATS)}, got {out.name!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(model.surfaces)
    cols = min(len(keys), PANELS_PER_ROW)
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    samples = with_defaults("latency", samples)
    samples = samples[samples["batch"] == 1]  # the single-sequence fits; batched ones are in the table
    series, size = series_of(samples), size_of(samples)
    for ax, (name, corun) in zip(axes.flat, keys):
        surface = model.surfaces[(name, corun)]
        sel = (series == name) & (samples["corun"].astype(bool) == corun)
        g = samples[sel].assign(x=size[sel])
        q = surface.quality
        ax.set_title(f"{TITLES[name]}{' (co-run)' if corun else ''}: {surface.form}, R²={q.get('r2', float('nan')):.3f}",
                     fontsize=9)
        ax.set_ylabel("seconds")
        if name == "draft":
            ax.scatter(g["context_len"], g["seconds"], s=8, alpha=0.4, label="samples")
            grid = np.linspace(0, g["context_len"].max() * 1.25, 100)
            ax.plot(grid, surface(1, grid), color="k", label="fit")
            ax.set_xlabel("context length (tokens)")
        else:
            xs = np.arange(1, g["x"].max() + 1)
            for i, (ctx, gc) in enumerate(g.groupby("context_len")):
                colour = f"C{i}"
                ax.scatter(gc["x"], gc["seconds"], s=8, alpha=0.35, color=colour)
                med = gc.groupby("x")["seconds"].median()
                ax.plot(med.index, med.values, "o", color=colour, mfc="none", label=f"ctx {ctx} median")
                ax.plot(xs, [surface(x, ctx) for x in xs], "-", color=colour)
            ax.set_xlabel(X_LABELS[name])
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{model.name}: samples (dots), medians (circles), fit (lines)", fontsize=10)
    fig.tight_layout()
    try:
        return replace_file(out, lambda tmp: fig.savefig(tmp, dpi=120))
    finally:
        plt.close(fig)

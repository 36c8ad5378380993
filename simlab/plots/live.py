"""Measured against predicted: how well the simulator foretold a live decode.

Input: a table (CSV or Parquet) with one row per decoded prompt and, for a metric M, the
columns ``measured_M`` (what live decoding measured) and ``predicted_M`` (what the simulator
predicted for the same prompt, policy and hardware), e.g. ``measured_tokens_per_s`` and
``predicted_tokens_per_s``; optional ``policy`` (one series per policy) and ``prompt_id``.
Any M works (``speedup``, ``wall_time_s``, ``target_calls``, ...).

The plot puts predicted on x and measured on y with the line y = x (a perfect simulator puts
every point on it) and states the mean relative error |predicted − measured| / measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simlab.plots.table import require

MEASURED, PREDICTED = "measured_", "predicted_"


def relative_error(table: pd.DataFrame, metric: str) -> pd.Series:
    """|predicted − measured| / measured, per row."""
    measured = table[MEASURED + metric].astype(float)
    return (table[PREDICTED + metric].astype(float) - measured).abs() / measured


def live_figure(table: pd.DataFrame, metric: str = "tokens_per_s", title: str | None = None) -> Figure:
    m, p = MEASURED + metric, PREDICTED + metric
    require(table, (), f"a live results table with columns {m} and {p}", {m: ">= 0", p: ">= 0"})
    fig = Figure(figsize=(5.5, 5.5))
    ax = fig.add_subplot()
    groups = table.groupby("policy", sort=False) if "policy" in table.columns else [(None, table)]
    for name, rows in groups:
        error = relative_error(rows, metric).mean()
        label = f"{name} (mean error {error:.1%})" if name is not None else f"mean error {error:.1%}"
        ax.plot(rows[p], rows[m], "o", alpha=0.7, label=label)
    values = np.concatenate([table[m].to_numpy(float), table[p].to_numpy(float)])
    lo, hi = np.nanmin(values), np.nanmax(values)
    pad = 0.05 * (hi - lo or hi or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="black", linewidth=0.8, label="measured = predicted")
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_aspect("equal")
    ax.set_xlabel(f"predicted {metric} (simulator)")
    ax.set_ylabel(f"measured {metric} (live)")
    ax.set_title(title or f"Live vs simulated: {metric}, {len(table)} decodes, "
                          f"mean error {relative_error(table, metric).mean():.1%}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig

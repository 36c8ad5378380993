"""Speedup against cost for every configuration of a sweep, with the Pareto front.

One series per policy (its points joined in the order of the parameter it sweeps, when it
sweeps one), the front as a staircase (the best speedup any configuration reaches at or below
each cost), and vanilla SD at its best γ as a star at cost 1 — the reference every ``cost``
is relative to (SPIDE §4.1). Its speed and cost parity are drawn as a dashed red and a solid
black line, as in SPIDE Figure 6, so the quadrant above and left of them holds what is both
faster and cheaper than the best vanilla SD. Each series has its own colour and marker (a sweep
of every policy has more series than a colour cycle), the legend sits outside the axes, and each
Pareto-optimal point is named by its policy and the value of the parameter that policy sweeps,
and every other sd point by its γ; labels are placed so that none overlaps another
(:mod:`simlab.plots.labels`).
Configurations whose figures rest on a price past the measured latencies (sweep columns
``extrapolated_forwards``, ``extrapolated_rules``) are counted under the title, and marked with a
red x where only some are.
The oracle is labelled as what it is: the fastest *serial* schedule, which parallel policies
(PEARL, SPIDE) can beat, so it bounds serial policies only. The title names the topology.
"""

from __future__ import annotations

import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from simlab.plots.labels import place_labels
from simlab.plots.table import SWEEP_NUMBERS, require, series_of, setup_name
from simlab.sweep.frontier import pareto_front
from simlab.sweep.result_table import extrapolated_rows

REFERENCE_STYLE = {"color": "tab:red", "linestyle": "--", "linewidth": 1}
PARITY_STYLE = {"color": "black", "linestyle": "-", "linewidth": 0.8}
FRONT_LABEL = "Pareto front"
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
SERIES_LABELS = {"oracle": "oracle (serial-schedule bound)"}  # what a series is, where its name does not say
COLORS = colormaps["tab20"]  # its 10 dark colours (tab10's) first, then the 10 light ones
SYMBOLS = {"gamma": "γ", "tau": "τ"}  # parameters named as the papers write them
EXTRAPOLATED_LABEL = "priced past the measured latencies"


def frontier_figure(table: pd.DataFrame, title: str | None = None) -> Figure:
    require(table, ("policy", "label"), "a sweep table", SWEEP_NUMBERS)
    fig = Figure(figsize=(9.5, 5.5))
    ax = fig.add_subplot()
    names = {}  # row index -> how the point is named if it is labelled
    for i, (name, rows, param) in enumerate(series_of(table)):
        shown = SERIES_LABELS.get(name, name)
        symbol = SYMBOLS.get(param, param)
        label = f"{shown} ({symbol} {_span(rows[param])})" if param else shown
        ax.plot(rows["cost"], rows["speedup"], linestyle="-" if param else "none", marker=MARKERS[i % len(MARKERS)],
                color=COLORS(2 * i % 20 + i // 10 % 2), markersize=5, label=label)
        names.update({idx: f"{name} {symbol}={value:g}" if param else name for idx, value in
                      zip(rows.index, rows[param] if param else rows["policy"])})
    front = pareto_front(table)
    # The staircase runs on to the costliest configuration: beyond its last point the front's
    # best speedup is still to be had.
    xs = [*front["cost"], max(table["cost"].max(), front["cost"].iat[-1])] if len(front) else []
    ys = [*front["speedup"], front["speedup"].iat[-1]] if len(front) else []
    ax.step(xs, ys, where="post", color="black", linestyle=":", linewidth=1.5, label=FRONT_LABEL)
    ax.plot(front["cost"], front["speedup"], "o", markersize=10, markerfacecolor="none", markeredgecolor="black",
            label="Pareto-optimal")
    gamma, speed = int(table["reference_gamma"].iat[0]), float(table["reference_speedup"].iat[0])
    ax.axhline(speed, **REFERENCE_STYLE)
    ax.axvline(1.0, **PARITY_STYLE)
    ax.plot([1.0], [speed], "*", color="tab:red", markersize=14, markeredgecolor="black",
            label=f"sd at its best γ={gamma}")
    extrapolated = extrapolated_rows(table)  # named under the title; marked where it tells points apart
    hit = table[table["extrapolated_forwards"].fillna(0) > 0] if extrapolated else table.iloc[:0]
    if 0 < len(hit) < len(table):
        ax.plot(hit["cost"], hit["speedup"], "x", color="tab:red", markersize=9, label=EXTRAPOLATED_LABEL)
    ax.set_xlabel("cost (target calls / sd at its best γ)")
    ax.set_ylabel("speedup over autoregressive decoding")
    ax.set_title((title or f"Speed vs cost: {setup_name(table)}") + (f"\n{extrapolated}" if extrapolated else ""),
                 fontsize=None if not extrapolated else 9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    # Labels last, on the final layout: every Pareto-optimal point by name, every sd point by its γ.
    sd = table.index[(table["policy"] == "sd") & table["gamma"].notna()] if "gamma" in table.columns else []
    labelled = [(idx, names[idx]) for idx in front.index]
    labelled += [(idx, f"γ={table.at[idx, 'gamma']:g}") for idx in sd if idx not in front.index]
    place_labels(ax, [(table.at[idx, "cost"], table.at[idx, "speedup"], text) for idx, text in labelled])
    return fig


def _span(values: pd.Series) -> str:
    v = values.dropna()
    return f"{v.min():g}..{v.max():g}"


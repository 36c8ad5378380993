"""Confidence against acceptance, per SPIDE confidence bin (SPIDE Figure 3).

Left: the acceptance rate of the draft tokens in each of SPIDE's 20 confidence bins, beside
the bin's own confidence (a perfectly calibrated draft would match it), with the bin's token
count above its bar. Right: the share of
draft tokens in each bin. Input is a mapping table (:mod:`simlab.common.mapping`), measured on a
trace with :func:`trace_mapping` or read from ``calibrate/mapping/*.csv``.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simlab.common.mapping import MAPPING_COLUMNS, bin_label, mapping_table
from simlab.plots.table import require
from simlab.trace.io import Trace
from simlab.trace.replay import TraceReplay


def trace_mapping(trace: Trace, seed: int = 0) -> pd.DataFrame:
    """The mapping table of a trace: every drafted position (1..n-1) on the target's path,
    with the acceptance outcome replay uses (the exact match for greedy traces)."""
    prompts = TraceReplay(trace, seed).prompts
    conf = np.fromiter(chain.from_iterable(p.draft.confidence[1:] for p in prompts), float)
    accept = np.fromiter(chain.from_iterable(p.draft.accept[1:] for p in prompts), bool)
    return mapping_table(conf, accept)


def mapping_figure(table: pd.DataFrame, title: str = "Draft confidence and acceptance") -> Figure:
    require(table, MAPPING_COLUMNS, "a mapping table with columns conf_low, conf_high, count, accepted")
    count = table["count"].to_numpy(float)
    rate = np.divide(table["accepted"].to_numpy(float), count, out=np.full(len(count), np.nan), where=count > 0)
    share = count / count.sum()
    labels = [bin_label(lo, hi) for lo, hi in zip(table["conf_low"], table["conf_high"])]
    x = np.arange(len(table))
    fig = Figure(figsize=(12, 4.5))
    acc_ax, share_ax = fig.subplots(1, 2)
    bars = acc_ax.bar(x, rate, color="tab:blue", label="acceptance rate")
    # each bin's token count, so a rate from a handful of tokens is not read as one from thousands
    acc_ax.bar_label(bars, labels=[f"n={int(c):,}" for c in count], rotation=90, padding=2, fontsize=6)
    centre = (table["conf_low"] + table["conf_high"]).to_numpy(float) / 2
    acc_ax.plot(x, centre, "_", color="black", markersize=12, markeredgewidth=2, label="bin confidence")
    acc_ax.set_ylim(0, 1.3)  # room for the counts above full bars
    acc_ax.set_ylabel("acceptance rate")
    acc_ax.set_title("Acceptance rate per confidence bin")
    acc_ax.legend(fontsize=8, loc="upper left")
    share_ax.bar(x, 100 * share, color="tab:green")
    share_ax.set_ylabel("share of draft tokens (%)")
    share_ax.set_title(f"Draft tokens per confidence bin (n={int(count.sum()):,})")
    for ax in (acc_ax, share_ax):
        ax.set_xticks(x, labels, rotation=90, fontsize=7)
        ax.set_xlabel("draft confidence (top-1 probability)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig

"""Per-position acceptance as vLLM reports it: of all drafts (verifications that checked at least
one draft token), the share whose i-th token was accepted.

The rate is unconditional — a draft that stopped before position i counts as not accepted
there — so each curve falls with i, and its sum is the mean acceptance length minus one. Input
is a sweep table (``simlab sweep --out``) with its ``acceptance_per_position`` column; one line
per configuration, named by its label.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from simlab.common.errors import SimlabError
from simlab.plots.table import check_numbers, require, setup_name


def acceptance_figure(table: pd.DataFrame, title: str | None = None, policies: list[str] | None = None) -> Figure:
    """One line per configuration (of ``policies`` only, when given) that drafted anything."""
    require(table, ("policy", "label", "acceptance_per_position"), "a sweep table from `simlab sweep --out`")
    rows = table[table["policy"].isin(policies)] if policies else table
    rows = rows[rows["acceptance_per_position"].map(len) > 0]
    for i, rates in rows["acceptance_per_position"].items():  # shares of drafts: each in [0, 1]
        check_numbers(pd.Series(list(rates), index=[i] * len(rates), dtype=float), "acceptance_per_position", "in [0, 1]")
    if rows.empty:
        raise SimlabError("no configuration drafted anything" + (f" among policies {policies}" if policies else ""))
    fig = Figure(figsize=(8.5, 4.5))
    ax = fig.add_subplot()
    for label, rates in zip(rows["label"], rows["acceptance_per_position"]):
        rates = list(rates)
        ax.plot(range(1, len(rates) + 1), rates, marker="o", markersize=3, linewidth=1.2, label=label)
    ax.set_xlabel("draft position i (1: the first drafted token of a round)")
    ax.set_ylabel("drafts with token i accepted / drafts")
    ax.set_ylim(0, 1.02)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title or f"Per-position acceptance (vLLM's convention): {setup_name(table)}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig

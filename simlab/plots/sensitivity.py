"""Speed and cost against one parameter of one policy (SPIDE Figure 6, for τ).

Speedup on the left axis (blue), cost on the right (orange); the dashed red line is vanilla
SD's speedup at its best γ, the solid black line cost parity with it (cost = 1), exactly as
SPIDE draws its τ sensitivity. Any policy and parameter of a sweep table can be plotted; other
parameters that vary must be pinned (``where``) so that each value has one row.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from simlab.common.errors import SimlabError
from simlab.plots.frontier import PARITY_STYLE, REFERENCE_STYLE
from simlab.plots.table import SWEEP_NUMBERS, check_numbers, require, setup_name
from simlab.sweep.result_table import param_columns, varying

SPEED_COLOR, COST_COLOR = "tab:blue", "tab:orange"


def select(table: pd.DataFrame, param: str, policy: str | None, where: dict[str, Any]) -> tuple[str, pd.DataFrame]:
    """The policy's rows, filtered by ``where`` and sorted by ``param``; one row per value."""
    require(table, ("policy",), "a sweep table", {k: v for k, v in SWEEP_NUMBERS.items() if k != "reference_gamma"})
    if param not in table.columns:
        raise SimlabError(f"the sweep has no parameter {param!r}; its parameters are {param_columns(table)}")
    with_param = table[table[param].notna()]
    if policy is None:
        names = list(with_param["policy"].unique())
        if len(names) != 1:
            raise SimlabError(f"policies {names or 'none'} sweep {param!r}; pick one with --policy")
        policy = names[0]
    rows = with_param[with_param["policy"] == policy]
    for key, value in where.items():
        if key not in rows.columns:
            raise SimlabError(f"--where {key}=...: the sweep has no column {key!r}")
        rows = rows[rows[key] == value]
    if rows.empty:
        raise SimlabError(f"no rows of policy {policy!r} with {param!r}" + (f" where {where}" if where else ""))
    others = [p for p in varying(rows) if p != param]
    if others:
        raise SimlabError(f"{others} also vary for {policy!r}; pin them with --where, e.g. --where "
                          f"{others[0]}={rows[others[0]].dropna().iat[0]}")
    check_numbers(rows[param], param, of=f" (policy {policy!r})")  # the x axis
    return policy, rows.sort_values(param, kind="stable")


def sensitivity_figure(table: pd.DataFrame, param: str = "tau", policy: str | None = None,
                       where: dict[str, Any] | None = None, title: str | None = None) -> Figure:
    policy, rows = select(table, param, policy, where or {})
    fig = Figure(figsize=(6.5, 4.5))
    speed_ax = fig.add_subplot()
    cost_ax = speed_ax.twinx()
    speed_ax.plot(rows[param], rows["speedup"], "o-", color=SPEED_COLOR, label="speedup")
    cost_ax.plot(rows[param], rows["cost"], "s-", color=COST_COLOR, label="cost")
    gamma = int(rows["reference_gamma"].iat[0]) if "reference_gamma" in rows.columns else None
    speed_ax.axhline(float(rows["reference_speedup"].iat[0]), **REFERENCE_STYLE,
                     label=f"sd speedup at its best γ{f'={gamma}' if gamma else ''}")
    cost_ax.axhline(1.0, **PARITY_STYLE, label="cost parity with that sd")
    speed_ax.set_xlabel(param)
    speed_ax.set_ylabel("speedup over autoregressive decoding", color=SPEED_COLOR)
    cost_ax.set_ylabel("cost (target calls / sd at its best γ)", color=COST_COLOR)
    speed_ax.set_title(title or f"{policy}: speed and cost against {param} ({setup_name(table)})")
    speed_ax.grid(True, alpha=0.3)
    handles = speed_ax.get_legend_handles_labels()
    more = cost_ax.get_legend_handles_labels()
    # Below the axes: "best" placement sees only one of the twin axes' lines.
    speed_ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, ncol=2, loc="upper center",
                    bbox_to_anchor=(0.5, -0.13))
    return fig

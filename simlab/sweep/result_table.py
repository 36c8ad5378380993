"""The columns of a sweep's result table, and which of them are policy parameters.

Defined below both the sweep runner (which writes such tables) and the plots (which read
them, possibly from a file written long ago), so that neither imports the other.
"""

from __future__ import annotations

import pandas as pd

from simlab.common.metrics import SUMMARY_KEYS

# Columns of a sweep table besides the policy parameters, in order (metrics: simlab.common.metrics).
METRIC_COLUMNS = (*SUMMARY_KEYS, "acceptance_per_position", "parallel_rounds", "rollout_overruns",
                  "reference_gamma", "reference_speedup",
                  # the priced forwards and those extrapolated past the measured latencies (simlab.sim.extrapolation)
                  "priced_forwards", "extrapolated_forwards", "extrapolated_rules")
SETUP_COLUMNS = ("trace", "latency", "seed", "topology")
TIMING_COLUMNS = ("sim_seconds", "cpu_seconds")  # wall and CPU time of one configuration's simulation
OTHER_COLUMNS = ("policy", "label", "pareto", *TIMING_COLUMNS, "key")


def extrapolated_rows(table: pd.DataFrame) -> str:
    """What a sweep's rows priced past the measured latencies (columns ``extrapolated_forwards``
    and ``extrapolated_rules``), in words; "" where none did (or the table has no such columns:
    written before they were)."""
    if "extrapolated_forwards" not in table.columns:
        return ""
    from simlab.latency.coverage import RULES

    hit = table[table["extrapolated_forwards"].fillna(0) > 0]
    if hit.empty:
        return ""
    found = {r.split("=")[0] for cell in hit["extrapolated_rules"].dropna() for r in str(cell).split(",") if r}
    rules = [name for name, _ in RULES.values() if name in found]
    return (f"{len(hit)} of {len(table)} configurations priced forwards past the measured latencies (rules: "
            f"{', '.join(rules)}; columns extrapolated_forwards, extrapolated_rules)")


def param_columns(table: pd.DataFrame) -> list[str]:
    """The policy-parameter columns of a sweep table (every column that is not a metric or setup)."""
    fixed = {*METRIC_COLUMNS, *SETUP_COLUMNS, *OTHER_COLUMNS}
    return [c for c in table.columns if c not in fixed]


def varying(table: pd.DataFrame) -> list[str]:
    """The parameters that take more than one value among ``table``'s rows."""
    return [c for c in param_columns(table) if table[c].dropna().nunique() > 1]


def with_params(table: pd.DataFrame, rows: list[dict], after: str) -> pd.DataFrame:
    """``table`` with each row's policy parameters (``rows[i]["params"]``) as columns after
    ``after``: the union over rows in first-seen order, nullable-typed, so ``gamma`` stays an
    integer where other policies have none."""
    names = dict.fromkeys(p for row in rows for p in row["params"])
    params = pd.DataFrame({p: pd.array([row["params"].get(p) for row in rows]) for p in names}, index=table.index)
    at = table.columns.get_loc(after) + 1
    return pd.concat([table.iloc[:, :at], params, table.iloc[:, at:]], axis=1)

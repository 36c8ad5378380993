"""What the plots read from result tables: required columns, series per policy, names."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from simlab.common.errors import SimlabError
from simlab.sweep.result_table import varying

# What a figure's numeric column may hold, beyond being a finite number: a cell outside it is a
# number no run of simlab writes there (a negative speedup or rate, a share above 1), which a plot
# would draw as if it were one.
RANGES = {
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
    "in [0, 1]": lambda v: (v >= 0) & (v <= 1),
    "any": lambda v: np.ones(len(v), dtype=bool),
}


# the figures of a sweep table: speedups and costs are ratios of positive times and counts
SWEEP_NUMBERS = {"speedup": "> 0", "cost": "> 0", "reference_gamma": "> 0", "reference_speedup": "> 0"}


def require(table: pd.DataFrame, columns: Iterable[str], what: str, numbers: dict[str, str] | None = None) -> None:
    """One-line error when ``table`` lacks columns a plot needs, or has no rows, or a cell of a
    column in ``numbers`` (column -> its range, a key of :data:`RANGES`) is blank, not a number or
    out of its range: a figure drawn from such a cell is blank or wrong, with nothing said."""
    missing = [c for c in [*columns, *(numbers or {})] if c not in table.columns]
    if missing:
        raise SimlabError(f"the table lacks columns {missing}; expected {what}")
    if table.empty:
        raise SimlabError(f"the table has no rows; expected {what}")
    for column, rule in (numbers or {}).items():
        check_numbers(table[column], column, rule)


def check_numbers(cells: pd.Series, column: str, rule: str = "any", of: str = "") -> None:
    """Every cell of ``cells`` (rows of the column ``column``, indexed by their row in the table
    from 0; ``of``: which rows they are, in the message) is a finite number within ``rule``."""
    values = pd.to_numeric(cells, errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        good = np.isfinite(values) & RANGES[rule](values)
    if good.all():
        return
    i = int(np.flatnonzero(~good)[0])
    cell = cells.iat[i]
    shown = "blank" if pd.isna(cell) else (repr(cell) if np.isnan(values[i]) else f"{cell}")
    need = "a finite number" + ("" if rule == "any" else f" {rule}")
    row = cells.index[i]
    raise SimlabError(f"column {column!r}{of} has {int((~good).sum())} cell(s) that are not {need}; the first is "
                      f"{shown} in row {row + 1 if isinstance(row, (int, np.integer)) else i + 1}")


def series_of(table: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame, str | None]]:
    """Per policy (in order of appearance): its rows, sorted by the one parameter it sweeps
    (named third), or as they are when it sweeps none or several (third: None)."""
    for name in table["policy"].unique():
        rows = table[table["policy"] == name]
        params = varying(rows)
        if len(params) == 1:
            param, values = params[0], rows[params[0]]
            if pd.to_numeric(values, errors="coerce").notna().any():  # a numeric parameter: numbers only
                check_numbers(values.dropna(), param, of=f" (policy {name!r})")
                rows = rows.assign(**{param: pd.to_numeric(values)})  # as numbers, where text shares the column
            yield name, rows.sort_values(param, kind="stable"), param
        else:
            yield name, rows, None


def setup_name(table: pd.DataFrame) -> str:
    """The trace's directory name and the simulated topology, as the sweep recorded them."""
    name = Path(str(table["trace"].iat[0])).name if "trace" in table.columns else "sweep"
    return f"{name}, {table['topology'].iat[0]}" if "topology" in table.columns else name

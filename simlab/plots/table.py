"""What the plots read from result tables: required columns, series per policy, names."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd

from simlab.common.errors import SimlabError
from simlab.sweep.result_table import varying


def require(table: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """One-line error when ``table`` lacks columns a plot needs, or has no rows."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise SimlabError(f"the table lacks columns {missing}; expected {what}")
    if table.empty:
        raise SimlabError(f"the table has no rows; expected {what}")


def series_of(table: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame, str | None]]:
    """Per policy (in order of appearance): its rows, sorted by the one parameter it sweeps
    (named third), or as they are when it sweeps none or several (third: None)."""
    for name in table["policy"].unique():
        rows = table[table["policy"] == name]
        params = varying(rows)
        if len(params) == 1:
            yield name, rows.sort_values(params[0], kind="stable"), params[0]
        else:
            yield name, rows, None


def setup_name(table: pd.DataFrame) -> str:
    """The trace's directory name and the simulated topology, as the sweep recorded them."""
    name = Path(str(table["trace"].iat[0])).name if "trace" in table.columns else "sweep"
    return f"{name}, {table['topology'].iat[0]}" if "topology" in table.columns else name

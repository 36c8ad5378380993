"""Result tables on disk: CSV or Parquet, chosen by the file's suffix.

Below every command and executor (``simulate --out``, ``sweep --out``, ``live --out``, the
plots that read them back), so that none of them imports the command-line layer for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simlab.common.atomic import replace_file
from simlab.common.errors import SimlabError
from simlab.common.metrics import LIST_COLUMNS, upgrade_columns

if TYPE_CHECKING:  # pandas is imported where a table is read or written: `simlab --help` needs none
    import pandas as pd


def frame_path(path: str | Path, what: str = "--out") -> Path:
    """``path`` if it names a table file (.csv or .parquet); check before long work."""
    out = Path(path)
    if out.suffix.lower() not in (".csv", ".parquet"):
        raise SimlabError(f"{what} must end in .csv or .parquet, got {out.name!r}")
    return out


def write_frame(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a table as CSV or Parquet, chosen by the file suffix, in one rename."""
    out = frame_path(path)
    if out.suffix.lower() == ".csv":  # list cells as JSON, which read_frame turns back into lists
        lists = [c for c in LIST_COLUMNS if c in df.columns]
        flat = df.assign(**{c: df[c].map(lambda v: json.dumps([float(x) for x in v])) for c in lists})
        return replace_file(out, lambda tmp: flat.to_csv(tmp, index=False))
    return replace_file(out, lambda tmp: df.to_parquet(tmp, index=False))


def read_frame(path: str | Path) -> pd.DataFrame:
    """Read a table written by :func:`write_frame` (or any CSV/Parquet file)."""
    import pandas as pd

    p = frame_path(path, "a table file")
    if not p.is_file():
        raise SimlabError(f"table not found: {p}")
    try:
        df = pd.read_csv(p) if p.suffix.lower() == ".csv" else pd.read_parquet(p)
        for c in LIST_COLUMNS:
            if c in df.columns:
                df[c] = df[c].map(_as_list)
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise SimlabError(f"cannot read {p} ({exc})") from exc
    return df.rename(columns=upgrade_columns(df.columns))


def _as_list(cell: Any) -> list[float]:
    """A list cell as written to CSV — JSON, or the repr of a list or NumPy array — or as Parquet holds it."""
    if not isinstance(cell, str):
        return [float(v) for v in cell]
    return [float(v) for v in cell.strip("[]").replace(",", " ").split()]

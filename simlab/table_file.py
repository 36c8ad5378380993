"""Result tables on disk: CSV or Parquet, chosen by the file's suffix.

Below every command and executor (``simulate --out``, ``sweep --out``, ``live --out``, the
plots that read them back), so that none of them imports the command-line layer for it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simlab.atomic import replace_file
from simlab.errors import SimlabError


def frame_path(path: str | Path, what: str = "--out") -> Path:
    """``path`` if it names a table file (.csv or .parquet); check before long work."""
    out = Path(path)
    if out.suffix.lower() not in (".csv", ".parquet"):
        raise SimlabError(f"{what} must end in .csv or .parquet, got {out.name!r}")
    return out


def write_frame(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a table as CSV or Parquet, chosen by the file suffix, in one rename."""
    out = frame_path(path)
    if out.suffix.lower() == ".csv":
        return replace_file(out, lambda tmp: df.to_csv(tmp, index=False))
    return replace_file(out, lambda tmp: df.to_parquet(tmp, index=False))


def read_frame(path: str | Path) -> pd.DataFrame:
    """Read a table written by :func:`write_frame` (or any CSV/Parquet file)."""
    p = frame_path(path, "a table file")
    if not p.is_file():
        raise SimlabError(f"table not found: {p}")
    try:
        return pd.read_csv(p) if p.suffix.lower() == ".csv" else pd.read_parquet(p)
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise SimlabError(f"cannot read {p} ({exc})") from exc

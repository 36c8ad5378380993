"""Shared pieces of the commands: parameter parsing, tables, JSON and file outputs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from rich.console import Console
from rich.table import Table

from simlab.errors import SimlabError
from simlab.metrics import LIST_COLUMNS, upgrade_columns
from simlab.params import parse_value

console = Console()
err_console = Console(stderr=True)

# How each metric is printed: (label, format).
METRIC_FORMATS: dict[str, tuple[str, str]] = {
    "speedup": ("speedup vs AD", "{:.3f}x"),
    "cost": ("cost (target calls / best SD)", "{:.3f}x"),
    "mat": ("MAT (accepted drafts / target call)", "{:.3f}"),
    "tokens_per_target_call": ("tokens per target call (incl. bonus)", "{:.3f}"),
    "mean_acceptance_length": ("mean acceptance length (vLLM)", "{:.3f}"),
    "target_calls": ("target calls", "{:d}"),
    "draft_calls": ("draft calls", "{:d}"),
    "num_drafts": ("drafts (rounds that drafted)", "{:d}"),
    "drafted": ("draft tokens", "{:d}"),
    "accepted": ("accepted tokens", "{:d}"),
    "acceptance_rate": ("acceptance rate", "{:.3f}"),
    "tokens": ("tokens", "{:d}"),
    "wall_time_s": ("wall time (s)", "{:.3f}"),
    "ad_wall_time_s": ("AD wall time (s)", "{:.3f}"),
    "tokens_per_s": ("tokens/s", "{:.2f}"),
    "wasted_draft_tokens": ("wasted draft tokens", "{:d}"),
    "draft_busy": ("draft busy fraction", "{:.3f}"),
    "target_busy": ("target busy fraction", "{:.3f}"),
}


def fmt(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    spec = METRIC_FORMATS.get(key, (key, "{}"))[1]
    try:
        return spec.format(int(value) if spec == "{:d}" else value)
    except (ValueError, TypeError):
        return str(value)


def parse_params(pairs: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SimlabError(f"--param takes KEY=VALUE, got {pair!r}")
        out[key.strip().replace("-", "_")] = parse_value(value.strip())
    return out


def policy_params(pairs: Iterable[str], **flags: Any) -> dict[str, Any]:
    """Policy parameters from ``--param KEY=VALUE`` pairs and the named flags that were given."""
    params = parse_params(pairs)
    params.update({k: v for k, v in flags.items() if v is not None})
    return params


def metrics_table(title: str, rows: dict[str, Any], caption: str | None = None) -> Table:
    table = Table(title=title, caption=caption, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in rows.items():
        label = METRIC_FORMATS.get(key, (key, ""))[0]
        table.add_row(label, fmt(key, value))
    return table


def frame_path(path: str | Path, what: str = "--out") -> Path:
    """``path`` if it names a table file (.csv or .parquet); check before long work."""
    out = Path(path)
    if out.suffix.lower() not in (".csv", ".parquet"):
        raise SimlabError(f"{what} must end in .csv or .parquet, got {out.name!r}")
    return out


def write_frame(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a table as CSV or Parquet, chosen by the file suffix."""
    out = frame_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".csv":  # list cells as JSON, which read_frame turns back into lists
        lists = [c for c in LIST_COLUMNS if c in df.columns]
        df.assign(**{c: df[c].map(lambda v: json.dumps([float(x) for x in v])) for c in lists}).to_csv(out, index=False)
    else:
        df.to_parquet(out, index=False)
    return out


def read_frame(path: str | Path) -> pd.DataFrame:
    """Read a table written by :func:`write_frame` (or any CSV/Parquet file)."""
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


def print_json(obj: Any) -> None:
    def default(o: Any) -> Any:
        if hasattr(o, "item"):
            return o.item()
        return str(o)

    json.dump(_nan_to_none(obj), sys.stdout, default=default, allow_nan=False)
    sys.stdout.write("\n")


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj

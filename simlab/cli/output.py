"""Shared pieces of the commands: parameter parsing, tables and JSON (table files: simlab.common.table_file)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterable

import typer

from simlab.common.atomic import check_output
from simlab.common.errors import SimlabError
from simlab.common.params import parse_value
from simlab.common.table_file import frame_path

if TYPE_CHECKING:
    from rich.table import Table


class _Console:
    """A rich Console made on first use: a command's ``--help`` imports no rich."""

    def __init__(self, **options: Any):
        self._options, self._console = options, None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


console = _Console()
err_console = _Console(stderr=True)

# How each metric is printed; its label is its plain name (simlab.common.metrics.PLAIN).
FORMATS: dict[str, str] = {
    "speedup": "{:.3f}x", "cost": "{:.3f}x", "mat": "{:.3f}", "tokens_per_target_call": "{:.3f}",
    "mean_acceptance_length": "{:.3f}", "target_calls": "{:d}", "draft_calls": "{:d}", "num_drafts": "{:d}",
    "drafted": "{:d}", "accepted": "{:d}", "acceptance_rate": "{:.3f}", "tokens": "{:d}", "wall_time_s": "{:.3f}",
    "ad_wall_time_s": "{:.3f}", "tokens_per_s": "{:.2f}", "wasted_draft_tokens": "{:d}", "draft_busy": "{:.3f}",
    "target_busy": "{:.3f}",
}


def fmt(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    spec = FORMATS.get(key, "{}")
    try:
        return spec.format(int(value) if spec == "{:d}" else value)
    except (ValueError, TypeError):
        return str(value)


def positive_ints(spec: str, flag: str) -> tuple[int, ...]:
    """``--batch 1,2,4-8`` -> (1, 2, 4, 5, 6, 7, 8); each at least 1."""
    from simlab.record.ranges import int_ranges

    try:
        values = int_ranges(spec)
    except ValueError as exc:
        raise SimlabError(f"{flag}: {exc}") from None
    if min(values) < 1:
        raise SimlabError(f"{flag} values must be >= 1, got {spec!r}")
    return values


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
    given = {k: v for k, v in flags.items() if v is not None}
    both = sorted(set(params) & set(given))
    if both:
        k = both[0]
        raise SimlabError(f"--{k.replace('_', '-')} {given[k]} and --param {k}={params[k]} both set {k}; give one")
    params.update(given)
    return params


def metrics_table(title: str, rows: dict[str, Any], caption: str | None = None) -> Table:
    """One row per metric, under its plain name (:func:`meanings` says what each is)."""
    from rich.table import Table

    from simlab.common.metrics import PLAIN

    table = Table(title=title, caption=caption, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in rows.items():
        table.add_row(PLAIN.get(key, (key, ""))[0], fmt(key, value))
    return table


def meanings(keys: Iterable[str], headers: dict[str, str] | None = None) -> Table:
    """What each metric of ``keys`` is, one row each, to print under the table that shows them
    (under ``headers[key]`` where the table's column has a shorter name than the metric's)."""
    from rich.table import Table

    from simlab.common.metrics import PLAIN

    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for k in keys:
        if k in PLAIN:
            grid.add_row(" ".join((headers or {}).get(k, PLAIN[k][0]).split()), PLAIN[k][1])
    return grid


Force = Annotated[bool, typer.Option("--force", help="Overwrite (replace) an existing output.")]
Strict = Annotated[bool, typer.Option("--strict", help="Refuse a run that prices any forward past the measured latencies (k, context, tree size, layer, batch) instead of extrapolating.")]


def extrapolated_text(figures: dict[str, Any]) -> str:
    """``N of M priced forwards ... (rule n, ...)`` from a run's figures
    (:class:`~simlab.sim.extrapolation.Extrapolated`), or "" where none was extrapolated."""
    n = figures.get("extrapolated_forwards") or 0
    if not n:
        return ""
    rules = ", ".join(f"{rule} {count:,}" for rule, count in (figures.get("extrapolated_by_rule") or {}).items())
    return (f"{n:,} of {figures.get('priced_forwards', 0):,} priced forwards extrapolated past the measured "
            f"latencies (by rule: {rules})")


def check_strict(figures: dict[str, Any], strict: bool, what: str = "the run") -> None:
    """Refuse, under ``--strict``, figures that rest on an extrapolated price."""
    text = extrapolated_text(figures)
    if strict and text:
        raise SimlabError(f"--strict: {what} has {text}; probe the missing sizes and contexts, or drop --strict")


def print_extrapolated(figures: dict[str, Any]) -> None:
    """The line under a run's table that says how many of its prices were extrapolated."""
    text = extrapolated_text(figures)
    if text:
        console.print(f"[yellow]note:[/] {text}; --strict refuses such runs (docs/metrics.md: the rules)")
    elif "priced_forwards" in figures:
        console.print(f"priced forwards: {figures['priced_forwards']:,}, none extrapolated past the measured latencies")


def frame_output(path: str | Path, force: bool, what: str = "--out") -> Path:
    """Check before any work that ``path`` can take a table (see :func:`simlab.common.atomic.check_output`)."""
    return frame_path(check_output(path, what, force=force), what)


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

"""``simlab trace``: check a trace's tables against their checksums, or write the checksums."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from simlab.cli.app import app
from simlab.common.errors import SimlabError

trace_app = typer.Typer(help="Check traces against the checksums of their tables, or write the checksums.",
                        no_args_is_help=True)
app.add_typer(trace_app, name="trace")

Traces = typer.Argument(..., help="Trace directories.")


@trace_app.command("check")
def check_command(traces: list[Path] = Traces) -> None:
    """Load each trace as every command does: its tables against their sha256 in manifest.json,
    then every column; one line per trace, or one error."""
    for path in traces:
        typer.echo(f"{path}: {_loaded(path)}")


@trace_app.command("rehash")
def rehash_command(traces: list[Path] = Traces) -> None:
    """Write the sha256 of each table into manifest.json (no table is rewritten), then check the
    trace: for a trace written by a simlab that kept no checksums, or after editing a table on purpose."""
    from simlab.trace.checksums import rehash

    for path in traces:
        if not path.is_dir():
            raise SimlabError(f"trace {path} is not a directory (a trace is a directory with manifest.json)")
        rehash(path)
        typer.echo(f"{path}: checksums written; {_loaded(path)}")


def _loaded(path: Path) -> str:
    """What loading ``path`` found (or raise its error)."""
    from simlab.trace.checksums import CHECKSUMS, TABLE_FILES
    from simlab.trace.io import read_trace
    from simlab.trace.schema import MANIFEST

    trace = read_trace(path)
    files = [f for f in TABLE_FILES if (path / f).is_file()]
    listed = CHECKSUMS in json.loads((path / MANIFEST).read_text())
    sums = "match their checksums" if listed else "have no checksums to match"
    return f"{len(files)} tables {sums} ({', '.join(files)}); {trace.n_prompts} prompts, every column valid"

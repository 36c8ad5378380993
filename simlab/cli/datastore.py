"""``simlab datastore build``: REST's datastore from the outputs recorded in traces."""

from __future__ import annotations

from pathlib import Path

import typer

from simlab.cli.app import app

datastore_app = typer.Typer(help="Build the token datastore that the rest policy retrieves drafts from.",
                            no_args_is_help=True)
app.add_typer(datastore_app, name="datastore")


@datastore_app.command("build")
def build_command(
    trace: list[Path] = typer.Option(..., "--trace", help="A trace whose prompts' outputs go in (repeatable)."),
    out: Path = typer.Option(..., "--out", help="The datastore file to write (.npz)."),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
) -> None:
    """Every prompt's output (the target's tokens) of each trace, one sequence each, keyed by its prompt
    so that a prompt never retrieves its own output."""
    from simlab.common.atomic import check_output
    from simlab.common.datastore import Datastore
    from simlab.common.errors import SimlabError
    from simlab.trace.io import read_trace
    from simlab.trace.replay import TraceReplay

    path = check_output(out, force=force)
    answers = []
    for t in trace:
        for rp in TraceReplay(read_trace(t)).prompts:
            if rp.prompt_tokens is None:
                raise SimlabError(f"{t} has no prompt token ids (prompts.parquet's prompt_token_ids): its outputs "
                                  "cannot be keyed by prompt; record it with simlab record")
            answers.append((rp.prompt_tokens, rp.target_tokens))
    store = Datastore.of_outputs(answers, source=", ".join(str(t) for t in trace))
    store.save(path)
    typer.echo(f"{path}: {len(answers)} sequences, {len(store.tokens) - len(answers)} tokens")

"""The ``simlab`` command: one Typer app that every subcommand module registers on.

Subcommand modules must not import torch at import time: ``simlab simulate`` has to work
without the ``models`` extra installed.
"""

from __future__ import annotations

import typer

from simlab.cli.commands import CommandTable

EXIT_INTERRUPTED = 130  # the shell's code for a process stopped by Ctrl-C (128 + SIGINT)

app = typer.Typer(
    name="simlab",
    cls=CommandTable,
    help="A lab for speculative decoding: record traces, simulate policies, check against live decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help, as wide as the terminal: rendering it with rich cost more CPU than the rest of
    # `simlab --help` together (tests/test_cli_startup.py).
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 400},
)
CommandTable.app = app  # what a command is built from once its module has registered it


@app.callback()
def _root() -> None:
    # A group needs a callback to be built before any command is registered: the commands are
    # registered as their modules load (simlab.cli.commands).
    pass

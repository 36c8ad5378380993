"""The ``simlab`` command: one Typer app that every subcommand module registers on.

Subcommand modules must not import torch at import time: ``simlab simulate`` has to work
without the ``models`` extra installed.
"""

from __future__ import annotations

import typer

EXIT_INTERRUPTED = 130  # the shell's code for a process stopped by Ctrl-C (128 + SIGINT)

app = typer.Typer(
    name="simlab",
    help="A lab for speculative decoding: record traces, simulate policies, check against live decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

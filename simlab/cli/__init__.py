"""Command-line entry point.

Every module in this package except ``app``, ``output`` and ``policy_options`` defines commands on the shared Typer
app; they are imported here, in pipeline order, so ``simlab --help`` reads like the pipeline of docs/architecture.md.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from simlab.cli.app import EXIT_INTERRUPTED, app
from simlab.common.errors import SimlabError

EXIT_USER_ERROR = 2
PIPELINE_ORDER = ("models", "record", "calibrate", "simulate", "serve", "policies", "sweep", "plot", "live", "llama_cpp", "llama_serve", "vllm",
                  "synth", "analytic", "bench")
_NOT_COMMANDS = {"app", "output", "policy_options"}
# Click's base class of usage errors, as the installed Typer raises it: Typer 0.29 and later
# carry their own copy of Click and no longer install the click package.
_CLICK_EXCEPTION = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _command_modules() -> list[str]:
    names = {m.name for m in pkgutil.iter_modules(__path__)} - _NOT_COMMANDS
    rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


for _name in _command_modules():
    importlib.import_module(f"{__name__}.{_name}")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a :class:`SimlabError` becomes one line on stderr and exit status 2."""
    try:
        code = app(args=argv, standalone_mode=False)
    except SimlabError as exc:
        print(f"simlab: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except _CLICK_EXCEPTION as exc:  # bad options: click's own message, exit 2
        exc.show()
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        print("simlab: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    # Typer returns, instead of raising, the code of a typer.Exit, and turns Ctrl-C in a
    # command into typer.Exit(130); commands themselves return None.
    if code == EXIT_INTERRUPTED:
        print("simlab: interrupted", file=sys.stderr)
    if code:
        sys.exit(code)

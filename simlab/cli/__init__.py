"""Command-line entry point.

The root group (:class:`simlab.cli.commands.CommandTable`) imports a command's module only when
that command runs or prints its help, so ``simlab --help`` imports no command at all;
``simlab.cli.commands.load()`` imports every one (for tools that walk them all).
"""

from __future__ import annotations

import sys

from simlab.common.openmp import one_blas_thread

one_blas_thread()  # before any command imports numpy

import typer  # noqa: E402

from simlab.cli.app import EXIT_INTERRUPTED, app  # noqa: E402
from simlab.common.errors import SimlabError  # noqa: E402

EXIT_USER_ERROR = 2
# Click's base class of usage errors, as the installed Typer raises it: Typer 0.29 and later
# carry their own copy of Click and no longer install the click package.
_CLICK_EXCEPTION = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


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

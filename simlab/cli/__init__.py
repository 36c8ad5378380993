"""Command-line entry point. Importing a subcommand module registers its commands."""

from __future__ import annotations

import sys

import click

from simlab.cli import analytic as _analytic  # noqa: E402,F401
from simlab.cli import bench as _bench  # noqa: E402,F401
from simlab.cli import calibrate as _calibrate  # noqa: E402,F401

# Registration order is the order of `simlab --help`.
from simlab.cli import simulate as _simulate  # noqa: E402,F401
from simlab.cli import synth as _synth  # noqa: E402,F401
from simlab.cli.app import app
from simlab.errors import SimlabError

EXIT_USER_ERROR = 2


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a :class:`SimlabError` becomes one line on stderr and exit status 2."""
    try:
        app(args=argv, standalone_mode=False)
    except SimlabError as exc:
        print(f"simlab: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # bad options: click's own message, exit 2
        exc.show()
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        print("simlab: interrupted", file=sys.stderr)
        sys.exit(130)

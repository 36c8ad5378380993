"""``python -m simlab`` runs the CLI."""

from simlab.cli import main

main()

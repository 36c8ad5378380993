"""``simlab policies``: every drafting policy, its parameters, defaults and paper section."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from simlab.cli.app import app
from simlab.cli.output import console, print_json


def describe_policy(cls) -> dict:
    return {
        "name": cls.name,
        "summary": cls.summary,
        "paper": cls.paper,
        "schedule": "parallel" if cls.parallel else "tree" if cls.drafts_trees else "serial",
        "params": [{"name": p.name, "default": p.default, "help": p.help, "values": p.kind.range,
                    "aliases": list(p.aliases)} for p in cls.params],
        "choices": cls.choices,
        "draft_end": cls.draft_end_choice(),
        "stops_at_draft_end": cls.stops_at_draft_end,
        "serial_schedule_bound": cls.needs_future,
    }


def _default(value) -> str:
    if value is None:
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


@app.command()
def policies(
    name: Annotated[Optional[str], typer.Argument(help="Show only this policy.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List every drafting policy with its parameters, defaults and the paper section it implements.

    Set a parameter with `simlab simulate --policy NAME --KEY VALUE` (every parameter and alias
    has a flag of its name, dashes for underscores) or `--param KEY=VALUE`. A default of "none"
    means what the parameter's help says (most are derived from the trace or the latency model).
    """
    from simlab.common.errors import SimlabError
    from simlab.policies import REGISTRY

    if name is not None and name not in REGISTRY:
        raise SimlabError(f"unknown policy {name!r}; known policies: {', '.join(REGISTRY)}")
    rows = [describe_policy(cls) for key, cls in REGISTRY.items() if name in (None, key)]
    if json_out:
        print_json(rows)
        return
    for row in rows:
        console.print(f"[bold]{row['name']}[/] ({row['schedule']}) — {row['summary']}", highlight=False)
        console.print(f"  paper: {row['paper']}", highlight=False)
        for p in row["params"]:
            aliases = f" (also {', '.join(p['aliases'])})" if p["aliases"] else ""
            console.print(f"  --param {p['name']}={_default(p['default'])}  {p['help']}; {p['values']}{aliases}",
                          highlight=False, markup=False)
        if row["choices"]:
            console.print(f"  choices where the paper is silent: {row['choices']}", highlight=False)
        console.print(f"  end token: {row['draft_end']}", highlight=False)
        console.print()

"""``simlab analytic``: Leviathan et al.'s closed forms."""

from __future__ import annotations

from typing import Annotated

import typer

from simlab.cli.app import app
from simlab.cli.output import console, print_json


@app.command()
def analytic(
    alpha: Annotated[float, typer.Option("--alpha", help="Per-token acceptance probability α.")] = 0.8,
    c: Annotated[float, typer.Option("--c", help="Draft step cost / target step cost.")] = 0.1,
    gamma: Annotated[int, typer.Option("--gamma", help="Draft length γ.")] = 5,
    verify_slope: Annotated[float, typer.Option("--verify-slope", help="Extra target steps per extra verified token.")] = 0.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Expected tokens per round, walltime speedup and the optimal γ under i.i.d. acceptance."""
    from simlab.analytic import analyse

    res = analyse(alpha, c, gamma, verify_slope)
    if json_out:
        print_json(res.to_dict())
        return
    console.print(f"α={alpha}, c={c}, γ={gamma}, verify slope={verify_slope}")
    console.print(f"  expected tokens per round (1-α^(γ+1))/(1-α): {res.expected_tokens:.4f}")
    console.print(f"  walltime speedup: {res.speedup:.4f}x")
    console.print(f"  optimal γ: {res.optimal_gamma} (speedup {res.optimal_speedup:.4f}x)")

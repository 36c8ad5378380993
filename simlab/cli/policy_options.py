"""The policy flags that ``simulate`` and ``live`` share: each sets the policy parameter of the
same name (a policy without it is a one-line error), ``--param`` sets any other."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Policy = Annotated[str, typer.Option("--policy", help="Policy name (see `simlab policies`).")]
Gamma = Annotated[Optional[int], typer.Option("--gamma", help="Draft length γ (policies that take one).")]
Tau = Annotated[Optional[float], typer.Option("--tau", help="SPIDE's reliability threshold τ.")]
Threshold = Annotated[Optional[float], typer.Option(
    "--threshold", help="Stop threshold (hf-confidence, dv, adaedl, specdecpp, pacer).")]
Window = Annotated[Optional[int], typer.Option("--window", help="Parallel window s / γ (spide, pearl).")]
H = Annotated[Optional[float], typer.Option("--h", help="Threshold h (ags: fixed P_rej threshold; svip: entropy threshold).")]
Block = Annotated[Optional[int], typer.Option("--block", help="Pacer's block size b.")]
Params = Annotated[list[str], typer.Option("--param", "-P", help="Any policy parameter as KEY=VALUE; repeatable.")]

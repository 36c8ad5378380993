"""``simlab synth``: write a synthetic trace."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from simlab.cli.app import app
from simlab.cli.output import console
from simlab.common.atomic import check_output
from simlab.trace.schema import MANIFEST


@app.command()
def synth(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the trace to.")],
    kind: Annotated[str, typer.Option("--kind", help="iid, markov or table.")] = "iid",
    alpha: Annotated[float, typer.Option("--alpha", help="Acceptance probability (iid; the good regime of markov).")] = 0.8,
    c: Annotated[float, typer.Option("--c", help="Draft step cost as a fraction of a target step.")] = 0.1,
    prompts: Annotated[int, typer.Option("--prompts", help="Number of prompts.")] = 20,
    tokens: Annotated[int, typer.Option("--tokens", help="Generated tokens per prompt.")] = 256,
    verify_slope: Annotated[float, typer.Option("--verify-slope", help="Extra target steps per extra verified token (0 = flat).")] = 0.0,
    target_step: Annotated[float, typer.Option("--target-step", help="Seconds of a one-token target forward.")] = 0.025,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help="Prompt length in tokens.")] = 128,
    concentration: Annotated[float, typer.Option("--concentration", help="Beta concentration of confidences (higher: closer to alpha).")] = 4.0,
    alpha_bad: Annotated[float, typer.Option("--alpha-bad", help="markov: acceptance probability in the bad regime.")] = 0.3,
    p_good_to_bad: Annotated[float, typer.Option("--p-good-to-bad", help="markov: per-position switch probability good->bad.")] = 0.05,
    p_bad_to_good: Annotated[float, typer.Option("--p-bad-to-good", help="markov: per-position switch probability bad->good.")] = 0.2,
    table: Annotated[Optional[Path], typer.Option("--table", help="table: CSV with conf_low, conf_high, count, accepted.")] = None,
    rollout: Annotated[int, typer.Option("--rollout", help="Rollout steps after each divergence.")] = 16,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    latency_profile: Annotated[Optional[Path], typer.Option("--latency-profile", help="Take the latencies from this profile (fitted or roofline, e.g. calibrate/roofline/*.json) instead of --c/--target-step/--verify-slope.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a trace already in --out.")] = False,
) -> None:
    """Write a synthetic trace: i.i.d., bursty (markov) or histogram-driven (table) acceptance."""
    from simlab.trace.synth import SynthSpec

    from simlab.latency.retime import with_latency
    from simlab.trace.io import write_trace
    from simlab.trace.synth import synth_trace

    check_output(out, "--out", force=force, directory=True, owned=MANIFEST)
    spec = SynthSpec(kind=kind, alpha=alpha, c=c, prompts=prompts, tokens=tokens, verify_slope=verify_slope,
                     target_step=target_step, prompt_len=prompt_len, concentration=concentration,
                     alpha_bad=alpha_bad, p_good_to_bad=p_good_to_bad, p_bad_to_good=p_bad_to_good,
                     table=str(table) if table else None, rollout=rollout, seed=seed)
    trace = synth_trace(spec, command=shlex.join(["simlab", *sys.argv[1:]]))
    if latency_profile:
        trace = with_latency(trace, latency_profile)
    path = write_trace(trace, out)
    accept = (trace.positions["draft_token"] == trace.positions["target_token"]).mean()
    console.print(f"wrote synthetic {kind} trace to {path}: {prompts} prompts x {tokens} tokens, "
                  f"measured acceptance {accept:.3f}")

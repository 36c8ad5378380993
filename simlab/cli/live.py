"""``simlab live``: decode for real with a policy and check the simulator against it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from simlab.cli import policy_options as opt
from simlab.cli.app import app
from simlab.cli.output import Force, console, err_console, frame_output, print_json
from simlab.common.openmp import wait_passively
from simlab.common.params import check_seed


@app.command()
@opt.with_policy_flags
def live(
    params: dict[str, Any],
    policy: opt.Policy = "sd",
    target: Annotated[str, typer.Option("--target", help="Target: installed name, HF id, directory or .gguf.")] = "smollm2",
    draft: Annotated[Optional[str], typer.Option("--draft", help="Draft model (or use --draft-layer).")] = None,
    draft_layer: Annotated[Optional[int], typer.Option("--draft-layer", help="Draft with the target's first N layers (early exit).")] = None,
    prompts: Annotated[str, typer.Option("--prompts", help="humaneval[:N], mtbench[:N], humaneval-edit[:N], mtbench-turn2[:N], or a .jsonl/.txt file.")] = "humaneval:20",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Token budget per prompt.")] = 128,
    device: Annotated[Optional[str], typer.Option("--device", help="cuda or cpu.", show_default="cuda when available")] = None,
    draft_device: Annotated[Optional[str], typer.Option("--draft-device", help="Device of the draft.", show_default="--device")] = None,
    target_device: Annotated[Optional[str], typer.Option("--target-device", help="Device of the target.", show_default="--device")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, bfloat16 or float16.", show_default="float32 on cpu, else bfloat16")] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy; > 0 speculative sampling.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    compare: Annotated[bool, typer.Option("--compare/--no-compare", help="Simulate the policy on a trace of the same prompts and compare.")] = True,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Comparison trace.", show_default="a matching shipped or cached one, else recorded")] = None,
    reprobe: Annotated[bool, typer.Option("--reprobe", help="Measure the trace's latencies again now (a cached copy).")] = False,
    probe: Annotated[Optional[str], typer.Option("--probe", help="Time the run's forwards again in this process, with the decoding models, just before decoding, and predict from them (SPEC as record's --latency-probe: k values, contexts, repeats, e.g. 'k=1-6;ctx=128,256;repeats=5'; k=auto: every size the prediction verifies); with --out, kept in OUT.latency.csv.")] = None,
    reprobe_drift: Annotated[Optional[float], typer.Option("--reprobe-drift", help="With --probe: after a prompt whose autoregressive baselines ran more than this fraction off their price (e.g. 0.03), time the forwards again (the sizes k that carry 95% of the time predicted for the prompts left) and price the later prompts from them (the policy keeps its decisions); each row's probe is in --out.")] = None,
    spread_trace: Annotated[Optional[list[Path]], typer.Option("--spread-trace", help="At temperature > 0: another trace of the same prompts recorded with another record --seed (repeatable); the predicted interval then covers the sampled continuation.")] = None,
    spread_seeds: Annotated[int, typer.Option("--spread-seeds", help="At temperature > 0: replay seeds per trace for the predicted interval.")] = 20,
    repeats: Annotated[int, typer.Option("--repeats", help="Decode each prompt's policy N times between N + 1 autoregressive baselines (A B A B ... A); report the median.")] = 1,
    latency: Annotated[Optional[Path], typer.Option("--latency", help="Latency profile for policies that need one.")] = None,
    against_hf: Annotated[bool, typer.Option("--against-hf", help="Also run HF assisted generation with the same fixed γ.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Per-prompt results (.csv or .parquet), written as prompts finish.")] = None,
    log: Annotated[Optional[Path], typer.Option("--log", help="Directory for decode logs (per prompt: forwards and rounds, and the simulated timeline).")] = None,
    chat_template: Annotated[bool, typer.Option("--chat-template/--no-chat-template", help="Use the tokenizer's chat template.")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
    force: Force = False,
) -> None:
    """Decode prompts for real under a policy and compare measured with predicted.

    KV caches for both models, rollback on rejection, speculative sampling at temperature > 0,
    parallel rounds in two threads; each prompt is also decoded autoregressively (the speedup's
    denominator) and, unless --no-compare, the policy is simulated on a trace of the same prompts.
    """
    wait_passively()  # before torch loads OpenMP
    from simlab.live.report import LiveReport
    from simlab.live.session import LiveConfig, LiveSession

    check_seed(seed)  # before the models load, as the output
    if out is not None:
        frame_output(out, force)
    say = (lambda msg: None) if quiet else (lambda msg: err_console.print(msg))
    cfg = LiveConfig(policy=policy, params=params, target=target, draft=draft, draft_layer=draft_layer,
                     prompts=prompts, max_new_tokens=max_new_tokens, device=device, draft_device=draft_device,
                     target_device=target_device, dtype=dtype, temperature=temperature, seed=seed, compare=compare,
                     trace=trace, reprobe=reprobe, probe=probe, reprobe_drift=reprobe_drift, spread_traces=list(spread_trace or []), spread_seeds=spread_seeds,
                     repeats=repeats, latency=latency, chat_template=chat_template, progress=not quiet)
    session = LiveSession(cfg, log=say)
    report = LiveReport(session, out=out, log_dir=log, against_hf=against_hf, say=say)
    try:
        report.run()
    finally:
        session.close()
    if json_out:
        print_json(report.summary())
        return
    report.print(console)

"""``simlab record``: decode real prompts with real draft/target models into a trace.

torch and transformers are imported inside the command, so that the rest of the CLI works
without the ``models`` extra.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from simlab.cli.app import app
from simlab.common.openmp import wait_passively

PROBE_HELP = ("Latency points: 'k=1-17,24,32,64,128;ctx=128,512;repeats=5;corun=yes;batch=1,2,4,8;batch_k=1-9;"
              "tree=1-9,17,32,64;exit_head=1-9,17,32' (fields optional). tree: forwards under a tree mask, default "
              "with --topk; exit_head: DEL's shadow-token LM head, default with --exit-layers; none: not probed.")


@app.command("record")
def record_command(
    target: str = typer.Option(..., "--target", help="Target: installed name, HF id, directory or .gguf file."),
    out: Path = typer.Option(..., "--out", help="Trace directory to write (e.g. traces/NAME)."),
    prompts: str = typer.Option("humaneval:40", "--prompts", help="humaneval[:N], mtbench[:N], humaneval-edit[:N], mtbench-turn2[:N], or a .jsonl/.txt file."),
    draft: str | None = typer.Option(
        None, "--draft", help="Draft model; omit with --exit-layers for self-speculation."
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Tokens the target generates per prompt."),
    device: str | None = typer.Option(None, "--device", help="cuda or cpu.", show_default="cuda when available"),
    dtype: str | None = typer.Option(None, "--dtype", help="float32, bfloat16 or float16.", show_default="float32 on cpu"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 samples and records p/q for replay."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (each prompt derives its own)."),
    rollout: int | None = typer.Option(
        None, "--rollout", show_default="16; with --resume the trace's",
        help="Draft continuation length after each divergence and past the path's end; with --resume, "
             "another length records every prompt's rollouts again at it.",
    ),
    exit_layers: str | None = typer.Option(
        None, "--exit-layers", help="Record early exits: 'all', '20-29' or '8,16,24'."
    ),
    draft_layer: int | None = typer.Option(
        None, "--draft-layer", help="Self-speculative: exit layer for the draft columns."
    ),
    rollout_layers: str | None = typer.Option(
        None, "--rollout-layers",
        help="Exit layers that get their own divergence rollouts (DEL, LayerSkip): 'all', '1-3' or '1,8'; "
        "with --resume, added to the prompts already recorded.",
        show_default="the draft's only",
    ),
    topk: int = typer.Option(0, "--topk", help="Store the draft's top-K candidates per position (tree policies)."),
    tree_depth: int = typer.Option(
        0, "--tree-depth", help="With --topk K: store EAGLE-2's candidate tree of top-k K and this depth per position."
    ),
    latency_probe: str = typer.Option("", "--latency-probe", help=PROBE_HELP, show_default="the example's points"),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted trace in --out."),
    reprobe: bool = typer.Option(False, "--reprobe", help="With --resume: measure the latencies again."),
    keep_rollouts: bool = typer.Option(
        False, "--keep-rollouts",
        help="With --resume: keep the recorded rollouts as they are, where this version would record them again "
        "(a trace recorded before tails); with --reprobe, only the latencies change.",
    ),
    force: bool = typer.Option(False, "--force", help="Replace a trace already in --out (without --resume)."),
    chat_template: bool = typer.Option(
        True, "--chat-template/--no-chat-template", help="Use the tokenizer's chat template."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Record a trace: per-position signals, divergence rollouts and forward latencies."""
    wait_passively()  # before torch loads OpenMP
    from simlab.record.recorder import RecordConfig, record

    result = record(
        RecordConfig(
            target=target,
            prompts=prompts,
            out=out,
            draft=draft,
            max_new_tokens=max_new_tokens,
            device=device,
            dtype=dtype,
            temperature=temperature,
            seed=seed,
            rollout=rollout,
            exit_layers=exit_layers,
            draft_layer=draft_layer,
            rollout_layers=rollout_layers,
            topk=topk,
            tree_depth=tree_depth,
            latency_probe=latency_probe,
            resume=resume,
            reprobe=reprobe,
            rollouts_again=not keep_rollouts,
            force=force,
            chat_template=chat_template,
            command=shlex.join(["simlab", *sys.argv[1:]]),
            progress=not quiet,
        )
    )
    typer.echo(
        f"{result.path}: {result.total} prompts, {result.tokens} tokens ({result.recorded} recorded now), "
        f"draft agreement {result.agreement:.3f}, {result.seconds:.0f} s"
        + (f"; exit-layer rollouts of {result.layer_rollouts} prompt x layer pairs recorded now"
           if result.layer_rollouts else "")
    )

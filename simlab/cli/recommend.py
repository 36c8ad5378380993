"""``simlab recommend``: the best configurations for a trace's pair, how sure each is, which
assumption moves them most, and each as an engine's own settings (simlab/sweep/recommend.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from simlab.cli import serve_options as so
from simlab.cli.app import app
from simlab.cli.output import console, fmt, print_json
from simlab.cli.simulate import load_inputs, trace_label
from simlab.serve.scheduler import DEFAULT_MAX_BATCH

SERVING = "Under load (with --rate)"


@app.command()
def recommend(
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Trace directory of your pair.", show_default="the shipped trace")] = None,
    latency: Annotated[Optional[Path], typer.Option("--latency", help="Latency profile JSON (your hardware: simlab calibrate).", show_default="the trace's own samples")] = None,
    objective: Annotated[str, typer.Option("--objective", help="speed: the highest speedup; cost: the fewest target calls among those faster than the target alone; goodput: the most requests per second within the SLOs (needs --rate).")] = "speed",
    rate: Annotated[Optional[float], typer.Option("--rate", help="Serve the grid under Poisson arrivals at this rate (requests per second) instead of one request at a time.", rich_help_panel=SERVING)] = None,
    requests: Annotated[int, typer.Option("--requests", help="With --rate: requests served.", rich_help_panel=SERVING)] = so.DEFAULT_REQUESTS,
    max_batch: Annotated[int, so.option("max_batch", SERVING)] = DEFAULT_MAX_BATCH,
    slo_ttft: Annotated[Optional[float], so.option("slo_ttft", SERVING)] = None,
    slo_tpot: Annotated[Optional[float], so.option("slo_tpot", SERVING)] = None,
    policy: Annotated[list[str], typer.Option("--policy", help="A grid of your own instead of the standard one, as simlab sweep takes it; repeatable.", show_default="the standard grid")] = [],
    top: Annotated[int, typer.Option("--top", min=1, help="Configurations to show.")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of stochastic replay and of the arrivals.")] = 0,
    workers: Annotated[Optional[int], typer.Option("--workers", help="Parallel workers of the sweep (1: no pool).", show_default="all cores")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the sweep's cached results.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the report.")] = False,
) -> None:
    """The best configurations for a trace's pair, how sure, and each as an engine's own settings.

    Runs the standard sweep (or, with --rate, serves it under load), ranks it by --objective
    as simlab sweep of the same grid would, gives each of the best a range (its prompts
    resampled; under load, the arrivals drawn again), simulates them again under the other
    topology and another latency source to say which assumption matters most, and prints the
    best each engine can run as that engine's settings (Hugging Face generate, llama.cpp).
    """
    from simlab.serve.metrics import Slo
    from simlab.serve.scheduler import Scheduler
    from simlab.sweep.recommend import OBJECTIVES, recommend as run
    from simlab.sweep.serving import ServeLoad

    if objective not in OBJECTIVES:
        from simlab.common.errors import SimlabError

        raise SimlabError(f"--objective takes {', '.join(OBJECTIVES)}, got {objective!r}")
    load = (ServeLoad((rate,), requests, Scheduler(max_batch), slo=Slo(slo_ttft, slo_tpot)) if rate is not None
            else None)
    tr, lat = load_inputs(trace, latency)
    rec = run(tr, latency=lat, objective=objective, load=load, grid=policy or None, top=top, seed=seed,
              workers=workers, cache=not no_cache)
    if json_out:
        print_json({"trace": str(tr.path), "objective": rec.objective, "metric": rec.metric, "grid": rec.grid,
                    "configurations": len(rec.table), "interval": rec.interval,
                    "top": [dataclasses.asdict(c) for c in rec.top],
                    "assumptions": [dataclasses.asdict(a) for a in rec.assumptions],
                    "matters_most": rec.most.name if rec.most else None,
                    "engines": {e: dataclasses.asdict(c) if c else None for e, c in rec.engine_best.items()}})
        return
    _report(rec, tr, load)


def _report(rec, tr, load) -> None:
    from rich.table import Table

    from simlab.sweep.recommend import OBJECTIVES

    console.print(f"trace: {trace_label(tr)}")
    where = f"served at {load.rates[0]:g} requests/s, {load.requests} requests" if load else "one request at a time"
    console.print(f"{len(rec.table)} configurations {where}; grid: " + " ".join(f"--policy {g}" for g in rec.grid),
                  highlight=False)
    if not rec.top:
        console.print("no configuration meets the objective: " + OBJECTIVES[rec.objective][2]
                      + " (speculation does not pay on this trace: decode with the target alone)")
        return
    label = {"speedup": "speedup over the target alone", "e2e_speedup": "end-to-end speedup over no speculation",
             "cost": "target calls vs plain SD at its best γ", "goodput_requests_per_s": "goodput (requests/s)"}[rec.metric]
    ranged = rec.metric if load else "speedup"  # what the range is of
    table = Table(title=f"the best for {rec.objective}: {OBJECTIVES[rec.objective][2]}", header_style="bold",
                  caption=f"range: {rec.interval}", caption_justify="left")
    columns = ["", "configuration", f"{label if ranged == rec.metric else 'speedup over the target alone'} (range)"] + ([] if ranged == rec.metric else [label]) + ["tokens / draft"]
    for col in columns:
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for i, c in enumerate(rec.top, 1):
        centre = c.value if ranged == rec.metric else c.figures["speedup"]
        cells = [str(i), c.label, f"{centre:.3f} [{c.low:.3f}, {c.high:.3f}]"]
        cells += [] if ranged == rec.metric else [f"{c.value:.3f}"]
        table.add_row(*cells, fmt("mean_acceptance_length", c.figures.get("mean_acceptance_length")))
    console.print(table)
    most = rec.most
    for a in rec.assumptions:
        marker = "matters most: " if a is most else "also tried: "
        winner = "the first choice stays first" if a.winner == rec.top[0].label else f"{a.winner} comes first instead"
        console.print(f"{marker}{a.name}: the first choice's figure moves {a.moved:+.1%}; among the best {len(rec.top)}, "
                      f"{winner}", highlight=False)
    console.print("in your engine (the best configuration each engine runs):")
    for engine, c in rec.engine_best.items():
        if c is None:
            console.print(f"  {engine}: no configuration of the grid is one of its rules", highlight=False)
            continue
        console.print(f"  {engine}: {c.label}, {c.value:.3f} [{c.low:.3f}, {c.high:.3f}]\n      {c.engines[engine]}",
                      highlight=False, soft_wrap=True)

"""``simlab sweep``: every combination of a grid of policies and parameters on one trace,
simulated one request at a time or, with ``--rate``, served under load at each rate."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from simlab.cli import serve_options as so
from simlab.cli.app import EXIT_INTERRUPTED, app
from simlab.cli.output import Force, Strict, console, fmt, frame_output, meanings
from simlab.cli.serve import show_rates
from simlab.cli.simulate import TopologyOption, load_inputs, topology_label, trace_label, vllm_draft
from simlab.common.errors import SimlabError
from simlab.common.table_file import write_frame
from simlab.serve.scheduler import DEFAULT_MAX_BATCH, DEFAULT_TOKEN_BUDGET
from simlab.sim.devices import Topology

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table

# Columns of the printed table and their headers (every metric goes to --out).
SHOWN = {"speedup": "speedup", "cost": "calls\nvs SD", "mat": "kept\n/call",
         "mean_acceptance_length": "tokens\n/draft", "target_calls": "target\ncalls"}
PARETO_MARK = "★"
SERVING = "Serving under load (with --rate)"


class Executor(str, enum.Enum):
    LOCAL = "local"
    RAY = "ray"


@app.command()
def sweep(
    policy: Annotated[list[str], typer.Option("--policy", help="NAME[:KEY=VALUES,...]; VALUES is a value, a list a,b,c, "
                                              "a range 1..12 or 0.5..0.95:0.05. Repeatable.")] = [],
    grid: Annotated[Optional[Path], typer.Option("--grid", help="TOML grid file with [[policy]] tables.")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Trace directory.", show_default="the shipped trace")] = None,
    latency: Annotated[Optional[Path], typer.Option("--latency", help="Latency profile JSON.", show_default="the trace's own samples")] = None,
    topology: TopologyOption = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for stochastic replay (temperature > 0 traces).")] = 0,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write every metric of every configuration (.parquet or .csv).")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", help="Parallel workers (1: no pool).", show_default="all cores")] = None,
    executor: Annotated[Executor, typer.Option("--executor", help="local: a process pool; ray: Ray tasks.")] = Executor.LOCAL,
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Ray cluster to use.", show_default="$RAY_ADDRESS, else a local instance")] = None,
    cache: Annotated[Optional[Path], typer.Option("--cache", help="Directory of cached results.", show_default="$SIMLAB_CACHE/sweeps")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write cached results.")] = False,
    rate: Annotated[Optional[str], typer.Option("--rate", help="Serve every configuration under load at these Poisson arrival rates (requests per second, comma-separated) instead of one request at a time.", rich_help_panel=SERVING)] = None,
    requests: Annotated[int, typer.Option("--requests", help="With --rate: requests served at each rate.", rich_help_panel=SERVING)] = so.DEFAULT_REQUESTS,
    max_batch: Annotated[int, so.option("max_batch", SERVING)] = DEFAULT_MAX_BATCH,
    token_budget: Annotated[int, so.option("token_budget", SERVING)] = DEFAULT_TOKEN_BUDGET,
    gamma_by_batch: Annotated[Optional[str], so.option("gamma_by_batch", SERVING)] = None,
    sd_off_above: Annotated[Optional[int], so.option("sd_off_above", SERVING)] = None,
    smartspec: Annotated[Optional[int], so.option("smartspec", SERVING)] = None,
    adaptive_verify: Annotated[Optional[int], so.option("adaptive_verify", SERVING)] = None,
    mixed_prefill: Annotated[bool, so.option("mixed_prefill", SERVING)] = False,
    slo_ttft: Annotated[Optional[float], so.option("slo_ttft", SERVING)] = None,
    slo_tpot: Annotated[Optional[float], so.option("slo_tpot", SERVING)] = None,
    baseline: Annotated[bool, so.option("baseline", SERVING)] = True,
    force: Force = False,
    strict: Strict = False,
) -> None:
    """Simulate every combination of policies and parameters; mark the speed-vs-cost Pareto front.

    With --rate, serve every combination under load at each rate instead (simlab serve's
    engine: continuous batching, batched drafting and verification), and the same load
    without speculation (ad) once per rate; `simlab plot rates OUT` draws goodput and latency
    against rate.

    Finished configurations are cached by trace, latency model, seed, topology, policy and
    parameters (and the simulator's code; with --rate, the rate and serving settings too),
    so an interrupted or repeated sweep resumes.
    """
    from simlab.sweep import SweepInterrupted, combine, run_sweep
    from simlab.sweep.result_table import extrapolated_rows

    load = _serve_load(rate, requests, max_batch, token_budget, gamma_by_batch, sd_off_above, smartspec,
                       adaptive_verify, mixed_prefill, slo_ttft, slo_tpot, baseline, topology)
    if out is not None:
        frame_output(out, force)  # a bad path fails now, not after the sweep
    grids = combine(policy, grid)
    tr, lat = load_inputs(trace, latency)
    try:
        res = run_sweep(tr, grids, latency=lat, seed=seed, topology=topology, workers=workers,
                        executor=executor.value, ray_address=ray_address, cache=False if no_cache else (cache or True),
                        load=load)
    except SweepInterrupted as exc:  # said here: Typer turns Ctrl-C into an exit code and drops the message
        print(f"simlab: interrupted: {exc}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    table = res.table
    extrapolated = extrapolated_rows(table)
    if strict and extrapolated:
        raise SimlabError(f"--strict: {extrapolated}; probe the missing sizes and contexts, or drop --strict")
    if load is not None:
        show_rates(table, tr, table["latency"].iat[0], requests, seed, max_batch, load.slo)
    else:
        console.print(f"trace: {trace_label(tr)}")
        shown = topology_label(Topology(table["topology"].iat[0]), topology)
        console.print(f"latency: {table['latency'].iat[0]}; topology: {shown}; seed: {seed}")
        console.print(results_table(table, shown))
        console.print("what the columns are:")
        console.print(meanings(SHOWN, SHOWN), highlight=False)
    if extrapolated:
        console.print(f"[yellow]note:[/] {extrapolated}")
    if load is None:
        draft = vllm_draft(tr.manifest)
        best = best_fixed_k(table, draft) if draft else None
        if best is not None:
            console.print(f"vLLM, one request at a time: the fastest fixed-K row, {best[0]}, as --speculative-config "
                          f"'{json.dumps(best[1])}'", soft_wrap=True)
    console.print(f"{len(table)} configurations: {res.cached} from the cache, {res.computed} {'served' if load else 'simulated'}; "
                  f"{res.seconds:.1f} s with {res.workers} {executor.value} worker{'s' * (res.workers != 1)}"
                  + (f"; cached in {res.store}" if res.store else ""))
    if out is not None:
        console.print(f"wrote {write_frame(table, out)}")


def best_fixed_k(table: pd.DataFrame, draft: str) -> tuple[str, dict] | None:
    """The fastest row of a policy vLLM runs (sd, vllm) and its ``--speculative-config``, if any."""
    import pandas as pd

    from simlab.policies.vllm import FIXED_K, config_of

    rows = table[table["policy"].isin(list(FIXED_K))]
    if rows.empty:
        return None
    row = rows.loc[rows["speedup"].idxmax()]
    params = {k: row[k] for k in FIXED_K.values() if k in row.index and pd.notna(row[k])}
    config = config_of(str(row["policy"]), params, draft)
    return (str(row["label"]), config) if config else None


def _serve_load(rate, requests, max_batch, token_budget, gamma_by_batch, sd_off_above, smartspec, adaptive_verify,
                mixed_prefill, slo_ttft, slo_tpot, baseline, topology):
    """``--rate``'s load (None without it), every serving flag checked before anything runs;
    serving flags without ``--rate`` are an error rather than ignored."""
    from simlab.serve.batch_policy import BatchSpec, gamma_by_batch_pairs
    from simlab.serve.metrics import Slo
    from simlab.serve.rates import parse_rates
    from simlab.serve.scheduler import Scheduler
    from simlab.serve.workload import poisson_arrivals
    from simlab.sweep.serving import ServeLoad

    if rate is None:
        given = [flag for flag, value, default in (
            ("--requests", requests, so.DEFAULT_REQUESTS), ("--max-batch", max_batch, DEFAULT_MAX_BATCH),
            ("--token-budget", token_budget, DEFAULT_TOKEN_BUDGET), ("--gamma-by-batch", gamma_by_batch, None),
            ("--sd-off-above", sd_off_above, None), ("--smartspec", smartspec, None),
            ("--adaptive-verify", adaptive_verify, None),
            ("--mixed-prefill", mixed_prefill, False), ("--slo-ttft", slo_ttft, None),
            ("--slo-tpot", slo_tpot, None), ("--no-baseline", baseline, True)) if value != default]
        if given:
            raise SimlabError(f"{given[0]} sets how a serving sweep serves; add --rate R1,R2,...")
        return None
    if topology is not None:
        raise SimlabError("--topology sets how one request is simulated; a serving sweep (--rate) runs serve's engine, "
                          "which has no topology: drop one of them")
    rates = tuple(parse_rates(rate))
    poisson_arrivals(rates[0], requests)  # the lowest rate's arrivals fit the clock (the draw scales with 1 / rate)
    return ServeLoad(rates, requests, Scheduler(max_batch, token_budget, mixed_prefill),
                     BatchSpec(gamma_by_batch_pairs(gamma_by_batch) if gamma_by_batch else None, sd_off_above, smartspec,
                               adaptive_verify),
                     Slo(slo_ttft, slo_tpot), baseline)


def results_table(table: pd.DataFrame, topology: str) -> Table:
    from rich.table import Table

    gamma = table["reference_gamma"].iat[0]
    view = Table(title=f"sweep — topology {topology}; plain SD's best γ on this trace: {gamma}",
                 caption=f"{PARETO_MARK} Pareto-optimal: nothing else is faster at no more target calls, or uses fewer at "
                         "no less speed", header_style="bold")
    view.add_column(PARETO_MARK)
    view.add_column("policy", no_wrap=True)
    for header in SHOWN.values():
        view.add_column(header, justify="right")
    for row in table.itertuples(index=False):
        view.add_row(PARETO_MARK if row.pareto else "", row.label, *(fmt(k, getattr(row, k)) for k in SHOWN))
    return view

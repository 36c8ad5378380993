"""``simlab plot``: figures of sweeps, traces, timelines and live runs (PNG, SVG or PDF)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from simlab.cli.app import app
from simlab.cli.output import console, parse_params
from simlab.common.errors import SimlabError
from simlab.common.table_file import read_frame

plot_app = typer.Typer(help="Figures of sweeps, traces, timelines and live runs.", no_args_is_help=True)
app.add_typer(plot_app, name="plot")

Out = Annotated[Path, typer.Option("--out", "-o", help="Image to write; .png, .svg or .pdf.")]
Title = Annotated[Optional[str], typer.Option("--title", help="Figure title.", show_default="from the data")]


def _save(fig, out: Path) -> None:
    from simlab.plots import save

    console.print(f"wrote {save(fig, out)}")


@plot_app.command()
def frontier(
    results: Annotated[Path, typer.Argument(help="Sweep table from `simlab sweep --out`.")],
    out: Out,
    title: Title = None,
) -> None:
    """Speedup against cost, one series per policy, the Pareto front, sd at its best γ."""
    from simlab.plots.frontier import frontier_figure

    _save(frontier_figure(read_frame(results), title), out)


@plot_app.command()
def acceptance(
    results: Annotated[Path, typer.Argument(help="Sweep table from `simlab sweep --out`.")],
    out: Out,
    policy: Annotated[list[str], typer.Option("--policy", help="Plot only this policy; repeatable.",
                                              show_default="every policy")] = [],
    title: Title = None,
) -> None:
    """Per-position acceptance as vLLM reports it (accepted at position i / drafts), one line per configuration."""
    from simlab.plots.acceptance import acceptance_figure

    _save(acceptance_figure(read_frame(results), title, policy or None), out)


@plot_app.command()
def tau(
    results: Annotated[Path, typer.Argument(help="Sweep table from `simlab sweep --out`.")],
    out: Out,
    param: Annotated[str, typer.Option("--param", help="The parameter on the x axis.")] = "tau",
    policy: Annotated[Optional[str], typer.Option("--policy", help="Policy to plot.", show_default="the one sweeping --param")] = None,
    where: Annotated[list[str], typer.Option("--where", help="KEY=VALUE pinning another parameter; repeatable.")] = [],
    title: Title = None,
) -> None:
    """Speed and cost against a parameter (SPIDE Figure 6: τ), with sd's best speed and cost parity."""
    from simlab.plots.sensitivity import sensitivity_figure

    _save(sensitivity_figure(read_frame(results), param, policy, parse_params(where), title), out)


@plot_app.command()
def mapping(
    source: Annotated[Path, typer.Argument(help="A trace directory, or a mapping CSV (conf_low, conf_high, count, accepted).")],
    out: Out,
    seed: Annotated[int, typer.Option("--seed", help="Seed of stochastic replay (temperature > 0 traces).")] = 0,
    title: Title = None,
) -> None:
    """Acceptance rate and share of draft tokens per SPIDE confidence bin (SPIDE Figure 3)."""
    from simlab.plots.mapping import mapping_figure, trace_mapping
    from simlab.trace.io import read_trace
    from simlab.trace.synth import read_mapping_table

    if not source.exists():
        raise SimlabError(f"{source} not found; pass a trace directory or a mapping CSV")
    if source.is_dir():
        trace = read_trace(source)
        m = trace.manifest
        table, default = trace_mapping(trace, seed), f"{m.draft_model} -> {m.target_model}, {m.dataset} ({source.name})"
    else:
        table, default = read_mapping_table(source), source.stem
    _save(mapping_figure(table, title or default), out)


@plot_app.command()
def timeline(
    trace_json: Annotated[Path, typer.Argument(help="Chrome trace JSON from `simlab simulate --timeline` (or a live log).")],
    out: Out,
    start_ms: Annotated[Optional[float], typer.Option("--from-ms", help="Show from this time (ms).")] = None,
    end_ms: Annotated[Optional[float], typer.Option("--to-ms", help="Show up to this time (ms).")] = None,
    title: Title = None,
) -> None:
    """Per-device Gantt chart: one row per device, one bar per forward, coloured by kind."""
    from simlab.plots.timeline import timeline_figure
    from simlab.sim.timeline import read_chrome_trace

    name, slices = read_chrome_trace(trace_json)
    start, end = (None if t is None else t / 1e3 for t in (start_ms, end_ms))
    _save(timeline_figure(slices, title or name, start, end), out)


@plot_app.command()
def rates(
    results: Annotated[list[Path], typer.Argument(help="Rate sweeps from `simlab serve --rate R1,R2,... --out`; several are drawn together.")],
    out: Out,
    latency: Annotated[str, typer.Option("--latency", help="Latency on the right: tpot, ttft or e2e.")] = "tpot",
    title: Title = None,
) -> None:
    """Goodput and latency (p50, p90) against the request rate, one line per served policy."""
    from simlab.plots.serving import rates_figure

    _save(rates_figure([read_frame(r) for r in results], latency, title), out)


@plot_app.command()
def live(
    results: Annotated[Path, typer.Argument(help="Table with measured_METRIC and predicted_METRIC per prompt.")],
    out: Out,
    metric: Annotated[str, typer.Option("--metric", help="METRIC of the measured_/predicted_ columns.")] = "tokens_per_s",
    title: Title = None,
) -> None:
    """Measured against predicted per prompt, with the line measured = predicted."""
    from simlab.plots.live import live_figure

    _save(live_figure(read_frame(results), metric, title), out)

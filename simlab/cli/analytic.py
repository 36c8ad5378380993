"""``simlab analytic``: Leviathan et al.'s closed forms, alone or beside a trace's simulation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from simlab.cli.app import app
from simlab.cli.output import console, print_json


@app.command()
def analytic(
    alpha: Annotated[float, typer.Option("--alpha", help="Per-token acceptance probability α.")] = 0.8,
    c: Annotated[float, typer.Option("--c", help="Draft step cost / target step cost.")] = 0.1,
    gamma: Annotated[int, typer.Option("--gamma", help="Draft length γ.")] = 5,
    verify_slope: Annotated[float, typer.Option("--verify-slope", help="Extra target steps per extra verified token.")] = 0.0,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Compare the closed forms with the simulator on this trace (α, costs and acceptance runs from the trace; --alpha/--c/--gamma are ignored).")] = None,
    latency: Annotated[Optional[Path], typer.Option("--latency", help="With --trace: a latency profile.", show_default="the trace's own samples")] = None,
    max_gamma: Annotated[int, typer.Option("--max-gamma", help="With --trace: γ = 1..this.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="With --trace: seed of stochastic replay.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Expected tokens per round, walltime speedup and the optimal γ under i.i.d. acceptance;
    with --trace, the same beside the simulator and a run-length model, plus h(k), s and TPL."""
    if trace is not None:
        return _trace_report(trace, latency, max_gamma, seed, json_out)
    from simlab.analytic.closed_form import analyse

    res = analyse(alpha, c, gamma, verify_slope)
    if json_out:
        print_json(res.to_dict())
        return
    console.print(f"α={alpha}, c={c}, γ={gamma}, verify slope={verify_slope}")
    console.print(f"  expected tokens per round (1-α^(γ+1))/(1-α): {res.expected_tokens:.4f}")
    console.print(f"  walltime speedup: {res.speedup:.4f}x")
    console.print(f"  optimal γ: {res.optimal_gamma} (speedup {res.optimal_speedup:.4f}x)")


def _trace_report(trace: Path, latency: Optional[Path], max_gamma: int, seed: int, json_out: bool) -> None:
    from rich.table import Table

    from simlab.analytic.on_trace import analyse_trace
    from simlab.cli.simulate import load_inputs, trace_label
    from simlab.sim.run import Simulator

    tr, lat = load_inputs(trace, latency)
    sim = Simulator(tr, lat, seed=seed)
    a = analyse_trace(sim, max_gamma)
    if json_out:
        print_json({"trace": str(tr.path), "trace_kind": tr.manifest.kind, "latency": sim.latency.name, **a.to_dict()})
        return
    console.print(f"trace: {trace_label(tr)}")
    draft = f"draft step {1e3 * a.t_draft:.2f} ms, " if a.t_draft == a.t_draft else ""
    console.print(f"latency: {sim.latency.name}; at context {a.context_len}: {draft}target step {1e3 * a.t_target:.2f} ms")
    console.print(f"per-position acceptance α = {a.alpha:.4f} (the draft's token given the true prefix, over "
                  f"{a.drafted_positions} drafted positions; not simulate's acceptance_rate, see 'acc sim'); "
                  "by position in the run (all starts): " + " ".join(f"{x:.2f}" for x in a.position_acceptance))
    if a.gammas:
        t = Table(title="vanilla SD: closed forms vs the simulator (tokens per round incl. bonus; speedup vs AD)",
                  header_style="bold")
        for col in ("γ", "tokens iid", "tokens runs", "tokens sim", "speedup iid", "speedup runs", "speedup sim",
                    "iid err", "runs err", "acc sim"):
            t.add_column(col, justify="right")
        for g in a.gammas:
            t.add_row(str(g.gamma), f"{g.tokens_iid:.3f}", f"{g.tokens_runs:.3f}", f"{g.tokens_sim:.3f}",
                      f"{g.speedup_iid:.3f}", f"{g.speedup_runs:.3f}", f"{g.speedup_sim:.3f}",
                      f"{100 * g.err_iid:+.1f}%", f"{100 * g.err_runs:+.1f}%", f"{g.acceptance_sim:.3f}")
        console.print(t)
        console.print("iid: Leviathan's E(α, γ) with mean α; runs: run lengths from the trace, rounds starting after a "
                      "rejection or after a fully accepted round; sim: the replay. Closed forms price rounds at the "
                      "typical context. acc sim: simulate's acceptance_rate = accepted / drafted for sd at γ; drafts "
                      "after a round's first rejection count as drafted, so it is below α and depends on γ.")
        t = Table(title="h-rule threshold h(k) = (T_v − T_d(k)) / T_r, T_r = T_v (acceptance-guided SD, eq. 12)",
                  header_style="bold")
        for col in ("k drafted", "T_d(k) ms", "T_v(k+1) ms", "T_r ms", "h(k)"):
            t.add_column(col, justify="right")
        for h in a.h:
            t.add_row(str(h.k), f"{1e3 * h.t_draft_k:.2f}", f"{1e3 * h.t_verify:.2f}", f"{1e3 * h.t_reject:.2f}",
                      f"{h.h:.3f}")
        console.print(t)
        corun = f"; co-running: s = {a.window_corun}" if a.window_corun is not None else ""
        console.print(f"SPIDE eq. 6 from one-token costs, s = ⌊v_q/v_p⌋ = ⌊T_target(1)/T_draft⌋: s = {a.window}{corun}")
        corun = f"; co-running: s = {a.policy_window_corun}" if a.policy_window_corun is not None else ""
        console.print(f"window spide/pearl use when none is given (largest s with s draft steps ≤ an s-token verify; "
                      f"equals eq. 6 when verify cost is flat in k): s = {a.policy_window}{corun}; this run's "
                      f"topology: {a.topology}")
    if a.tpl is not None:
        best_layer, best_d, best = a.tpl.best
        verdict = (f"best ℓ={best_layer}, d={best_d} ({best:.4f})" if best_d else
                   "best d=0: no exit layer beats plain decoding")
        t = Table(title=f"DEL TPL(ℓ, d) = (1−α_ℓ^(d+1)) / ((1−α_ℓ)(dℓ+L)), L = {a.tpl.n_layers}; {verdict}",
                  header_style="bold")
        t.add_column("ℓ", justify="right")
        t.add_column("α_ℓ", justify="right")
        for d in range(len(a.tpl.values[0])):
            t.add_column(f"d={d}", justify="right")
        for layer, alpha_l, row in zip(a.tpl.layers, a.tpl.alpha, a.tpl.values):
            t.add_row(str(layer), f"{alpha_l:.3f}", *(f"{v:.4f}" for v in row))
        console.print(t)
    for note in a.notes:
        console.print(f"[yellow]note:[/] {note}")

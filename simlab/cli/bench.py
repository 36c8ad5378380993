"""``simlab bench``: how fast the simulator runs."""

from __future__ import annotations

import platform
from typing import Annotated

import typer

from simlab.cli.app import app
from simlab.cli.output import console, parse_params, print_json


@app.command()
def bench(
    policy: Annotated[list[str], typer.Option("--policy", help="Policy to time, as NAME or NAME:KEY=VALUE,...; repeatable.")] = ["sd:gamma=5"],
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens in the synthetic i.i.d. benchmark trace.")] = 200_000,
    alpha: Annotated[float, typer.Option("--alpha", help="Acceptance probability of the benchmark trace.")] = 0.8,
    repeats: Annotated[int, typer.Option("--repeats", help="Runs per policy; the fastest counts.")] = 3,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Simulated tokens per CPU-second on a synthetic i.i.d. trace (one core, best of N runs)."""
    from simlab.bench import bench_policy, bench_trace
    from simlab.serve.bench import bench_serve_row
    from simlab.sim.run import Simulator

    sim = Simulator(bench_trace(tokens, alpha))
    rows = []
    for spec in policy:
        name, _, rest = spec.partition(":")
        params = parse_params(p for p in rest.split(",") if p)
        r = bench_policy(sim, name, params, repeats)
        rows.append({"policy": name, "params": params, "tokens": r.tokens, "cpu_seconds": r.cpu_seconds,
                     "tokens_per_cpu_second": r.tokens_per_cpu_second})
    rows.append(bench_serve_row())  # 10,000 requests of 256 tokens under `simlab serve` (simlab/serve/bench.py)
    machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    if json_out:
        print_json({"machine": machine, "alpha": alpha, "results": rows})
        return
    console.print(f"simulator speed on a synthetic i.i.d. trace (alpha={alpha}), best of {repeats}; {machine}")
    for row in rows:
        params = ",".join(f"{k}={v}" for k, v in row["params"].items())
        console.print(f"  {row['policy']}({params}): {row['tokens']:,} tokens in {row['cpu_seconds']:.3f} CPU-s "
                      f"= {row['tokens_per_cpu_second']:,.0f} tokens per CPU-second")

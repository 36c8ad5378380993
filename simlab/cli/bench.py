"""``simlab bench``: how fast the simulator runs against its goals, or (``--sweep``) how long a sweep takes."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from simlab.cli.app import app
from simlab.cli.commands import COMMANDS
from simlab.cli.output import console, print_json

SERVE_GOAL_CPU_SECONDS = 60  # the serving issue's goal: 10,000 requests of 256 tokens in under a minute
STARTUP_GOAL = 0.3  # `simlab --help` and every command's --help, CPU-seconds of the whole process (issue 43)
SIMULATE_STARTUP_GOAL = 0.5  # `simlab simulate` on the default trace, CPU-seconds of the whole process


@dataclasses.dataclass(frozen=True)
class StartupResult:
    """CPU-seconds of one ``simlab`` process, best of the repeats (the least disturbed)."""

    what: str
    command: tuple[str, ...]
    cpu_seconds: float
    wall_seconds: float
    goal: float

    @property
    def passed(self) -> bool:
        return self.cpu_seconds < self.goal


def startup_env() -> dict[str, str]:
    """The environment the timed processes run in: this one without ``PYTHONDONTWRITEBYTECODE``,
    so that they time what a user waits for from the second run on, simlab's modules read compiled
    (a process that may not write them compiles every module from source: on a quiet 2-core box
    `simulate` took 0.39-0.46 s wall without .pyc against 0.32-0.40 with them, docs/benchmarks.md)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def time_startup(repeats: int = 5) -> list[StartupResult]:
    """How long a user waits for an answer: ``simlab --help``, the slowest command's ``--help``
    (every command's is timed) and ``simlab simulate`` on the default trace, each a whole process
    (``python -m simlab``), in CPU-seconds, best of ``repeats``; the goals are issue 43's."""
    from simlab.sim.bench import children_cpu_seconds

    env = startup_env()

    def best(args: tuple[str, ...]) -> tuple[float, float]:
        runs = []
        for _ in range(repeats):
            t0, cpu0 = time.perf_counter(), children_cpu_seconds()
            subprocess.run([sys.executable, "-m", "simlab", *args], check=True, stdout=subprocess.DEVNULL, env=env)
            runs.append((children_cpu_seconds() - cpu0, time.perf_counter() - t0))
        return min(runs)

    results = [StartupResult("start-up: simlab --help", ("--help",), *best(("--help",)), STARTUP_GOAL)]
    helps = [(name, *best((*name.split(), "--help"))) for name in COMMANDS]
    name, cpu, wall = max(helps, key=lambda h: h[1])
    results.append(StartupResult(f"start-up: slowest command --help ({name})", (name, "--help"), cpu, wall, STARTUP_GOAL))
    results.append(StartupResult("start-up: simulate on the default trace", ("simulate",), *best(("simulate",)),
                                 SIMULATE_STARTUP_GOAL))
    return results


def _machine() -> str:
    return f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python {platform.python_version()}"


@app.command()
def bench(
    policy: Annotated[list[str], typer.Option("--policy", help="Policy to time, as NAME or NAME:KEY=VALUE,...; repeatable.", show_default="every policy at its defaults")] = [],
    tokens: Annotated[int, typer.Option("--tokens", min=1, help="Tokens of the synthetic trace that the whole-process `simulate` runs on.")] = 1_000_000,
    policy_tokens: Annotated[int, typer.Option("--policy-tokens", min=1, help="Tokens of the synthetic trace each policy is timed on.")] = 200_000,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timings per policy; the fastest counts.")] = 3,
    sweep: Annotated[bool, typer.Option("--sweep", help="Time a whole uncached sweep per worker count instead.")] = False,
    grid: Annotated[list[str], typer.Option("--grid", help="With --sweep: grid spec as --policy of `simlab sweep`; repeatable.", show_default="10 policies x 10 values")] = [],
    trace: Annotated[Optional[Path], typer.Option("--trace", help="With --sweep: trace directory.", show_default="the shipped trace")] = None,
    workers: Annotated[list[int], typer.Option("--workers", min=1, help="With --sweep: worker count to time; repeatable.", show_default="1 and 2")] = [],
    executor: Annotated[str, typer.Option("--executor", help="With --sweep: local or ray.")] = "local",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Simulator speed beside its goals: whole-process `simulate` on a 1M-token synthetic trace
    (wall clock), every policy and fixed-γ SD in simulated tokens per CPU-second (best of N);
    PASS or FAIL per figure; and start-up: CPU-seconds of `simlab --help`, every command's --help and
    `simulate` on the default trace. With --sweep: the wall time of a whole sweep per worker count."""
    from rich.table import Table

    if sweep:
        _bench_sweep(grid, trace, workers or [1, 2], executor, json_out)
        return
    from simlab.cli.output import parse_params
    from simlab.serve.bench import bench_serve_row
    from simlab.sim.bench import run_bench

    specs = []
    for spec in policy:
        name, _, rest = spec.partition(":")
        specs.append((name, parse_params(p for p in rest.split(",") if p)))
    rows = []
    table = Table(title=f"simulator speed, best of {repeats}; {_machine()}", title_justify="left")
    for col in ("figure", "M tokens/s", "goal", "", "tokens", "seconds", "trace"):
        table.add_column(col, justify="left" if col in ("figure", "trace") else "right")

    def record(r) -> None:
        rows.append({"figure": r.what, "trace": r.trace, "tokens": r.tokens, "seconds": r.seconds,
                     "cpu_seconds": r.cpu_seconds, "tokens_per_second": r.tokens_per_second, "goal": r.goal,
                     "passed": r.passed, "judged": r.judged})
        per = "wall-s" if r.cpu_seconds is not None else "CPU-s"
        seconds = f"{r.seconds:.2f}" + (f" ({r.cpu_seconds:.2f} CPU)" if r.cpu_seconds is not None else "")
        verdict = ("[green]PASS[/]" if r.passed else "[red]FAIL[/]") if r.judged else "not judged"
        table.add_row(r.what, f"{r.tokens_per_second / 1e6:.3f} /{per}", f">= {r.goal / 1e6:.1f}" if r.judged else "",
                      verdict, f"{r.tokens:,}", seconds, r.trace)

    run_bench(tokens, policy_tokens, specs or None, repeats, progress=record)
    serve = bench_serve_row()  # 10,000 requests of 256 tokens under `simlab serve` (simlab/serve/bench.py)
    served = serve["cpu_seconds"] < SERVE_GOAL_CPU_SECONDS
    table.add_row(f"serve sd γ={serve['params']['gamma']}, {serve['params']['requests']:,} requests",
                  f"{serve['tokens_per_cpu_second'] / 1e6:.3f} /CPU-s", f"< {SERVE_GOAL_CPU_SECONDS} s",
                  "[green]PASS[/]" if served else "[red]FAIL[/]", f"{serve['tokens']:,}", f"{serve['cpu_seconds']:.2f}",
                  "synthetic, Poisson arrivals")
    startup = time_startup(max(repeats, 5))
    for r in startup:
        table.add_row(r.what, "", f"< {r.goal:g} CPU-s", "[green]PASS[/]" if r.passed else "[red]FAIL[/]", "",
                      f"{r.wall_seconds:.2f} ({r.cpu_seconds:.2f} CPU)", "simlab " + " ".join(r.command))
    if json_out:
        print_json({"machine": _machine(), "repeats": repeats, "results": rows, "serve": {**serve, "passed": served},
                    "startup": [{**dataclasses.asdict(r), "passed": r.passed} for r in startup]})
    else:
        console.print(table)


def _bench_sweep(grid: list[str], trace: Optional[Path], workers: list[int], executor: str, json_out: bool) -> None:
    from simlab.common.locations import default_trace
    from simlab.sweep.bench import DEFAULT_GRID, time_sweeps
    from simlab.sweep.grid import combine
    from simlab.trace.io import read_trace

    tr = read_trace(trace or default_trace())
    grids = combine(grid or list(DEFAULT_GRID))
    timings = time_sweeps(tr, grids, workers, executor)
    if json_out:
        print_json({"machine": _machine(), "trace": str(tr.path),
                    "results": [t.__dict__ for t in timings]})
        return
    console.print(f"trace {tr.path} ({tr.n_prompts} prompts, {tr.n_positions} positions); "
                  f"{sum(len(g) for g in grids)} configurations; {_machine()}")
    base = None
    for t in timings:
        base = base or t.seconds
        console.print(f"  {t.workers} {executor} worker{'s' * (t.workers != 1)}: {t.configurations} configurations in "
                      f"{t.seconds:5.1f} s = x{base / t.seconds:.2f} the first line's speed; simulation CPU time "
                      f"{t.cpu_seconds:.1f} s, {t.cpu_seconds / t.seconds:.2f} cores busy on average "
                      f"(load average {t.load_before:.1f} before)", highlight=False)

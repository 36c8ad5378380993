"""How long a sweep takes, and how it scales with workers: ``python -m simlab.sweep.bench``.

The target (issue 7): 10 policies x 10 parameter values over the default trace in under a
minute on a 2-core machine; the default grid is exactly that, each policy over ten values of
the parameter a user tunes first. Pass ``--policy`` (as for ``simlab sweep``) to time another
grid. Each figure is the wall time of a whole
uncached sweep as a user meets it: loading nothing (the trace is read once, up front), but
building the simulator, working out vanilla SD's best γ, starting the workers and simulating
every configuration. The machines are shared; the load average is printed beside the times.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from simlab.paths import default_trace
from simlab.sweep.grid import combine
from simlab.sweep.runner import run_sweep
from simlab.trace.io import read_trace

# 10 policies x 10 values of each one's main parameter.
DEFAULT_GRID = (
    "sd:gamma=1..10",
    "hf-heuristic:gamma=1..10",
    "hf-confidence:threshold=0.05..0.95:0.1",
    "svip:entropy_threshold=0.1..1.0:0.1",
    "dv:threshold=0.5..0.95:0.05",
    "specdecpp:threshold=0.05..0.95:0.1",
    "ags:max_draft=1..10",
    "pacer:block=1..10",
    "pearl:window=1..10",
    "spide:tau=0.5..0.95:0.05",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simlab.sweep.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", help="trace directory [default: the shipped trace]")
    parser.add_argument("--policy", action="append", help="grid spec as for `simlab sweep`; repeatable")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to time [1 2]")
    parser.add_argument("--executor", default="local", choices=("local", "ray"))
    args = parser.parse_args(argv)

    trace = read_trace(args.trace or default_trace())
    grids = combine(args.policy or list(DEFAULT_GRID))
    print(f"trace {trace.path} ({trace.n_prompts} prompts, {trace.n_positions} positions); "
          f"{sum(len(g) for g in grids)} configurations; {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    base = None
    for workers in args.workers:
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        res = run_sweep(trace, grids, workers=workers, executor=args.executor, cache=False, progress=False)
        seconds = time.perf_counter() - t0
        base = base or seconds
        cpu = res.table["cpu_seconds"].sum()
        print(f"  {workers} {args.executor} worker{'s' * (workers != 1)}: {len(res.table)} configurations in "
              f"{seconds:5.1f} s = x{base / seconds:.2f} the first line's speed; simulation CPU time "
              f"{cpu:.1f} s, {cpu / seconds:.2f} cores busy on average (load average {load:.1f} before)")


if __name__ == "__main__":
    main()

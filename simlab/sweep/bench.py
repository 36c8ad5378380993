"""How long a sweep takes, and how it scales with workers: ``simlab bench --sweep``.

The target (issue 7): 10 policies x 10 parameter values over the default trace in under a
minute on a 2-core machine; the default grid is exactly that, each policy over ten values of
the parameter a user tunes first (``--grid``, as ``--policy`` of ``simlab sweep``, times
another). Each figure is the wall time of a whole uncached sweep as a user meets it: loading
nothing (the trace is read once, up front), but building the simulator, working out vanilla
SD's best γ, starting the workers and simulating every configuration. The machines are
shared; the load average is reported beside the times.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterator

from simlab.sweep.grid import PolicyGrid
from simlab.sweep.runner import run_sweep
from simlab.trace.io import Trace

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


@dataclass(frozen=True)
class SweepTiming:
    """One uncached sweep: its wall time, and the CPU time its simulations took."""

    workers: int
    configurations: int
    seconds: float
    cpu_seconds: float
    load_before: float  # the machine's 1-minute load average when it started


def time_sweeps(trace: Trace, grids: list[PolicyGrid], workers: list[int], executor: str = "local") -> Iterator[SweepTiming]:
    """Run the whole sweep once per worker count, uncached, as a user meets it."""
    for n in workers:
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        res = run_sweep(trace, grids, workers=n, executor=executor, cache=False, progress=False)
        yield SweepTiming(n, len(res.table), time.perf_counter() - t0, float(res.table["cpu_seconds"].sum()), load)

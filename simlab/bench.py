"""Simulator speed: simulated tokens per CPU-second, the figure the foundation issue asks for.

CPU time (``time.process_time``) of one process is what is counted, so the figure is per core
and does not depend on other work on the machine as much as wall time would; the machines
are shared, so compare figures measured in one run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from simlab.sim.run import Simulator
from simlab.trace.synth import SynthSpec, synth_trace


@dataclass(frozen=True)
class BenchResult:
    policy: str
    params: dict
    tokens: int
    cpu_seconds: float
    repeats: int

    @property
    def tokens_per_cpu_second(self) -> float:
        return self.tokens / self.cpu_seconds


def bench_trace(tokens: int, alpha: float = 0.8, seed: int = 0):
    prompts = max(1, tokens // 10_000)
    return synth_trace(SynthSpec(alpha=alpha, prompts=prompts, tokens=tokens // prompts + 1, seed=seed), command="bench")


def bench_policy(sim: Simulator, policy: str, params: dict, repeats: int = 3) -> BenchResult:
    """Best of ``repeats`` runs (the least disturbed by other work)."""
    sim.run(policy, params, with_cost=False)  # warm the latency grid and caches
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        t0 = time.process_time()
        res = sim.run(policy, params, with_cost=False)
        best = min(best, time.process_time() - t0)
        tokens = res.summary.tokens
    return BenchResult(policy, params, tokens, best, repeats)

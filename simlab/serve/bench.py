"""How fast ``simlab serve`` runs: requests and tokens per CPU-second on a synthetic trace.

The figure the serving issue asks for is 10,000 requests of 256 tokens in under a minute on
one core; ``simlab bench`` prints it. CPU time of this process is counted (as for the
single-request figure in :mod:`simlab.sim.bench`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from simlab.serve.run import ServeConfig, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.serve.workload import poisson_arrivals
from simlab.sim.run import Simulator
from simlab.trace.synth import SynthSpec, synth_trace

BENCH_PROMPTS = 100  # distinct prompts of the synthetic trace, cycled over the requests


@dataclass(frozen=True)
class ServeBench:
    requests: int
    tokens: int
    rate: float
    max_batch: int
    mean_batch: float
    cpu_seconds: float

    @property
    def requests_per_cpu_second(self) -> float:
        return self.requests / self.cpu_seconds


def bench_serve(requests: int = 10_000, tokens: int = 256, rate: float = 40.0, max_batch: int = 32,
                gamma: int = 4, alpha: float = 0.8, seed: int = 0) -> ServeBench:
    """Serve ``requests`` requests of ``tokens`` tokens (Poisson at ``rate`` per second, sd with
    ``gamma``) on a synthetic i.i.d. trace with the synthetic latency model; one run."""
    trace = synth_trace(SynthSpec(alpha=alpha, prompts=BENCH_PROMPTS, tokens=tokens, seed=seed), command="bench")
    sim = Simulator(trace)
    arrivals = poisson_arrivals(rate, requests, seed)
    config = ServeConfig("sd", {"gamma": gamma}, Scheduler(max_batch))
    t0 = time.process_time()
    run = serve_once(sim, arrivals, config, "sd", {"gamma": gamma})
    seconds = time.process_time() - t0
    stats = run.stats
    return ServeBench(requests, int(run.frame["tokens"].sum()), rate, max_batch,
                      stats.batch_sizes / stats.decode_steps, seconds)


def bench_serve_row() -> dict:
    """The serving figure as a row of ``simlab bench``'s table (its own keys beside the shared ones)."""
    r = bench_serve()
    return {"policy": "serve sd", "params": {"gamma": 4, "requests": r.requests, "max_batch": r.max_batch,
                                             "rate": r.rate}, "tokens": r.tokens, "cpu_seconds": r.cpu_seconds,
            "tokens_per_cpu_second": r.tokens / r.cpu_seconds, "requests_per_cpu_second": r.requests_per_cpu_second}

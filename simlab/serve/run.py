"""Serving a trace under load: the entry point of ``simlab serve``, the tests and the bench.

Request i replays the trace's prompt i mod N (prompts in prompt_id order, cycled), so every
request meets the acceptance outcomes its prompt recorded, under its own policy object. The
same arrivals are served a second time without speculation (policy ``ad``) for the speedup
at that load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd
import simpy

from simlab.common.errors import SimlabError
from simlab.common.metrics import PositionStats
from simlab.latency.batch import BatchLatency
from simlab.latency.priced import Extrapolated
from simlab.latency.vllm_step import RULE as VLLM_RULE
from simlab.policies import REGISTRY, make_policy
from simlab.serve.adaptive_verify import AdaptiveVerify, check_inner
from simlab.serve.batch_policy import BatchSpec, CappedPolicy
from simlab.serve.engine import Engine, EngineStats
from simlab.serve.metrics import Slo, request_frame, speedups, summarize
from simlab.serve.request import ServedRequest
from simlab.serve.scheduler import Scheduler
from simlab.serve.vllm_engine import StoppingPolicy, VllmEngine, server_k
from simlab.serve.vllm_scheduler import VllmScheduler
from simlab.sim.devices import Slice
from simlab.sim.executor import shadow_heads
from simlab.sim.run import Simulator
from simlab.trace.replay import PromptReplay

BASELINE_POLICY = "ad"


@dataclass(frozen=True)
class ServeConfig:
    policy: str = "sd"
    params: dict[str, Any] = field(default_factory=dict)
    scheduler: Scheduler | VllmScheduler = field(default_factory=Scheduler)  # VllmScheduler: vLLM's (vllm_engine.py)
    batch: BatchSpec = field(default_factory=BatchSpec)
    slo: Slo = field(default_factory=Slo)


@dataclass
class ServeRun:
    """One policy served on one arrival sequence."""

    policy: str
    params: dict[str, Any]
    batch_policy: str
    requests: list[ServedRequest]
    frame: pd.DataFrame
    summary: dict
    positions: PositionStats
    stats: EngineStats
    slices: list[Slice]
    priced: Extrapolated = field(default_factory=Extrapolated)  # the engine's forwards (simlab.latency.priced)
    batch: object = None  # the batch-level policy after the run (what adaptive verification's fit learnt)


@dataclass
class ServeResult:
    run: ServeRun
    baseline: ServeRun | None
    latency_rule: str
    extrapolated: bool

    @property
    def priced(self) -> Extrapolated:
        """The forwards the run and its baseline priced, and those past the measured latencies."""
        out = Extrapolated()
        for run in (self.run, self.baseline):
            if run is not None:
                out += run.priced
        return out

    @property
    def speedups(self) -> dict:
        return speedups(self.run.summary, self.baseline.summary) if self.baseline else {}


def check_policy(name: str) -> None:
    cls = REGISTRY.get(name)
    if cls is not None and cls.parallel:
        raise SimlabError(f"serve does not batch parallel policies ({name}): a parallel round overlaps draft and "
                          "target forwards, which a lock-step batch cannot; use a serial policy")
    if cls is not None and cls.looks_up:
        raise SimlabError(f"serve does not batch lookup rounds yet ({name}); simulate it with simlab simulate")


def serve_once(sim: Simulator, arrivals: Sequence[float], config: ServeConfig, policy: str,
               params: dict[str, Any], record: bool = False, latency: BatchLatency | None = None,
               prompts: Sequence[PromptReplay] | None = None) -> ServeRun:
    """Serve ``arrivals`` with every request under its own ``policy`` object; ``prompts``: replays
    to serve instead of the simulator's (acceptance imposed on them: :mod:`simlab.serve.synthetic`)."""
    if not arrivals:
        raise SimlabError("nothing to serve: no arrivals")
    check_policy(policy)
    context = sim.context()
    built = make_policy(policy, context, **params)  # bad parameters fail before anything runs
    vllm = isinstance(config.scheduler, VllmScheduler)
    k = server_k(built) if vllm else 0
    # vLLM drafts and counts past each prompt's end: its scheduler's requests replay the path run
    # that far (trace/past_end.py), as simulate does for the vllm policy
    if prompts is None:
        prompts = (sim.past_end_replay(built.past_end) if vllm and built.past_end else sim.replay).prompts
    config.scheduler.check(max(p.prompt_len for p in prompts[: len(arrivals)]), *((k,) if vllm else ()))
    latency = latency or BatchLatency(sim.latency)
    longest = max(p.budget for p in prompts) - 2  # the longest draft a round can make
    batch_policy = config.batch.build(latency, longest) if policy != BASELINE_POLICY else BatchSpec().build(latency)
    if isinstance(batch_policy, AdaptiveVerify):
        check_inner(built)
    env = simpy.Environment()
    wrap = StoppingPolicy if vllm else CappedPolicy
    requests = [ServedRequest(i, prompts[i % len(prompts)], wrap(make_policy(policy, context, **params)), t)
                for i, t in enumerate(arrivals)]
    heads = shadow_heads(sim.latency, sim.trace.manifest, requests[0].policy.inner)
    engine = (VllmEngine(env, latency, config.scheduler, k, batch_policy, record) if vllm
              else Engine(env, latency, config.scheduler, batch_policy, record, heads))

    def arrive():
        for r in requests:
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            r.arrival = env.now  # now + (arrival - now) can be an ulp off: arrival is the clock's time
            engine.submit(r)

    env.process(arrive())
    env.process(engine.run(len(requests)))
    env.run()
    frame = request_frame(engine.finished, config.slo)
    return ServeRun(policy, requests[0].policy.describe(), batch_policy.name, requests, frame, summarize(frame), engine.positions, engine.stats,
                    engine.slices, engine.priced, batch_policy)


def serve(sim: Simulator, arrivals: Sequence[float], config: ServeConfig, baseline: bool = True,
          record: bool = False) -> ServeResult:
    """Serve the configured policy and, unless ``baseline`` is false, the same load without
    speculation."""
    latency = BatchLatency(sim.latency)
    run = serve_once(sim, arrivals, config, config.policy, config.params, record, latency)
    base = serve_once(sim, arrivals, config, BASELINE_POLICY, {}, latency=latency) if baseline else None
    return ServeResult(run, base, latency_rule(config, latency), latency.extrapolated)


def latency_rule(config: ServeConfig, latency: BatchLatency) -> str:
    """How the engine prices its steps: vLLM's scheduler prices a step by its tokens
    (:mod:`simlab.latency.vllm_step`), simlab's by its forwards (:mod:`simlab.latency.batch`)."""
    return VLLM_RULE if isinstance(config.scheduler, VllmScheduler) else latency.rule

"""Simulating a policy on a trace: the entry point used by the CLI, sweeps and notebooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from simlab.common.metrics import SUMMARY_KEYS, PositionStats, Summary, total
from simlab.common.params import check_seed
from simlab.latency.model import LatencyModel, TableLatency
from simlab.policies import PolicyContext, make_policy
from simlab.policies.base import AcceptancePredictor
from simlab.policies.early_exit import Del
from simlab.policies.fixed import VanillaSD
from simlab.policies.lookup import Ngram, PromptLookup
from simlab.policies.spide import Spide
from simlab.sim.context import policy_context, tabulated, typical_context_len
from simlab.sim.devices import Slice, Topology
from simlab.sim.executor import SimExecutor, warn_once
from simlab.sim.extrapolation import baseline
from simlab.sim.trees import TreeRounds
from simlab.sim.vanilla import FixedGammaSD
from simlab.trace.io import Trace
from simlab.trace.past_end import extended
from simlab.trace.replay import TraceReplay
from simlab.trace.tree_replay import rank_acceptance

# Vanilla SD's γ grid for the cost reference ("SD at its best γ", SPIDE §4.1 (ii), Table 17
# searched up to 13); wide enough that the optimum is not at its edge on high-acceptance traces.
REFERENCE_GAMMAS = tuple(range(1, 25))


@dataclass
class SimResult:
    policy: str
    params: dict[str, Any]
    summary: Summary
    per_prompt: pd.DataFrame
    positions: PositionStats
    timeline: list[Slice] = field(default_factory=list)
    tokens: dict[int, list[int]] | None = None


@dataclass(frozen=True)
class Reference:
    """Vanilla SD at its best γ on this trace: the denominator of ``cost``."""

    gamma: int
    speedup: float
    target_calls: int
    per_prompt_calls: dict[int, int]


# Engines whose timed verification also runs the draft over the verified tokens (llama.cpp's
# keeps the draft's cache in step; vLLM's draft forward over them is inside its step's sample,
# simlab.engines.vllm.steps): no round of theirs pays a catch-up on top.
VERIFY_FEEDS_DRAFT = ("llama.cpp", "vllm")


def latency_of(trace: Trace) -> TableLatency:
    """The latency model of a trace's own measured samples. A llama.cpp trace whose trace tool
    timed no plain decoding step (``target_step``: recorded before 2026-11-28) prices AD with
    one-token verifications, which also run the draft: it says so on stderr, once per process
    and trace."""
    name = f"{trace.path.name if trace.path else 'trace'} samples"
    engine = trace.manifest.extra.get("engine")
    llama = engine == "llama.cpp"
    if llama and not (trace.latency["op"] == "target_step").any():
        warn_once(f"simlab: warning: {name}: this llama.cpp trace has no plain decoding steps (target_step), so "
                  "its AD baseline is priced as one-token verifications, which also run the draft: speedups come "
                  "out high. Time its steps again: simlab llama-cpp record --out TRACE --reprobe")
    return TableLatency.from_samples(trace.latency, name=name, hardware=trace.manifest.hardware,
                                     draft_layer=trace.manifest.draft_layer,
                                     verify_feeds_draft=engine in VERIFY_FEEDS_DRAFT)


class Simulator:
    """A trace, a latency model and a seed, ready to simulate any number of policies."""

    def __init__(
        self,
        trace: Trace,
        latency: LatencyModel | None = None,
        seed: int = 0,
        topology: Topology | str | None = None,
        predictor: AcceptancePredictor | None = None,
    ):
        """``topology``: None (the default) simulates the topology the trace was recorded in."""
        self.trace = trace
        self.predictor = predictor  # a trained acceptance predictor for the policies that use one
        model = latency or latency_of(trace)
        self.seed = check_seed(seed)
        self.topology = Topology(topology) if topology is not None else trace.manifest.recorded_topology()
        # one-device runs price parallel rounds with co-running latencies; without such
        # measurements the solo figures stand in (optimistic), and results say so.
        self.corun_measured = bool(getattr(model, "has_corun", False))
        self.replay = TraceReplay(trace, seed)
        # One tabulated latency model shared by the executor and the policies, so that both
        # price a round identically (the oracle's plan relies on it).
        self.latency = tabulated(model, self.replay.max_context)
        self._reference: Reference | None = None
        self._sd: FixedGammaSD | None = None  # vanilla SD in closed form: the reference, and `sd` runs
        self._trees: TreeRounds | None = None  # tree policies in closed form
        self._del = None  # DEL's rounds, compiled (simlab.sim.del_rounds)
        self._spide = None  # SPIDE's rounds, compiled (simlab.sim.spide_rounds)
        self._past_end: dict[int, TraceReplay] = {}  # replays of the paths run past the prompts' ends, by length
        self._lookup = None  # prompt lookup's rounds, compiled (simlab.sim.lookup_rounds)

    def context(self) -> PolicyContext:
        """What every policy of this simulator is built with (:mod:`simlab.sim.context`)."""
        prompts = self.trace.prompts
        return policy_context(self.latency, typical_context_len(prompts["prompt_len"], prompts["n_tokens"]),
                              self.topology, self.trace.manifest, best_gamma=lambda: self.reference().gamma,
                              predictor=self.predictor, rank_acceptance=self._rank_acceptance)

    def run(
        self,
        policy: str,
        params: dict[str, Any] | None = None,
        *,
        keep_tokens: bool = False,
        timeline_prompt: int | None = None,
        with_cost: bool = True,
        context: PolicyContext | None = None,
    ) -> SimResult:
        """``context``: what the policy is built with in place of :meth:`context` (a live run
        re-priced from forwards timed again keeps the decisions of the context its policy was
        built with, :mod:`simlab.live.session`)."""
        params = dict(params or {})
        pol = make_policy(policy, self.context() if context is None else context, **params)
        sim = None  # the same numbers without the round-by-round replay, where a closed form has them
        if type(pol) is VanillaSD and not keep_tokens and timeline_prompt is None:
            sim = self._fixed_gamma().simulate(pol.gamma)
        elif pol.drafts_trees and not keep_tokens and timeline_prompt is None:
            sim = self._tree_rounds().simulate(pol)
        elif type(pol) is Del and not keep_tokens and timeline_prompt is None and self._del_rounds().replays(pol):
            sim = self._del_rounds().simulate(pol)
        elif isinstance(pol, Spide) and not keep_tokens and timeline_prompt is None and self._spide_rounds().replays(pol):
            sim = self._spide_rounds().simulate(pol)
        elif type(pol) in (PromptLookup, Ngram) and not pol.past_end and not keep_tokens and timeline_prompt is None:
            sim = self._lookup_rounds().simulate(pol)
        if sim is None:
            executor = SimExecutor(self.latency, self.topology, keep_tokens=keep_tokens, timeline_prompt=timeline_prompt)
            sim = executor.run(self.past_end_replay(pol.past_end) if pol.past_end else self.replay, pol)
        ref = self.reference() if with_cost else None
        summary = Summary.from_counts(total(r.counts for r in sim.prompts), ref.target_calls if ref else None,
                                     sim.positions)
        if ref:
            summary.extra["reference_gamma"] = ref.gamma
        if self.topology is Topology.ONE_DEVICE:
            summary.extra["corun_latency"] = "measured" if self.corun_measured else "solo stand-in (optimistic)"
        summary.extra.update(self._priced(sim).to_dict())
        rows = []
        for r in sim.prompts:
            s = Summary.from_counts(r.counts, ref.per_prompt_calls.get(r.prompt_id) if ref else None)
            rows.append({"prompt_id": r.prompt_id, **{k: getattr(s, k) for k in SUMMARY_KEYS}})
        timeline = [s for r in sim.prompts for s in r.slices]
        tokens = {r.prompt_id: r.tokens for r in sim.prompts} if keep_tokens else None
        return SimResult(policy, pol.describe(), summary, pd.DataFrame(rows), sim.positions, timeline, tokens)

    def _priced(self, sim):
        """The run's priced forwards and those priced past the measured
        (:mod:`simlab.sim.extrapolation`): the policy's, and the target-alone decoding's of the
        same tokens that its speedup divides by."""
        lens = dict(zip(self.replay.prompt_ids.tolist(), self.replay.prompt_lens.tolist()))
        priced = sim.extrapolated
        baseline(priced, self.latency, [lens[r.prompt_id] for r in sim.prompts], [r.counts.tokens for r in sim.prompts])
        return priced

    def past_end_replay(self, tail: int) -> TraceReplay:
        """The replay of the trace's paths run ``tail`` positions past each prompt's end, for a
        policy whose engine drafts there (``Policy.past_end``: vLLM). On a trace that holds fewer
        (not recorded by ``simlab vllm record``) an acceptance past the end counts as a rejection,
        and stderr says so, once."""
        replay = self._past_end.get(tail)
        if replay is None:
            ext = extended(self.trace, tail)
            if ext.padded:
                name = self.trace.path.name if self.trace.path else "the trace"
                warn_once(f"simlab: warning: {name} holds fewer than {tail} tokens past the end of {ext.padded} of its "
                          f"{self.trace.n_prompts} prompts (past_end.parquet): the engine modelled drafts and counts "
                          "acceptances there in each prompt's last step, which are counted as rejections (accepted "
                          "is then a lower bound); `simlab vllm record` records them")
            replay = self._past_end[tail] = TraceReplay(ext.trace, self.seed)
        return replay

    def _rank_acceptance(self) -> list[float]:
        ranks = [p.ranks for p in self.replay.prompts]
        return rank_acceptance(ranks, max(self.trace.manifest.topk, 1))

    def _tree_rounds(self) -> TreeRounds:
        if self._trees is None:
            self._trees = TreeRounds(self.replay, self.latency)
        return self._trees

    def _del_rounds(self):
        """DEL's compiled replay (:mod:`simlab.sim.del_rounds`), imported with the first DEL run:
        it imports numba, which no other policy needs."""
        if self._del is None:
            from simlab.sim import del_rounds

            self._del = del_rounds.DelRounds(self.replay, self.latency)
        return self._del

    def _spide_rounds(self):
        """SPIDE's compiled replay (:mod:`simlab.sim.spide_rounds`), imported with the first SPIDE
        run, as DEL's is."""
        if self._spide is None:
            from simlab.sim import spide_rounds

            self._spide = spide_rounds.SpideRounds(self.replay, self.latency, self.topology)
        return self._spide

    def _lookup_rounds(self):
        """Prompt lookup's compiled replay (:mod:`simlab.sim.lookup_rounds`), imported with the first
        prompt-lookup run, as DEL's is."""
        if self._lookup is None:
            from simlab.sim import lookup_rounds

            self._lookup = lookup_rounds.LookupRounds(self.replay, self.latency)
        return self._lookup

    def _fixed_gamma(self) -> FixedGammaSD:
        if self._sd is None:
            self._sd = FixedGammaSD(self.replay, self.latency)
        return self._sd

    def reference(self) -> Reference:
        """Vanilla SD at the γ in :data:`REFERENCE_GAMMAS` with the best speedup (cached).

        Computed in one vectorised pass per γ (:mod:`simlab.sim.vanilla`), which gives the
        executor's counts and wall times bit for bit."""
        if self._reference is None:
            best = None
            for gamma in REFERENCE_GAMMAS:
                res = self._fixed_gamma().run(gamma)
                if best is None or res.speedup > best.speedup:
                    best = res
            ids = self.replay.prompt_ids.tolist()
            calls = dict(zip(ids, best.target_calls.tolist()))
            self._reference = Reference(best.gamma, best.speedup, int(best.target_calls.sum()), calls)
        return self._reference


def simulate(trace: Trace, policy: str, params: dict[str, Any] | None = None, **options: Any) -> SimResult:
    """One-shot convenience: ``simulate(trace, "sd", {"gamma": 5})``."""
    sim_keys = {"latency", "seed", "topology", "predictor"}
    sim = Simulator(trace, **{k: v for k, v in options.items() if k in sim_keys})
    return sim.run(policy, params, **{k: v for k, v in options.items() if k not in sim_keys})


__all__ = ["Simulator", "SimResult", "Reference", "simulate"]

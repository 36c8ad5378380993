"""What the simulator predicts for a live run, and measured beside predicted.

One :class:`~simlab.sim.run.Simulator` per session, on the comparison trace in the run's
topology, with the session's latency model. It builds the context every policy of the session
gets (the one recipe, :mod:`simlab.sim.context`), so the live policy and the simulated one
decide alike, and it simulates the policy once: the per-prompt prediction does not depend on
what was measured, so writing the table after every prompt (``--out``) re-simulates nothing.
Without a comparison trace (``--no-compare``) the context comes from the same recipe over the
run's prompts and budget, and its tree data are the trees the run drafts
(:meth:`~simlab.live.setup.LiveSetup.tree_data`): no trace bounds them.

Each prompt's measured device time is also summed per kind of forward (``draft``, ``verify``,
``draft (parallel)``, ``verify (parallel)``, ``shadow``) beside the simulator's price for the same
kind (its timeline's slices): :attr:`Comparison.forwards`, and the row's ``forward_gap`` names
the kind whose time is furthest from its price, so a prompt's speedup error is explained by
which forwards ran slower or faster than priced rather than by the total alone. For a policy
that reads shadow tokens (DEL) the row also holds the time its shadow reads took beside their
price (0 where the trace's probe has no exit-head axis), the one piece of a decode that is
neither a draft step nor a verification.

A prompt has *drifted* (:data:`DRIFTED`) when its autoregressive baselines ran that far from
the trace's price for them. It is the other half of the live protocol's noise flags: the
``disturbed`` flag (:mod:`simlab.live.decoding`) sees other processes on this machine take CPU,
not a host that slows as a whole, as a virtual machine on shared hardware can (a Qwen prompt's
baselines once ran 24% over their price while no process here took more than 1% of the CPU).
The baseline runs the very forward the probe priced, so its drift measures the machine, not the
policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from simlab.common.metrics import Summary
from simlab.latency.model import LatencyModel
from simlab.live.decoding import PromptOutcome
from simlab.live.setup import LiveSetup
from simlab.policies import REGISTRY, PolicyContext
from simlab.sim.context import policy_context, tabulated, typical_context_len
from simlab.sim.devices import Slice
from simlab.sim.run import SimResult, Simulator
from simlab.sim.spread import SamplingSpread, sampling_spread
from simlab.sim.timeline import kind_of, seconds_by_kind
from simlab.trace.io import Trace

# |autoregressive time / its price - 1| above which a prompt is flagged as drifted (module
# docstring). A convention, as DISTURBED is: on the machine this project measures on, the Qwen
# pair's baselines drifted +0.8% to +6.3% (median over each policy's 8 prompts), and a drift of
# 10% is more than three times the 3% speedup error the predictions aim for.
DRIFTED = 0.10


@dataclass
class Comparison:
    """Per-prompt measured and predicted figures (one row each) and the simulated run."""

    table: pd.DataFrame
    trace_path: Path | None
    simulated: SimResult | None = None
    notes: list[str] = field(default_factory=list)
    # prompt_id -> kind of forward -> (measured, priced) device seconds, for the predicted prompts
    forwards: dict[int, dict[str, tuple[float, float]]] = field(default_factory=dict)


def forward_times(measured: dict[str, float], priced: dict[str, float]) -> dict[str, tuple[float, float]]:
    """(measured, priced) seconds per kind of forward that either side ran."""
    return {kind: (measured.get(kind, 0.0), priced.get(kind, 0.0)) for kind in sorted({*measured, *priced})}


def describe_gap(kind: str, measured: float, priced: float) -> str:
    """'verify (parallel) 7.65 s vs 6.51 s priced (+17%)'."""
    share = f" ({measured / priced - 1:+.0%})" if priced else ""
    return f"{kind} {measured:.2f} s vs {priced:.2f} s priced{share}"


def largest_gap(times: dict[str, tuple[float, float]]) -> str:
    """The kind of forward whose measured time is furthest from its price, described ('' when
    the prompt ran no forward after its prefill)."""
    if not times:
        return ""
    kind, (measured, priced) = max(times.items(), key=lambda item: abs(item[1][0] - item[1][1]))
    return describe_gap(kind, measured, priced)


def relative_error(predicted: float, measured: float) -> float:
    if not measured or math.isnan(measured) or math.isnan(predicted):
        return math.nan
    return predicted / measured - 1.0


class Prediction:
    """The simulator's side of a live session (module docstring)."""

    def __init__(self, setup: LiveSetup, trace: Trace | None, latency: LatencyModel | None,
                 context: PolicyContext | None = None):
        """``context``: what the simulated policy is built with instead of the simulator's own (a
        re-priced prediction keeps the live policy's decisions: :meth:`LiveSession.reprobe`)."""
        self.setup, self.trace, self.latency, self._context = setup, trace, latency, context
        cfg = setup.cfg
        self.simulator = Simulator(trace, latency, seed=cfg.seed, topology=setup.topology) if trace is not None \
            else None
        self._simulated: SimResult | None = None
        self._spread: SamplingSpread | None = None
        self._priced: dict[str, dict[str, float]] = {}  # source -> priced seconds per kind of forward
        self._prompt_ids = dict(zip(trace.prompts["source"], trace.prompts["prompt_id"])) if trace is not None else {}

    def context(self) -> PolicyContext:
        """The context every policy of the session is built with, live or simulated."""
        if self._context is not None:
            return self._context
        if self.simulator is not None:
            return self.simulator.context()
        lens = [len(ids) for ids in self.setup.ids.values()]
        budget = self.setup.cfg.max_new_tokens
        grid = tabulated(self.latency, max(lens) + budget) if self.latency is not None else None
        context = policy_context(grid, typical_context_len(lens, [budget]), self.setup.topology)
        trees = self.setup.tree_data()
        return replace(context, tree_topk=trees[0], tree_depth=trees[1]) if trees else context

    def simulated(self) -> SimResult | None:
        """The session's policy simulated on the comparison trace (once)."""
        if self.simulator is not None and self._simulated is None:
            cfg = self.setup.cfg
            self._simulated = self.simulator.run(cfg.policy, cfg.params, with_cost=False, context=self._context)
        return self._simulated

    def spread(self) -> SamplingSpread | None:
        """At temperature > 0, the interval one run may land in (:mod:`simlab.sim.spread`): the
        comparison trace and ``--spread-trace`` traces (other ``record --seed``) of the run's
        prompts, each under ``--spread-seeds`` replay seeds."""
        cfg = self.setup.cfg
        if self.trace is None or cfg.temperature == 0:
            return None
        if self._spread is None:
            from simlab.trace.io import read_trace

            traces = [self.trace, *(read_trace(p) for p in cfg.spread_traces)]
            self._spread = sampling_spread(traces, cfg.policy, cfg.params, seeds=cfg.spread_seeds, seed=cfg.seed,
                                           latency=self.latency, topology=self.setup.topology)
        return self._spread

    def prompt_id(self, source: str) -> int | None:
        """The trace's prompt_id of a prompt of the run, matched by source (None: not in it)."""
        pid = self._prompt_ids.get(source)
        return None if pid is None else int(pid)

    def timeline(self, source: str) -> list[Slice]:
        """The simulated per-device timeline of one prompt of the run."""
        cfg = self.setup.cfg
        res = self.simulator.run(cfg.policy, cfg.params, timeline_prompt=self.prompt_id(source), with_cost=False,
                                 context=self._context)
        return res.timeline

    def ad_drift(self, outcome: PromptOutcome) -> float | None:
        """How far one prompt's autoregressive baselines ran from their price (None: the prompt is
        not in the comparison trace): the machine's drift since the probe (:data:`DRIFTED`)."""
        pid = self.prompt_id(outcome.source)
        if pid is None or self.simulated() is None:
            return None
        per_prompt = self.simulated().per_prompt
        price = per_prompt.loc[per_prompt["prompt_id"] == pid, "ad_wall_time_s"].iloc[0]
        return relative_error(outcome.policy.counts.ad_wall_time_s, price)

    def verified_sizes(self) -> tuple[int, ...]:
        """Every token count of a target forward the simulated run makes on the run's prompts
        (its verifications, serial and parallel), and 1 (the autoregressive baseline's step): the
        k a probe times for a prediction priced from its own samples only (``--probe 'k=auto'``)."""
        return tuple(sorted({1, *self.verification_seconds(p.source for p in self.setup.prompts)}))

    def verification_seconds(self, sources: Iterable[str]) -> dict[int, float]:
        """Per token count k, the device seconds the simulated run spends verifying k tokens
        (serial and parallel) on these prompts; a prompt the trace lacks has an empty timeline."""
        seconds: dict[int, float] = {}
        for source in sources:
            for s in self.timeline(source):
                if kind_of(s.name).startswith("verify"):
                    k = s.args["tokens"]
                    seconds[k] = seconds.get(k, 0.0) + (s.end - s.start)
        return seconds

    def priced_by_kind(self, source: str) -> dict[str, float]:
        """The device time the simulator prices for one prompt, per kind of forward: its
        timeline's slices (cached, as each timeline is a simulation of its own)."""
        if source not in self._priced:
            self._priced[source] = seconds_by_kind((kind_of(s.name), s.end - s.start) for s in self.timeline(source))
        return self._priced[source]

    def compare(self, outcomes: list[PromptOutcome]) -> Comparison:
        """Measured beside predicted, one row per finished prompt."""
        shadows = REGISTRY[self.setup.cfg.policy].needs_shadows
        sim = self.simulated()
        predicted = sim.per_prompt.set_index("prompt_id") if sim is not None else None
        rows = []
        forwards: dict[int, dict[str, tuple[float, float]]] = {}
        for o in outcomes:
            m = Summary.from_counts(o.policy.counts)
            measured = seconds_by_kind((f.what, f.end - f.start) for f in o.policy.forwards)
            row = {"prompt_id": o.prompt_id, "source": o.source, **({} if o.lossless is None else {"lossless": o.lossless}),
                   "measured_tokens": m.tokens, "measured_tokens_per_s": m.tokens_per_s,
                   "measured_speedup": m.speedup, "measured_target_calls": m.target_calls, "measured_mat": m.mat,
                   "measured_wall_time_s": m.wall_time_s, "measured_ad_wall_time_s": m.ad_wall_time_s,
                   "measured_ad_spread": o.ad_spread, "repeats": len(o.speedups),
                   "measured_speedup_spread": o.speedup_spread, "other_cpu_max": o.other_cpu_max,
                   "disturbed": o.disturbed}
            if shadows:
                row["measured_shadow_s"] = measured.get("shadow", 0.0)
            pid = self.prompt_id(o.source) if predicted is not None else None
            if pid is not None:
                pr = predicted.loc[pid]
                row.update({"predicted_tokens": int(pr["tokens"]), "predicted_tokens_per_s": pr["tokens_per_s"],
                            "predicted_speedup": pr["speedup"], "predicted_target_calls": int(pr["target_calls"]),
                            "predicted_mat": pr["mat"], "predicted_wall_time_s": pr["wall_time_s"],
                            "predicted_ad_wall_time_s": pr["ad_wall_time_s"]})
                for key in ("tokens_per_s", "speedup"):
                    row[f"error_{key}"] = relative_error(row[f"predicted_{key}"], row[f"measured_{key}"])
                # how far the machine's autoregressive speed has moved from the trace's probe
                row["ad_drift"] = relative_error(m.ad_wall_time_s, row["predicted_ad_wall_time_s"])
                row["drifted"] = abs(row["ad_drift"]) > DRIFTED
                times = forwards[o.prompt_id] = forward_times(measured, self.priced_by_kind(o.source))
                row["forward_gap"] = largest_gap(times)
                if shadows:
                    row["predicted_shadow_s"] = times.get("shadow", (0.0, 0.0))[1]
            rows.append(row)
        return Comparison(pd.DataFrame(rows), self.trace.path if self.trace is not None else None, sim,
                          forwards=forwards)

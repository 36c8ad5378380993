"""``simlab live`` end to end: load the pair, decode every prompt three times (autoregressive,
under the policy, autoregressive again), simulate the same policy on a trace of the same
prompts, and put measured beside predicted.

A session does four jobs, each in its own module, and only ties them together:

- :mod:`simlab.live.comparison_trace`: finding (or recording) the trace it is compared with;
- :mod:`simlab.live.pair`: loading the models and the executor that decodes with them;
- :mod:`simlab.live.decoding`: decoding the prompts, policy and autoregressive baseline;
- :mod:`simlab.live.prediction`: the simulator's prediction, the policies' context (one
  recipe for live and simulated policies), and measured beside predicted.

The run's options and the facts derived from them are a :class:`~simlab.live.setup.LiveSetup`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator

import pandas as pd

from simlab.live.decoding import PromptOutcome, decode_prompts
from simlab.live.prediction import Comparison, Prediction
from simlab.live.setup import LiveConfig, LiveSetup
from simlab.trace.io import Trace

EXTRA_PROBES = 2  # k=auto: probes of sizes a prediction priced from the first probe adds
# --reprobe-drift times again only the sizes k that carry this share of the prompts left's
# predicted verification time (and k = 1, the baseline's step); the others keep the last probe's
# prices. A drift d of theirs then moves a prediction by under (1 - share)·d of its verification
# time. Why not every size: re-timing a wide probe (spide's on the Qwen pair, 28 sizes up to
# k = 125, co-running too) took about 11 minutes, these sizes 77-200 s (results/live/qwen-reprobe).
REPROBE_SHARE = 0.95


def sizes_carrying(seconds: dict[int, float], share: float) -> set[int]:
    """The fewest sizes whose seconds reach ``share`` of the total, the dearest first (the
    smaller size first on ties)."""
    total, acc, chosen = sum(seconds.values()), 0.0, set()
    for k, t in sorted(seconds.items(), key=lambda item: (-item[1], item[0])):
        if acc >= share * total:
            break
        acc += t
        chosen.add(k)
    return chosen


class LiveSession:
    """Everything ``simlab live`` does; the CLI only parses options and prints."""

    def __init__(self, cfg: LiveConfig, log: Callable[[str], None] = print):
        self.setup = LiveSetup(cfg)
        self.cfg, self.log = cfg, log
        self.prompts, self.ids, self.topology = self.setup.prompts, self.setup.ids, self.setup.topology
        self.trace: Trace | None = None
        self.executor = None
        self.eos: list[int] = []
        self._prediction: Prediction | None = None
        self._probe_plan = None
        self.probes = 0  # latency probes made in this process (--probe, then --reprobe-drift's)
        self._context = None  # after a re-probe: the context the live policy was built with
        self._priced_by: dict[int, tuple[int, Prediction]] = {}  # prompt_id -> (probes before it, its prediction)

    def load_trace(self) -> Trace:
        from simlab.live.comparison_trace import comparison_trace

        self.trace = comparison_trace(self.setup, self.log)
        self._prediction = None
        return self.trace

    def load_models(self) -> None:
        from simlab.live.pair import load_pair

        self.executor, self.eos = load_pair(self.setup, self.trace)

    def probe_here(self) -> tuple[pd.DataFrame, float | None]:
        """``--probe``: the run's forwards timed again with the decoding models, in this process
        (:mod:`simlab.record.reprobe`); the comparison trace's latencies take them, so the
        prediction made next is priced from them. Returns the samples and the share of the CPU
        other processes took meanwhile (the most of any probe).

        Under ``k=auto`` the sizes come from a prediction priced from the trace's latencies, and a
        policy that sizes its drafts from latencies (vanilla SD's best γ in ``spide-no-dyna-draft``,
        eq. 6's window in PEARL and SPIDE) may verify other sizes once priced from the probe's: those
        are timed too, up to :data:`EXTRA_PROBES` times, until the prediction verifies only probed
        sizes (a run left a size unprobed before: results/live/qwen-probe/spide-no-dyna-draft-unprobed-k5)."""
        from simlab.record.reprobe import probe_here, with_points

        if self.executor is None:
            self.load_models()
        plan = self.probe_plan()
        samples, other = probe_here(self.trace, self.executor, plan, self.log)
        self.probes += 1
        self._take(samples)
        for _ in range(EXTRA_PROBES if self.setup.probe_auto else 0):
            missing = tuple(k for k in self.prediction.verified_sizes() if k not in plan.ks)
            if not missing:
                break
            self.log(f"priced from them, the prediction verifies k = {','.join(map(str, missing))} too: timing those")
            more, more_other = probe_here(self.trace, self.executor, replace(plan, ks=missing), self.log)
            self._take(more)
            samples = with_points(samples, more)
            other = max((x for x in (other, more_other) if x is not None), default=None)
            plan = self._probe_plan = replace(plan, ks=tuple(sorted(plan.ks + missing)))
        return samples, other

    def reprobe(self) -> tuple[pd.DataFrame, float | None]:
        """``--reprobe-drift``: the forwards of :meth:`probe_plan` timed again between two prompts,
        in place of the last probe's, at the sizes that carry :data:`REPROBE_SHARE` of the
        verification time predicted for the prompts not yet decoded (and k = 1). The prompts
        decoded next are priced from them, while the simulated policy keeps the context the live
        one was built with (its γ, window and latency-driven decisions), so counts stay those of
        the decodes and only prices move."""
        from simlab.record.reprobe import probe_here

        context = self.prediction.context()
        plan = self.probe_plan()
        left = [p.source for p in self.setup.prompts if p.prompt_id not in self._priced_by]
        carrying = sizes_carrying(self.prediction.verification_seconds(left), REPROBE_SHARE) | {1}
        plan = replace(plan, ks=tuple(k for k in plan.ks if k in carrying) or plan.ks)
        self.log(f"k = {','.join(map(str, plan.ks))}: the sizes that carry {REPROBE_SHARE:.0%} of the verification "
                 f"time predicted for the {len(left)} prompt{'' if len(left) == 1 else 's'} left")
        samples, other = probe_here(self.trace, self.executor, plan, self.log)
        self.probes += 1
        self._take(samples)
        self._context = context
        return samples, other

    def _take(self, samples: pd.DataFrame) -> None:
        """The comparison trace's latencies with ``samples`` in place of its own at their points;
        the next prediction is made from them."""
        from simlab.record.reprobe import with_points

        self.trace = replace(self.trace, latency=with_points(self.trace.latency, samples))
        self._prediction = None

    def decoded(self, outcome: PromptOutcome) -> float | None:
        """Note that ``outcome``'s prompt was decoded under the prediction in force now (it is
        compared with that one), and return its baselines' drift from their price."""
        self._priced_by[outcome.prompt_id] = (self.probes, self.prediction)
        return self.prediction.ad_drift(outcome)

    def probe_plan(self):
        """``--probe``'s plan, its k values the prediction's verification sizes under ``k=auto``
        (fixed at the first call, then widened by :meth:`probe_here` to the sizes the prediction
        priced from the probe verifies)."""
        if self._probe_plan is None:
            plan = self.setup.probe_plan
            self._probe_plan = replace(plan, ks=self.prediction.verified_sizes()) if self.setup.probe_auto else plan
        return self._probe_plan

    @property
    def prediction(self) -> Prediction:
        """The simulator's side, built once the comparison trace is known (or known absent)."""
        if self._prediction is None:
            from simlab.latency.model import load_profile

            latency = load_profile(self.cfg.latency) if self.cfg.latency is not None else None
            self._prediction = Prediction(self.setup, self.trace, latency, self._context)
        return self._prediction

    def priced_by(self, outcome: PromptOutcome) -> tuple[int, Prediction]:
        """The prediction ``outcome``'s prompt is compared with (the one in force when it was
        decoded, else the current one) and the number of probes it was priced after."""
        return self._priced_by.get(outcome.prompt_id, (self.probes, self.prediction))

    def prediction_for(self, outcome: PromptOutcome) -> Prediction:
        return self.priced_by(outcome)[1]

    def make_policy(self, name: str, params: dict[str, Any]):
        from simlab.policies import make_policy

        return make_policy(name, self.prediction.context(), **params)

    def decode(self) -> Iterator[PromptOutcome]:
        """Decode every prompt (autoregressive, the policy, autoregressive); yields as each finishes."""
        if self.executor is None:
            self.load_models()
        return decode_prompts(self.setup, self.executor, self.make_policy(self.cfg.policy, self.cfg.params),
                              self.make_policy("ad", {}))

    def compare(self, outcomes: list[PromptOutcome]) -> Comparison:
        """Each prompt against the prediction it was decoded under; with ``--probe``, the
        table's ``probe`` column numbers the probe that priced each row (1: ``--probe``'s, then
        the re-probes')."""
        if self._context is None:  # never re-probed: one prediction for every prompt
            comparison = self.prediction.compare(outcomes)
            if self.probes:  # priced by --probe's samples
                comparison.table = comparison.table.assign(probe=self.probes)
            return comparison
        priced_by = {o.prompt_id: self.priced_by(o) for o in outcomes}
        parts, order = [], {o.prompt_id: i for i, o in enumerate(outcomes)}
        for probe in sorted({probe for probe, _ in priced_by.values()}):
            group = [o for o in outcomes if priced_by[o.prompt_id][0] == probe]
            parts.append((probe, priced_by[group[0].prompt_id][1].compare(group)))
        table = pd.concat([c.table.assign(probe=probe) for probe, c in parts], ignore_index=True)
        table = table.sort_values("prompt_id", key=lambda ids: ids.map(order), kind="stable", ignore_index=True)
        first = parts[0][1]
        return Comparison(table, first.trace_path, first.simulated,
                          forwards={pid: times for _, c in parts for pid, times in c.forwards.items()})

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()

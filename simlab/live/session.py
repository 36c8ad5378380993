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
        plan, latency = self.probe_plan(), self.trace.latency
        samples, other = probe_here(self.trace, self.executor, plan, self.log)
        for extra in range(EXTRA_PROBES + 1):
            self.trace = replace(self.trace, latency=with_points(latency, samples))
            self._prediction = None
            if not self.setup.probe_auto or extra == EXTRA_PROBES:
                break
            missing = tuple(k for k in self.prediction.verified_sizes() if k not in plan.ks)
            if not missing:
                break
            self.log(f"priced from them, the prediction verifies k = {','.join(map(str, missing))} too: timing those")
            more, more_other = probe_here(self.trace, self.executor, replace(plan, ks=missing), self.log)
            samples = with_points(samples, more)
            other = max((x for x in (other, more_other) if x is not None), default=None)
            plan = self._probe_plan = replace(plan, ks=tuple(sorted(plan.ks + missing)))
        return samples, other

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
            self._prediction = Prediction(self.setup, self.trace, latency)
        return self._prediction

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
        return self.prediction.compare(outcomes)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()

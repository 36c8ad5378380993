"""The predictor's inputs, computed identically while training and while decoding.

A policy holds a :class:`~simlab.common.signals.TokenSignal` for the token just drafted and the recent
acceptance it tracks from verification outcomes (``AcceptancePredictor.predict_accept``'s two
arguments). The features are functions of exactly those:

- ``confidence``: the draft's top-1 probability (SPIDE eq. 2);
- ``logit_confidence``: its log-odds, clipped at 1e-4 from 0 and 1, so a linear model can
  tell 0.99 from 0.999;
- ``entropy``: the draft entropy in nats (SVIP, AdaEDL);
- ``draft_index``: the token's 1-based place in the current draft run (Pacer finds position
  a strong indicator, its Table 5);
- ``recent_acceptance``: the share of the last ``RECENT_WINDOW`` checked draft tokens that
  were accepted, 1.0 before any check of the prompt (:class:`RecentAcceptance`).

Training examples (:func:`examples`) come from replaying the trace in the simulator under
vanilla SD with a fixed γ and recording every verification outcome a policy would observe:
the tokens the target checked (up to and including the first rejected one), with the recent
acceptance as it stood when they were drafted. Tokens after the first rejection are not
examples: their acceptance is moot, and no policy is ever told it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from simlab.common.signals import TokenSignal
from simlab.policies.base import RECENT_WINDOW, Outcome, PromptInfo
from simlab.policies.fixed import VanillaSD

if TYPE_CHECKING:  # pandas is imported by training, not by a policy that reads a predictor
    import pandas as pd

FEATURES = ("confidence", "logit_confidence", "entropy", "draft_index", "recent_acceptance")
LOGIT_CLIP = 1e-4


def feature_vector(signal: TokenSignal, recent_acceptance: float) -> tuple[float, ...]:
    """The features of :data:`FEATURES`, in that order."""
    c = min(max(signal.confidence, LOGIT_CLIP), 1.0 - LOGIT_CLIP)
    return (signal.confidence, math.log(c / (1.0 - c)), signal.entropy, float(signal.index), recent_acceptance)


class RecentAcceptance:
    """Acceptance of the last ``window`` checked draft tokens, from verification outcomes.

    Policies that feed a predictor keep one, call :meth:`reset` per prompt and :meth:`observe`
    on every outcome, and pass :attr:`value` to ``predict_accept``.
    """

    def __init__(self, window: int = RECENT_WINDOW):
        self.bits: deque[bool] = deque(maxlen=window)

    def reset(self) -> None:
        self.bits.clear()

    def observe(self, outcome: Outcome) -> None:
        checked = len(outcome.checked)
        self.bits.extend(i < outcome.accepted for i in range(checked))

    @property
    def value(self) -> float:
        return sum(self.bits) / len(self.bits) if self.bits else 1.0


class _Recorder(VanillaSD):
    """Vanilla SD that writes down what it observes: one example per checked draft token."""

    name = "sd-recorder"

    def __init__(self, context, gamma: int):
        super().__init__(context, gamma=gamma)
        self.recent = RecentAcceptance()
        self.rows: list[tuple] = []
        self.prompt_id = -1

    def reset(self, prompt: PromptInfo) -> None:
        self.prompt_id = prompt.prompt_id
        self.recent.reset()

    def observe(self, outcome: Outcome) -> None:
        recent = self.recent.value
        for i, signal in enumerate(outcome.checked):
            self.rows.append((self.prompt_id, *feature_vector(signal, recent), i < outcome.accepted))
        self.recent.observe(outcome)


def examples(trace, gamma: int = 8, seed: int = 0) -> pd.DataFrame:
    """One row per checked draft token of a vanilla-SD replay: prompt_id, the features, accepted."""
    import pandas as pd

    from simlab.sim.executor import SimExecutor
    from simlab.sim.run import Simulator

    sim = Simulator(trace, seed=seed)
    recorder = _Recorder(sim.context(), gamma)
    SimExecutor(sim.latency).run(sim.replay, recorder)
    return pd.DataFrame(recorder.rows, columns=["prompt_id", *FEATURES, "accepted"])

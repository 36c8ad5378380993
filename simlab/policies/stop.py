"""Serial rounds that stop on a per-token rule, and the pieces several such rules share.

Most adaptive-length methods draft one token at a time and stop after the first token for which
a rule fires; that token is kept and verified with the others (HF's confidence criterion, SVIP,
AdaEDL, Draft & Verify, SpecDec++, the h-rule, Pacer). :class:`StopRule` is that round, and a
subclass only says when to stop. Two refinements are shared:

- :class:`AdaptiveStop`: Draft & Verify's online threshold, moved after every verification
  toward a target acceptance rate (docs/policies/dv.md); AdaEDL's λ reuses it.
- :class:`PredictedStop`: rules on a predicted P(accept) (SpecDec++, the h-rule, Pacer), read
  from the context's trained predictor, or from the draft's confidence when there is none.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import deque
from operator import attrgetter
from typing import Any, Callable

from simlab.common.signals import TokenSignal
from simlab.policies.base import (
    POSITIVE,
    PROBABILITY,
    RECENT_WINDOW,
    ConfidencePredictor,
    Decision,
    Outcome,
    Param,
    Plan,
    Policy,
    PromptInfo,
    RoundState,
    Serial,
)


class StopRule(Policy):
    """Serial rounds of at most ``max_draft`` tokens (None: up to the end of the prompt) that end
    after the first drafted token for which :meth:`stops` is true."""

    max_draft: int | None

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self._plan = Serial(self.max_draft) if self.max_draft is not None else None
        self._begins = type(self).begin_round is not StopRule.begin_round  # else no call per round

    def plan(self, state: RoundState) -> Plan:
        if self._begins:
            self.begin_round(state)
        # (a Serial up to the prompt's end built without its Python-level __new__: once a round)
        return self._plan or tuple.__new__(Serial, (state.remaining, False, None, 0))

    def begin_round(self, state: RoundState) -> None:
        """Called before each round's first token (per-round state starts here)."""

    def on_draft(self, signal: TokenSignal) -> Decision:
        return Decision.VERIFY if self.stops(signal) else Decision.DRAFT

    def stop_rule(self) -> Callable[[TokenSignal], bool] | None:
        # a subclass that decides otherwise in on_draft keeps being asked through it
        return self.stops if type(self).on_draft is StopRule.on_draft else None

    @abstractmethod
    def stops(self, signal: TokenSignal) -> bool:
        """True: verify now, with this token as the last draft."""


# Draft & Verify's defaults (function signature of exact_self_speculative_generate).
ADAPTIVE_PARAMS = (
    Param("target_rate", 0.9, "α_target: the acceptance rate the threshold steers toward", PROBABILITY),
    Param("epsilon", 0.01, "ε: step of the threshold per verification", POSITIVE),
    Param("beta1", 0.5, "β₁: smoothing of the observed acceptance rate", PROBABILITY),
    Param("beta2", 0.9, "β₂: smoothing of the threshold", PROBABILITY),
)


class AdaptiveStop(StopRule):
    """A stop threshold adjusted after every verification (Draft & Verify, docs/policies/dv.md):

        r   = accepted / drafted of the round (the target's own token excluded)
        ÃR ← β₁·ÃR + (1 − β₁)·r                          (ÃR = 0 at the start of each prompt)
        θ'  = θ + ε if ÃR < α_target, else θ − ε (but θ' = θ if the round drafted max_draft)
        θ  ← β₂·θ + (1 − β₂)·θ'

    A higher threshold stops drafting earlier. θ carries over from prompt to prompt (the D&V
    notebooks pass the returned ``th_stop_draft`` into the next call); ÃR restarts at 0.
    Subclasses compare their signal with :attr:`level` (θ) and declare ``threshold`` (θ's
    initial value) and the :data:`ADAPTIVE_PARAMS`.
    """

    threshold: float

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self.level = self.threshold
        self._rate = 0.0
        self._update = (self.beta1, 1 - self.beta1, self.beta2, 1 - self.beta2, self.target_rate, self.epsilon,
                        self.max_draft)

    def reset(self, prompt: PromptInfo) -> None:
        self._rate = 0.0

    def observe(self, outcome: Outcome) -> None:
        drafted = outcome.drafted
        if not drafted:  # the last position of a prompt: nothing was drafted
            return
        # the parameters read in one tuple, 1 − β₁ and 1 − β₂ computed once: this runs every round
        beta1, kept1, beta2, kept2, target_rate, epsilon, max_draft = self._update
        level = self.level
        rate = self._rate = beta1 * self._rate + kept1 * outcome.accepted / drafted
        if rate < target_rate:
            moved = level + epsilon
        elif drafted == max_draft:
            moved = level
        else:
            moved = level - epsilon
        self.level = beta2 * level + kept2 * moved


class PredictedStop(StopRule):
    """A stop rule on P(accept) of each drafted token, from ``context.predictor`` (a trained
    acceptance head, ``simlab calibrate predictor``) or, untrained, the draft's confidence.

    Predictors may use the acceptance of the last :data:`RECENT_WINDOW` checked tokens; it is
    tracked from the outcomes and restarts (at 1.0) with each prompt. The rate only moves when
    an outcome arrives, so it is computed then, not for every drafted token that reads it. A
    predictor that ``reads`` its answer from a field of the signal (the untrained one) needs no
    rate: the policy then reads that field directly and takes no outcomes.
    """

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self.predictor = context.predictor or ConfidencePredictor()
        self._reads = getattr(self.predictor, "reads", None)
        if self._reads is not None:  # one C call per drafted token, not two Python ones
            self.p_accept = attrgetter(self._reads)
        self._recent: deque[bool] = deque(maxlen=RECENT_WINDOW)
        self._recent_rate = 1.0

    def reset(self, prompt: PromptInfo) -> None:
        self._recent.clear()
        self._recent_rate = 1.0

    def observes(self) -> bool:
        # the recent rate is read only through predict_accept (a subclass may observe for more)
        return self._reads is None or type(self).observe is not PredictedStop.observe

    def observe(self, outcome: Outcome) -> None:
        checked = len(outcome.checked)
        self._recent.extend([True] * outcome.accepted + [False] * (checked - outcome.accepted))
        self._recent_rate = sum(self._recent) / len(self._recent) if self._recent else 1.0

    def p_accept(self, signal: TokenSignal) -> float:
        """P(accept) of a drafted token (an instance attribute replaces this method when the
        predictor ``reads`` it from a field of the signal)."""
        return self.predictor.predict_accept(signal, self._recent_rate)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "predictor": self.predictor.name}

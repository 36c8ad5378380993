"""Pacer (blockwise pre-verification): draft in blocks of b tokens and stop after a block whose
mean predicted acceptance is at most t, growing t by ρ after each block that passes (§3.2,
Appendix A Algorithm 1, defaults of Table 10)."""

from __future__ import annotations

from typing import Any

from simlab.common.signals import TokenSignal
from simlab.policies.base import COUNT, POSITIVE, PROBABILITY, Param, RoundState
from simlab.policies.stop import PredictedStop


class Pacer(PredictedStop):
    """Algorithm 1, lines 6-19: draft b tokens; α̂_1..α̂_b from the pre-verification layer
    (``context.predictor``; untrained: the draft's confidence); stop if mean(α̂) ≤ t (line 15),
    else t ← t·ρ (line 18) and draft the next block."""

    name = "pacer"
    summary = "Pacer: blockwise pre-verification; stop after a block with mean predicted acceptance ≤ t, t grown by ρ"
    paper = "Zhang et al., Pacer §3.2, Appendix A Algorithm 1, Table 10 (HumanEval, DeepSeek 1.3B/33B)"
    params = (
        Param("block", 4, "block size b", COUNT),
        Param("threshold", 0.7, "initial threshold t", PROBABILITY),
        Param("rho", 1.05, "growth factor ρ of t per passed block", POSITIVE),
        Param("max_draft", None, "cap on drafts per round (none: Algorithm 1 drafts until a block fails)", COUNT),
    )
    choices = ("t restarts at its initial value in every round (Algorithm 1 never resets it, which would make "
               "every round stop after one block once t > 1); a prompt's last block may be cut short")

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self._t = self.threshold
        self._sum = 0.0

    def begin_round(self, state: RoundState) -> None:
        self._t = self.threshold
        self._sum = 0.0

    def stops(self, signal: TokenSignal) -> bool:
        self._sum += self.p_accept(signal)
        if signal.index % self.block:
            return False
        mean, self._sum = self._sum / self.block, 0.0
        if mean <= self._t:
            return True
        self._t *= self.rho
        return False

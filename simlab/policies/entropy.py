"""Entropy-bound stopping: SVIP and AdaEDL.

Both stop drafting when a lower bound on the drafted token's acceptance probability, computed
from the entropy H (nats) of the draft distribution, falls too low:

    L(H) = 1 − sqrt(γ_e · H)

SVIP stops when sqrt(0.15·H) > h, i.e. L < 1 − h with γ_e = 0.15 (as the authors'
``vanilla-sd/eval_specbench.py`` does); AdaEDL stops when L < λ with γ_e ≈ 0.2 and λ adapted during
generation. Both: docs/policies/entropy.md.
"""

from __future__ import annotations

import math
from math import sqrt
from typing import Any

from simlab.common.signals import TokenSignal
from simlab.policies.base import COUNT, POSITIVE, PROBABILITY, Param
from simlab.policies.stop import ADAPTIVE_PARAMS, AdaptiveStop, StopRule

SVIP_SCALE = 0.15


def acceptance_lower_bound(entropy: float, scale: float) -> float:
    """L(H) = 1 − sqrt(γ_e·H): the entropy bound on P(accept) that SVIP and AdaEDL threshold."""
    return 1.0 - math.sqrt(scale * entropy)


class Svip(StopRule):
    """SVIP's self-verification length policy: after each drafted token, stop if
    sqrt(0.15·H) > h (the token is kept); at most 40 tokens a round.

    h is SVIP's ``entropy_threshold`` (called ``h`` in simlab before, which AGS's threshold
    on P_rej is also called)."""

    name = "svip"
    summary = "SVIP: stop drafting when the draft entropy's bound sqrt(0.15·H) exceeds h"
    paper = "Zhang et al. 2024, SVIP, arXiv:2411.18462 (docs/policies/entropy.md); SPIDE §2, §4.1 baseline (iii)"
    params = (
        Param("entropy_threshold", 0.3, "h: stop when sqrt(0.15·H) > h", PROBABILITY),
        Param("max_draft", 40, "hard cap on drafts per round", COUNT),
    )

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self._floor = 1.0 - self.entropy_threshold

    def stops(self, signal: TokenSignal) -> bool:
        return acceptance_lower_bound(signal.entropy, SVIP_SCALE) < self._floor


class AdaEdl(AdaptiveStop):
    """AdaEDL: stop when the entropy bound L = 1 − sqrt(γ_e·H) falls below λ, with λ adapted
    during generation."""

    name = "adaedl"
    summary = "AdaEDL: stop when the entropy-based lower bound on acceptance falls below an adaptive λ"
    paper = "Agrawal et al. 2024, AdaEDL, arXiv:2410.18351 (docs/policies/entropy.md); Pacer §4.3 baseline"
    params = (
        Param("threshold", 0.7, "λ's initial value (0.7: the λ at which the rule equals SVIP's default)", PROBABILITY),
        Param("scale", 0.2, "γ_e, the entropy scale of the bound", POSITIVE),
        Param("max_draft", 40, "cap on drafts per round", COUNT),
        *ADAPTIVE_PARAMS,
    )
    choices = ("the paper body (λ's update rule, initial λ, cap) was not available: λ follows Draft & Verify's "
               "update toward target_rate after each verification (shared code), starts at 0.7 and persists "
               "across prompts; the cap is SVIP's 40")

    def stops(self, signal: TokenSignal) -> bool:
        # acceptance_lower_bound(signal.entropy, self.scale), written out: this runs per drafted
        # token (tests/test_policies.py pins the two together)
        return 1.0 - sqrt(self.scale * signal.entropy) < self.level

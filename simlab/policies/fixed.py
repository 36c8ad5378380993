"""Fixed schedules: autoregressive decoding and vanilla speculative decoding."""

from __future__ import annotations

from simlab.policies.base import (
    COUNT,
    Param,
    Plan,
    Policy,
    RoundState,
    Serial,
)


class Autoregressive(Policy):
    """AD: the target alone, one token per forward; the speedup baseline (SPIDE §4.1 (i))."""

    name = "ad"
    summary = "autoregressive decoding: the target alone, one token per forward"
    paper = "SPIDE §4.1, baseline (i) (docs/policies/fixed.md)"

    PLAN = Serial(0, fixed=True)
    drafts = False

    def plan(self, state: RoundState) -> Plan:
        return self.PLAN


class VanillaSD(Policy):
    """Vanilla SD: draft exactly γ tokens, then verify them in one target forward.

    Leviathan et al. 2023 / Chen et al. 2023 (docs/policies/fixed.md; SPIDE §3.1 "Speculative
    Decoding"); SPIDE §4.1 (ii) compares against it at its best γ.
    """

    name = "sd"
    summary = "vanilla speculative decoding: draft a fixed γ tokens, then verify"
    paper = "Leviathan et al. 2023, arXiv:2211.17192 (docs/policies/fixed.md); SPIDE §3.1"
    params = (Param("gamma", 5, "draft length γ", COUNT, aliases=("num_assistant_tokens",)),)

    def __init__(self, context, **values):
        super().__init__(context, **values)
        self._plan = Serial(self.gamma, fixed=True)

    def plan(self, state: RoundState) -> Plan:
        return self._plan

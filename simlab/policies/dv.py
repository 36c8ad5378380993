"""Draft & Verify (Zhang et al., ACL 2024): confidence-threshold drafting with the threshold
adjusted online toward a target acceptance rate (docs/policies/dv.md; the authors' ``decoding.py``)."""

from __future__ import annotations

from simlab.common.signals import TokenSignal
from simlab.policies.base import COUNT, PROBABILITY, Param
from simlab.policies.stop import ADAPTIVE_PARAMS, AdaptiveStop


class DraftVerify(AdaptiveStop):
    """Stop drafting after the first token whose confidence is below θ (the token is kept), at
    most ``max_step_draft`` tokens; θ moves after every verification (:class:`AdaptiveStop`)."""

    name = "dv"
    summary = "Draft & Verify: stop when confidence < θ, θ steered online toward a target acceptance rate"
    paper = "Zhang et al. 2024, Draft & Verify, arXiv:2309.08168 (docs/policies/dv.md); SPIDE §4.1 baseline (iv)"
    params = (
        Param("threshold", 0.8, "θ's initial value, th_stop_draft (0.8 greedy; D&V's sampling default is 0.5)",
              PROBABILITY),
        Param("max_draft", 8, "max_step_draft", COUNT),
        *ADAPTIVE_PARAMS,
    )

    def stops(self, signal: TokenSignal) -> bool:
        return signal.confidence < self.level

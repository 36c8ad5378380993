"""SpecDec++ (Huang et al. 2024): stop when the predicted probability of at least one rejection
exceeds a threshold (docs/policies/specdecpp.md; the authors' ``specdec_pp/hf_generation.py``)."""

from __future__ import annotations

from typing import Any

from simlab.common.errors import SimlabError
from simlab.common.signals import TokenSignal
from simlab.policies.base import COUNT, PROBABILITY, Param, RoundState
from simlab.policies.stop import PredictedStop


class SpecDecPP(PredictedStop):
    """Keep A = Π a_j over the round's drafts and stop when 1 − A > h, never before
    ``min_draft`` tokens and always at ``max_draft``.

    As in the code, the acceptance head scores token j from the hidden state whose *input* is
    token j, which is computed when token j+1 is drafted: after drafting token k, A covers
    tokens 1..k−1 (the last committed token's a is 1), and token k's own score counts from the
    next step on.
    """

    name = "specdecpp"
    summary = "SpecDec++: stop when the predicted P(at least one rejection) = 1 − Πa_j exceeds a threshold"
    paper = "Huang et al. 2024, SpecDec++, arXiv:2405.19715 (docs/policies/specdecpp.md); SPIDE §2"
    params = (
        Param("threshold", 0.3, "stop_threshold h (README example; sample.py uses 0.7)", PROBABILITY),
        Param("min_draft", 2, "lower bound of the draft length", COUNT),
        Param("max_draft", 20, "upper bound of the draft length", COUNT),
    )

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        if self.min_draft > self.max_draft:
            raise SimlabError(f"min_draft ({self.min_draft}) must not exceed max_draft ({self.max_draft})")
        self._survive = 1.0

    def begin_round(self, state: RoundState) -> None:
        self._survive = 1.0

    def stops(self, signal: TokenSignal) -> bool:
        stop = signal.index >= self.min_draft and 1.0 - self._survive > self.threshold
        self._survive *= self.p_accept(signal)
        return stop

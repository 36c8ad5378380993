"""llama.cpp's draft-model speculative decoding, as ``llama-speculative-simple`` runs it.

Rules from the llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist
(docs/policies/llama-cpp.md): ``common/speculative.cpp``, the simple draft implementation's
``draft()``, and ``examples/speculative-simple/speculative-simple.cpp``'s main loop.
"""

from __future__ import annotations

from simlab.errors import SimlabError
from simlab.policies.base import (
    COUNT,
    PROBABILITY,
    Decision,
    Kind,
    Param,
    Plan,
    Policy,
    RoundState,
    Serial,
    check_positive_int,
)
from simlab.signals import TokenSignal

# --draft-min: 0 (llama.cpp's default) is the only value modelled so far.
NON_NEGATIVE = Kind(int, "integer ≥ 0", lambda name, value: check_positive_int(name, value, minimum=0))


class LlamaCpp(Policy):
    """Draft greedily up to ``draft_max`` tokens, capped so the round cannot pass the generation
    budget; a drafted token whose top-1 probability is below ``p_min`` ends the draft and is
    discarded unverified; the target verifies the rest greedily in one forward."""

    name = "llama-cpp"
    summary = "llama.cpp speculative-simple: draft up to draft-max, stop and discard below p-min"
    paper = "llama.cpp common/speculative.cpp, draft() of the simple draft (docs/policies/llama-cpp.md)"
    params = (
        Param("draft_max", 3, "--draft-max: most tokens drafted per round (common_params_speculative_draft.n_max)", COUNT),
        Param("draft_min", 0, "--draft-min: shorter drafts are discarded (only 0 is modelled)", NON_NEGATIVE),
        Param("p_min", 0.0, "--draft-p-min: a drafted token with top-1 probability below it ends the draft, unkept", PROBABILITY),
    )
    choices = ("draft-min > 0 is refused: discarding a whole draft after drafting it is not a simlab "
               "round shape yet")

    def __init__(self, context, **values):
        super().__init__(context, **values)
        if self.draft_min > 0:
            raise SimlabError("llama-cpp: draft_min > 0 is not modelled yet (only 0, llama.cpp's default)")
        self._plan = Serial(self.draft_max, fixed=self.p_min == 0.0)

    def plan(self, state: RoundState) -> Plan:
        # The round protocol caps the draft at remaining - 1 tokens, which is speculative-simple.cpp's
        # n_draft_max = min(n_max, n_predict - n_predict_so_far - 1).
        return self._plan

    def on_draft(self, signal: TokenSignal) -> Decision:
        # speculative.cpp draft(): `if (cur_p->data[0].p < params.p_min) { stop; continue; }`
        # -- the token is not pushed to the draft, so the target never sees it.
        return Decision.DROP if signal.confidence < self.p_min else Decision.DRAFT

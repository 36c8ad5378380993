"""llama.cpp's draft-model speculative decoding, as ``llama-speculative-simple`` runs it.

Rules from the llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist
(docs/policies/llama-cpp.md): ``common/speculative.cpp``, the simple draft implementation's
``draft()`` (``common_speculative_impl_draft_simple::draft``), and
``examples/speculative-simple/speculative-simple.cpp``'s main loop.

``--draft-min`` is ``draft()``'s last step: once drafting has stopped (the ``p_min`` stop, the
``n_max`` cap or the round's budget cap), ``if (dp.result->size() < (size_t) params.n_min)
{ dp.result->clear(); }``. The draft model has run for every token it sampled, and the main
loop then evaluates ``[id_last]`` alone: a plain target step, and ``n_drafted`` does not grow
("we ignore the discarded small drafts"). That is the round protocol's ``Serial.min_draft``.
"""

from __future__ import annotations

from simlab.common.errors import SimlabError
from simlab.common.signals import TokenSignal
from simlab.policies.base import (
    COUNT,
    NON_NEGATIVE,
    PROBABILITY,
    Decision,
    Param,
    Plan,
    Policy,
    PromptInfo,
    RoundState,
    Serial,
)


class LlamaCpp(Policy):
    """Draft greedily up to ``draft_max`` tokens, capped so the round cannot pass the generation
    budget; a drafted token whose top-1 probability is below ``p_min`` ends the draft and is
    discarded unverified; a draft left shorter than ``draft_min`` is discarded whole (the round
    is a plain target step); the target verifies the rest greedily in one forward."""

    name = "llama-cpp"
    summary = "llama.cpp speculative-simple: draft up to draft-max, stop below p-min, discard drafts under draft-min"
    paper = "llama.cpp common/speculative.cpp, draft() of the simple draft (docs/policies/llama-cpp.md)"
    params = (
        Param("draft_max", 3, "--draft-max: most tokens drafted per round (common_params_speculative_draft.n_max)", COUNT),
        Param("draft_min", 0, "--draft-min: a draft that ends shorter than this is discarded whole, unverified "
              "(n_min)", NON_NEGATIVE),
        Param("p_min", 0.0, "--draft-p-min: a drafted token with top-1 probability below it ends the draft, unkept", PROBABILITY),
        Param("n_predict", 0, "-n of the llama-speculative-simple run to predict, on a llama.cpp trace (0: the "
              "protocol's budget rule)", NON_NEGATIVE),
    )
    choices = ("n-predict > 0 follows speculative-simple.cpp's own end of generation "
               "(docs/policies/llama-cpp.md), which needs a trace recorded by `simlab llama-cpp record`; "
               "a draft discarded by draft-min costs the draft steps it took and a one-token target step")

    def __init__(self, context, **values):
        super().__init__(context, **values)
        fixed = self.p_min == 0.0
        self._plan = Serial(self.draft_max, fixed=fixed, min_draft=self.draft_min)
        # speculative-simple.cpp's per-round cap n_predict - n_predict_so_far - 1, for the caps 1..draft_max - 1,
        # each planned once, when first met (a prompt meets a few of them)
        self._capped: dict[int, Serial] = {}

    def reset(self, prompt: PromptInfo) -> None:
        # The last round may start at committed = n_predict + 1 and draft draft_max tokens; the
        # protocol must not cap it, so the trace must hold that many positions.
        if self.n_predict and prompt.budget < self.n_predict + self.draft_max + 2:
            raise SimlabError(
                f"llama-cpp: n_predict={self.n_predict} with draft_max={self.draft_max} needs a trace of at "
                f"least {self.n_predict + self.draft_max + 2} positions per prompt, this one has {prompt.budget}"
            )

    def plan(self, state: RoundState) -> Plan:
        if not self.n_predict:
            # The round protocol caps the draft at remaining - 1 tokens, which is speculative-simple.cpp's
            # n_draft_max = min(n_max, n_predict - n_predict_so_far - 1).
            return self._plan
        # On a llama.cpp trace position 0 is the prompt's last token, so n_predict_so_far =
        # committed - 1 and the cap is n_predict - committed. A cap of 0 or less is clamped to 0,
        # which draft() reads as "no limit" (`dp.n_max > 0 && ...`): the round drafts draft_max.
        # A cap below draft_min still drafts, then draft() discards what it drafted.
        cap = self.n_predict - state.committed
        if not 1 <= cap < self.draft_max:
            return self._plan
        plan = self._capped.get(cap)
        if plan is None:
            plan = self._capped[cap] = Serial(cap, fixed=self._plan.fixed, min_draft=self.draft_min)
        return plan

    def done(self, committed: int) -> bool:
        # speculative-simple.cpp: `if (n_predict > params.n_predict || has_eos) break;`
        return bool(self.n_predict) and committed - 1 > self.n_predict

    def on_draft(self, signal: TokenSignal) -> Decision:
        # speculative.cpp draft(): `if (cur_p->data[0].p < params.p_min) { stop; continue; }`
        # -- the token is not pushed to the draft, so the target never sees it.
        return Decision.DROP if signal.confidence < self.p_min else Decision.DRAFT

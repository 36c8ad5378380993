"""Prompt lookup decoding: draft by copying what followed the context's last n-gram earlier in it.

Saxena 2023, "Prompt Lookup Decoding" (github.com/apoorvumang/prompt-lookup-decoding), as two
engines ship it, read in their sources:

- Hugging Face's ``generate(..., prompt_lookup_num_tokens=N)``: ``PromptLookupCandidateGenerator``
  (transformers, ``generation/candidate_generator.py``): n-gram sizes from
  ``max_matching_ngram_size`` (default 2) down to 1, the leftmost earlier window that matches,
  up to N tokens after it, cut before the first end token;
- vLLM's ``method: "ngram"`` (``vllm/v1/spec_decode/ngram_proposer.py``): the longest n-gram of
  ``prompt_lookup_min..prompt_lookup_max`` tokens (both 5 when neither is given) at its earliest
  occurrence, up to ``num_speculative_tokens`` tokens after it, end tokens kept.

Both take the longest n-gram at its earliest occurrence (:mod:`simlab.policies.ngram_match`, one
compiled function), so they differ only in the smallest n-gram and in the end-token cut: one
policy with those parameters, ``pld`` with Hugging Face's defaults and ``ngram`` with vLLM's.
Each round (Algorithm, per round):

1. look the context up: the prompt's tokens and the tokens committed so far, nothing else;
2. propose what followed the match, at most ``num_tokens`` and the budget's room;
3. the target verifies the proposal in one forward and keeps its longest prefix that is the
   target's own greedy continuation, plus the target's next token; no match: a plain target step.

Where the sources say nothing simlab needs: the lookup's cost. It runs on the host's CPU before
the target's forward, so it is priced (:meth:`PromptLookup.lookup_seconds`) from this
implementation's own timings, affine in the context length (``docs/policies/lookup.md``).

:class:`LookupThenDraft` (``pld-sd``) drafts by lookup where the lookup finds a match and by the
draft model otherwise: simlab's own combination (the sources above draft by one or the other).
"""

from __future__ import annotations

from typing import Sequence

from simlab.common.errors import SimlabError
from simlab.policies.base import BOOL, COUNT, Lookup, Param, Plan, Policy, RoundState, Serial
from simlab.policies.vllm import MAX_TOKENS, VLLM_END, VllmEnd

# What one lookup of this implementation costs on the host's CPU: seconds = FIXED + PER_TOKEN x
# context tokens, fitted to timings of PromptLookup.propose at every position of the shipped Qwen
# traces on the project's 2-core box (tools/lookup_cost.py; results/lookup/README.md).
PLD_COST = (3.0e-6, 3.7e-9)


def lookup_params(num_tokens: int, ngram_min: int, ngram_max: int, cut_at_eos: bool) -> tuple[Param, ...]:
    """Prompt lookup's parameters with one engine's defaults (Hugging Face's or vLLM's), under
    both engines' names."""
    return (
        Param("num_tokens", num_tokens, "tokens proposed after a match, at most", COUNT,
              aliases=("prompt_lookup_num_tokens", "num_speculative_tokens")),
        Param("ngram_max", ngram_max, "longest n-gram matched", COUNT,
              aliases=("max_matching_ngram_size", "prompt_lookup_max")),
        Param("ngram_min", ngram_min, "shortest n-gram matched", COUNT, aliases=("prompt_lookup_min",)),
        Param("cut_at_eos", cut_at_eos, "drop an end token and what follows it from a proposal", BOOL),
    )


class LookupPolicy(Policy):
    """What every policy that drafts by lookup shares: a :class:`Lookup` round of up to
    ``num_tokens`` tokens, no draft model, and the lookup priced from ``COST``: seconds =
    fixed + per_token x context tokens, this implementation's own timings on the project's CPU."""

    drafts = False  # no draft model: a round with no proposal is the plain target step
    looks_up = True
    COST: tuple[float, float] = (0.0, 0.0)

    def __init__(self, context, **values):
        super().__init__(context, **values)
        self._plan = Lookup(self.num_tokens)

    def plan(self, state: RoundState) -> Plan:
        return self._plan

    def lookup_seconds(self, context_len: int) -> float:
        fixed, per_token = self.COST
        return fixed + per_token * context_len


class PromptLookup(LookupPolicy):
    """``pld``: prompt lookup as Hugging Face's ``generate(prompt_lookup_num_tokens=N)`` runs it."""

    name = "pld"
    summary = "prompt lookup decoding: propose what followed the context's last n-gram earlier in it"
    paper = ("Saxena 2023, Prompt Lookup Decoding; transformers' PromptLookupCandidateGenerator "
             "(docs/policies/lookup.md)")
    params = lookup_params(10, 1, 2, True)
    choices = ("the lookup's CPU time is priced from this implementation's timings (affine in the context); "
               "a proposal never passes the budget's last position")
    COST = PLD_COST

    def __init__(self, context, **values):
        super().__init__(context, **values)
        if self.ngram_min > self.ngram_max:
            raise SimlabError(f"{self.name}: ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})")
        import simlab.policies.ngram_match as ngram_match  # numba: imported with the first lookup policy

        self._propose = ngram_match.propose
        self.eos = ngram_match.as_tokens(context.eos_token_ids)

    def propose(self, context: Sequence[int], cap: int) -> Sequence[int]:
        return self._propose(context, self.ngram_min, self.ngram_max, self.num_tokens, cap, self.eos, self.cut_at_eos)


class Ngram(VllmEnd, PromptLookup):
    """``ngram``: prompt lookup as vLLM's ``method: "ngram"`` runs it; with ``vllm_end``, each
    request's end too (:class:`~simlab.policies.vllm.VllmEnd`), what ``simlab vllm run --method
    ngram`` predicts.

    Read in vLLM 0.32.0: ``NgramProposer.propose`` (``v1/spec_decode/ngram_proposer.py``) runs after
    every step that sampled a token for the request (the prefill's first token included;
    ``GPUModelRunner.propose_draft_token_ids`` after ``_bookkeeping_sync``, which the CPU runner
    inherits, async scheduling being off on CPUs) over ``token_ids_cpu[:num_tokens_no_spec]``: the
    prompt and every token output so far. It proposes up to ``num_speculative_tokens`` tokens,
    capped only at ``max_model_len``, never at ``max_tokens``; an empty proposal schedules no draft
    (``Scheduler.schedule``: ``request.spec_token_ids`` empty), so the step is a plain decoding step
    and is neither a draft in ``SpecDecodingStats`` nor a step of ``per_step_drafted``
    (``update_from_output`` observes only scheduled drafts)."""

    name = "ngram"
    summary = "vLLM's n-gram proposer: prompt lookup of prompt_lookup_min..max-token n-grams"
    paper = "vLLM, vllm/v1/spec_decode/ngram_proposer.py (docs/policies/lookup.md)"
    params = (*lookup_params(5, 5, 5, False), VLLM_END, MAX_TOKENS)
    choices = PromptLookup.choices + "; with vllm_end, it does pass it in a request's last step, as vLLM's does"

    def __init__(self, context, **values):
        super().__init__(context, **values)
        self._end_as_vllm(context, self.num_tokens)


class LookupThenDraft(PromptLookup):
    """``pld-sd``: prompt lookup where it finds a match, the draft model (γ tokens) otherwise."""

    name = "pld-sd"
    summary = "prompt lookup where it finds a match, else γ tokens of the draft model"
    paper = "simlab's combination of prompt lookup and vanilla SD (docs/policies/lookup.md)"
    params = (*PromptLookup.params, Param("gamma", 3, "draft length γ of the draft model's rounds", COUNT))
    choices = PromptLookup.choices + "; a round whose lookup finds nothing drafts γ tokens with the draft model"
    drafts = True

    def __init__(self, context, **values):
        super().__init__(context, **values)
        self._plan = Lookup(self.num_tokens, fallback=Serial(self.gamma, fixed=True))

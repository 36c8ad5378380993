"""Suffix decoding: draft from suffix trees over the prompt and earlier responses.

Oliaro, Jia, Campos, Qiao, "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
Applications", 2024, arXiv:2411.04975, as vLLM's ``method: "suffix"`` runs it
(``vllm/v1/spec_decode/suffix_decoding.py``) through Arctic Inference's ``SuffixDecodingCache``
(``arctic_inference/suffix_decoding/cache.py``, the tree in ``csrc/suffix_decoding/suffix_tree.cc``),
read in their sources. Each round (§3, path speculation):

1. the request's own tree holds its prompt and the tokens generated so far; a global tree holds
   every response so far, earlier requests' and this one's (vLLM's cache across requests); each
   counts every substring of up to ``max_tree_depth`` tokens;
2. for every length m = 1, 2, … of the context's suffix (its last ``max_tree_depth`` tokens, m
   short of all of them) found in a tree, follow from that suffix the most frequent child
   token after token, each token's probability the running product of count(child) / count(node),
   while it stays ≥ ``min_token_prob``, at most min(``num_tokens``, ``max_spec_factor`` · m)
   tokens; score = the sum of the probabilities; keep the best score (a tie: the longer match);
3. propose the better of the two trees' drafts (a tie: the request's own).

The trees here count substrings in plain nested maps, not Arctic's path-compressed tree, and
order a node's children as Arctic's sibling lists do (decreasing count; a child whose count
rises joins the front of its new count's group when it led its old one and the back otherwise; a
new child joins the back), since the most frequent child on a tie is the first of that order.
Probabilities and scores are float32 sums and products, as Arctic computes them.

How vLLM 0.32.0 drives the cache (``SuffixDecodingProposer.propose``, called by
``GPUModelRunner.propose_draft_token_ids`` after every step that sampled a token for the request,
the prefill's first token included): at a request's first proposal ``start_request`` with its
prompt, then every step ``add_active_response`` with *all* the tokens the step sampled (the
request's tree and, under the request's sequence id, the global tree), then ``speculate`` on the
last ``max_tree_depth`` tokens with ``max_spec_tokens = min(num_speculative_tokens, max_model_len
- num_tokens - 1)``; an empty draft schedules no draft and counts as none (``Scheduler.schedule``,
``update_from_output``). With ``vllm_end`` (:class:`~simlab.policies.vllm.VllmEnd`) the last
step's proposal is not cut at the budget, what it accepts past the end counts, and the tokens
sampled past the end stay in the global tree, as vLLM adds them before its scheduler cuts the
output (this policy's :meth:`settle` reads the tokens committed, past the end included).

Where the sources say nothing simlab needs: without ``vllm_end`` a proposal never passes the
budget's last position (the budget's room is what ``max_spec_tokens`` is given, where vLLM gives
``max_model_len``'s);
the global cache keeps every response of the run (vLLM evicts past 10,000 requests); the
lookup's CPU time is priced as Arctic Inference's C++ cache takes it (what vLLM runs), not as this
Python model of it does (``docs/policies/lookup.md``).
"""

from __future__ import annotations

from typing import Sequence

from simlab.common.errors import SimlabError
from simlab.policies.base import BOOL, COUNT, POSITIVE, PROBABILITY, Param, PromptInfo
from simlab.policies.lookup import LookupPolicy
from simlab.policies.vllm import MAX_TOKENS, VLLM_END, VllmEnd

# seconds per lookup: what vLLM runs, Arctic Inference's C++ cache (taking a round's tokens and
# speculating), its median at every position of two shipped Qwen traces, 44 and 86 us
# (results/lookup/arctic_check.py); this module's Python model of it takes about ten times that
SUFFIX_COST = (6.5e-5, 0.0)


class SuffixDecoding(VllmEnd, LookupPolicy):
    """``suffix``: vLLM's suffix decoding (Arctic Inference's cache), path speculation."""

    name = "suffix"
    summary = "suffix decoding: draft from suffix trees over the prompt and earlier responses"
    paper = "Oliaro et al. 2024, SuffixDecoding, arXiv:2411.04975; vLLM's method 'suffix' (docs/policies/lookup.md)"
    params = (
        Param("num_tokens", 24, "tokens proposed at most (vLLM: the tree depth unless given)", COUNT,
              aliases=("num_speculative_tokens",)),
        Param("max_tree_depth", 24, "longest substring the trees count", COUNT,
              aliases=("suffix_decoding_max_tree_depth",)),
        Param("max_spec_factor", 1.0, "a match of m tokens proposes at most factor x m", POSITIVE,
              aliases=("suffix_decoding_max_spec_factor",)),
        Param("min_token_prob", 0.1, "stop where a token's estimated probability drops below this", PROBABILITY,
              aliases=("suffix_decoding_min_token_prob",)),
        Param("global_cache", True, "also draft from every earlier response of the run", BOOL),
        VLLM_END,
        MAX_TOKENS,
    )
    choices = ("the budget's room caps max_spec_tokens; the global cache keeps the whole run (no eviction); the "
               "lookup's CPU time is priced as Arctic Inference's C++ cache takes it")
    COST = SUFFIX_COST

    def __init__(self, context, **values):
        super().__init__(context, **values)
        import simlab.policies.suffix_tree as suffix_tree  # numpy: imported with the policy, not with every command

        self._tree, self._token_list = suffix_tree.SuffixTree, suffix_tree.token_list
        self._global = self._tree(self.max_tree_depth)
        self._seq = -1  # this prompt's sequence in the global tree
        self._local = None  # this prompt's own tree, from its first lookup
        self._prompt_len = self._seen = 0
        self._end_as_vllm(context, self.num_tokens)

    def reset(self, prompt: PromptInfo) -> None:
        super().reset(prompt)
        self._seq += 1
        self._local, self._prompt_len = None, prompt.prompt_len

    def _take(self, context: Sequence[int]) -> None:
        """Bring both trees up to ``context``: the prompt at the prompt's first lookup (its own tree),
        then every token generated since the last (both trees)."""
        tokens = self._token_list(context)
        if self._local is None:
            if len(tokens) < self._prompt_len:
                raise SimlabError("suffix: a lookup's context is shorter than its prompt")
            self._local = self._tree(self.max_tree_depth)
            self._local.extend(0, tokens[:self._prompt_len])
            self._seen = self._prompt_len
        new = tokens[self._seen:]
        self._local.extend(0, new)
        if self.global_cache:
            self._global.extend(self._seq, new)
        self._seen = len(tokens)

    def propose(self, context: Sequence[int], cap: int) -> Sequence[int]:
        self._take(context)
        pattern = self._token_list(context[-self.max_tree_depth:])
        ours, score = self._local.speculate(pattern, cap, self.max_spec_factor, self.min_token_prob)
        if self.global_cache:
            theirs, their_score = self._global.speculate(pattern, cap, self.max_spec_factor, self.min_token_prob)
            if their_score > score:
                ours = theirs
        return tuple(ours)

    def settle(self, context: Sequence[int], cap: int = 0) -> Sequence[int]:
        self._take(context)
        return ()

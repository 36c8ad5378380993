"""Prompt lookup's n-gram match, compiled with numba: one function for the policy and the replay.

:class:`~simlab.policies.lookup.PromptLookup` calls :func:`match` once a round (live, and in the
SimPy executor), and the simulator's prompt-lookup replay (:mod:`simlab.sim.lookup_rounds`) calls
it from its own compiled loop, so the two propose the same tokens by construction.

The rule, which Hugging Face's ``PromptLookupCandidateGenerator.get_candidates``
(transformers, ``generation/candidate_generator.py``) and vLLM's
``_find_longest_matched_ngram_and_propose_tokens`` (``vllm/v1/spec_decode/ngram_proposer.py``)
both implement, the first by trying n-gram sizes from the largest down and taking the leftmost
window that matches, the second by a KMP pass over the reversed context: the longest n-gram of
``min_ngram..max_ngram`` tokens ending the context that also occurs earlier in it (overlapping
occurrences count; the suffix itself does not), at its earliest occurrence; the proposal is what
followed that occurrence, up to the end of the context.

:func:`propose` is the policy's one call a round: the context as an array, the match, the length.
Imported with the first lookup policy, not with every simlab command (numba's import takes
0.15-0.35 s). Editing this file: numba caches the compiled function beside this file and checks
only this file, so the compiled replay that calls it keeps the old code until
``simlab/sim/__pycache__/*.nbi`` and ``*.nbc`` are deleted (its tests then fail, not pass).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def as_tokens(ids) -> np.ndarray:
    """Token ids as the compiled functions take them."""
    return np.asarray(ids, dtype=np.int64)


def propose(context, ngram_min: int, ngram_max: int, num_tokens: int, cap: int, eos: np.ndarray,
            cut_at_eos: bool) -> tuple[int, ...]:
    """The tokens prompt lookup proposes after ``context`` (:func:`match`, then
    :func:`proposal_length`); nothing when no n-gram matches."""
    tokens = as_tokens(context)
    n = len(tokens)
    start, size = match(tokens, n, ngram_min, ngram_max)
    if not size:
        return ()
    k = proposal_length(tokens, n, start, num_tokens, cap, eos, cut_at_eos)
    return tuple(tokens[start:start + k].tolist())


@njit(cache=True)
def match(tokens, n, min_ngram, max_ngram):
    """Where the continuation of the longest matching n-gram of ``tokens[:n]`` starts, and the
    n-gram's size; ``(0, 0)`` when no n-gram of ``min_ngram..max_ngram`` tokens ending
    ``tokens[:n]`` occurs earlier in it. Reads nothing at or past ``n``."""
    top = min(max_ngram, n - 1)
    for size in range(top, min_ngram - 1, -1):
        tail = n - size
        for i in range(tail):  # i < n - size: an earlier occurrence, whose continuation is not empty
            j = 0
            while j < size and tokens[i + j] == tokens[tail + j]:
                j += 1
            if j == size:
                return i + size, size
    return 0, 0


@njit(cache=True)
def proposal_length(tokens, n, start, num_tokens, cap, eos, cut_at_eos):
    """How many tokens from ``start`` the lookup proposes: at most ``num_tokens`` and ``cap``, no
    further than ``n`` (what followed the match within the context), and, with ``cut_at_eos``,
    short of the first end token (Hugging Face's generator drops it and what follows)."""
    k = min(num_tokens, cap, n - start)
    if cut_at_eos:
        for j in range(k):
            for e in eos:
                if tokens[start + j] == e:
                    return j
    return k

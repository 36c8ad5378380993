"""REST: draft by retrieving what followed the context's suffix in a datastore of token sequences.

He, Zhong, Cai, Lee, He, "REST: Retrieval-Based Speculative Decoding", 2023, arXiv:2311.08252.
Each round (§3.1-3.2):

1. retrieval: the longest suffix of the context, from ``max_suffix`` tokens down to
   ``min_suffix``, that occurs in the datastore (:mod:`simlab.common.datastore`, a suffix array);
   the continuations of its occurrences (at most ``max_matches``, in suffix-array order);
2. draft construction: REST builds a trie of those continuations and drafts its most frequent
   prefixes as a tree; here the single most frequent path — at each depth the continuation token
   most of the remaining occurrences share (a tie: the smallest token id), at most ``num_tokens``;
3. the target verifies it in one forward (no match: a plain target step).

Steps 1-2 are :meth:`simlab.common.datastore.Datastore.continuation`, which holds the numbers.

Where the paper says nothing simlab needs, or simlab departs from it: one chain, not REST's
draft tree (tree verification of retrieved drafts is not modelled yet); a prompt never retrieves
from its own answer (sequences are keyed by their prompt's fingerprint), which a decoder could
not have seen; the lookup's CPU time is priced from this implementation's timings
(``docs/policies/lookup.md``). The datastore is read from its file once per process (the one
read this policy does: it decides from the datastore as from a table).
"""

from __future__ import annotations

from typing import Any, Sequence

from simlab.common.errors import SimlabError
from simlab.policies.base import COUNT, Kind, Param, PromptInfo
from simlab.policies.lookup import LookupPolicy

# REST's default longest suffix (§4.1), which is also the longest the datastore indexes
# (simlab.common.datastore.KEY; a test holds the two equal): here so that declaring the policy
# needs no numpy, which the datastore imports and every `--help` would then pay for
MAX_SUFFIX = 16
REST_COST = (1.07e-3, 2.5e-7)  # seconds per lookup, fitted as PLD_COST is (tools/lookup_cost.py)


def check_path(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise SimlabError(f"{name} must be a path (simlab datastore build writes one), got {value!r}")
    return value


PATH = Kind(str, "a file path", check_path)


class Rest(LookupPolicy):
    """``rest``: retrieval-based drafting from a datastore (REST), one chain per round."""

    name = "rest"
    summary = "REST: draft what most often followed the context's suffix in a datastore"
    paper = "He et al. 2023, REST: Retrieval-Based Speculative Decoding, arXiv:2311.08252 (docs/policies/lookup.md)"
    params = (
        Param("datastore", None, "the datastore file (simlab datastore build)", PATH),
        Param("num_tokens", 10, "tokens proposed at most", COUNT),
        Param("max_suffix", MAX_SUFFIX, f"longest context suffix searched (at most {MAX_SUFFIX})", COUNT),
        Param("min_suffix", 2, "shortest context suffix searched", COUNT),
        Param("max_matches", 5000, "occurrences whose continuations are counted, at most", COUNT),
    )
    choices = ("one chain (the most frequent continuation), not REST's draft tree; a prompt never retrieves its "
               "own answer; the lookup's CPU time is priced from this implementation's timings")
    COST = REST_COST

    def __init__(self, context, **values):
        super().__init__(context, **values)
        from simlab.common import datastore  # numpy: imported with the policy, not with every command

        if self.datastore is None:
            raise SimlabError("rest needs datastore=PATH: build one with simlab datastore build --trace TRACE --out PATH")
        if not self.min_suffix <= self.max_suffix <= datastore.KEY:
            raise SimlabError(f"rest: need min_suffix <= max_suffix <= {datastore.KEY}, got {self.min_suffix} and "
                              f"{self.max_suffix}")
        self.store = datastore.load(self.datastore)
        self._own = None  # per sequence of the store: whether it answered this prompt (a bool array)
        self._prompt_len = 0

    def reset(self, prompt: PromptInfo) -> None:
        self._own, self._prompt_len = None, prompt.prompt_len

    def propose(self, context: Sequence[int], cap: int) -> Sequence[int]:
        if self._own is None:
            self._own = self.store.answered(context[:self._prompt_len])
        return self.store.continuation(context, self._own, self.min_suffix, self.max_suffix, self.max_matches,
                                       min(self.num_tokens, cap))

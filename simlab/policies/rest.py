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

Where the paper says nothing simlab needs, or simlab departs from it: one chain, not REST's
draft tree (tree verification of retrieved drafts is not modelled yet); a prompt never retrieves
from its own answer (sequences are keyed by their prompt's fingerprint), which a decoder could
not have seen; the lookup's CPU time is priced from this implementation's timings
(``docs/policies/lookup.md``). The datastore is read from its file once per process (the one
read this policy does: it decides from the datastore as from a table).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from simlab.common.datastore import KEY, SEPARATOR, fingerprint, load
from simlab.common.errors import SimlabError
from simlab.policies.base import COUNT, Kind, Param, PromptInfo
from simlab.policies.lookup import LookupPolicy

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
        Param("max_suffix", KEY, f"longest context suffix searched (at most {KEY})", COUNT),
        Param("min_suffix", 2, "shortest context suffix searched", COUNT),
        Param("max_matches", 5000, "occurrences whose continuations are counted, at most", COUNT),
    )
    choices = ("one chain (the most frequent continuation), not REST's draft tree; a prompt never retrieves its "
               "own answer; the lookup's CPU time is priced from this implementation's timings")
    COST = REST_COST

    def __init__(self, context, **values):
        super().__init__(context, **values)
        if self.datastore is None:
            raise SimlabError("rest needs datastore=PATH: build one with simlab datastore build --trace TRACE --out PATH")
        if not self.min_suffix <= self.max_suffix <= KEY:
            raise SimlabError(f"rest: need min_suffix <= max_suffix <= {KEY}, got {self.min_suffix} and "
                              f"{self.max_suffix}")
        self.store = load(self.datastore)
        self._keys = np.asarray(self.store.keys)
        self._own: np.ndarray | None = None  # per sequence: whether it answered this prompt
        self._prompt_len = 0

    def reset(self, prompt: PromptInfo) -> None:
        self._own, self._prompt_len = None, prompt.prompt_len

    def propose(self, context: Sequence[int], cap: int) -> Sequence[int]:
        tokens = np.asarray(context)
        if self._own is None:
            self._own = self._keys == fingerprint(tokens[:self._prompt_len])
        store, own = self.store, self._own
        for length in range(min(self.max_suffix, len(tokens)), self.min_suffix - 1, -1):
            found = store.occurrences(tokens[-length:])
            found = found[~own[store.owner[found]]] + length  # where each continuation starts
            found = found[store.tokens[found] != SEPARATOR]
            if len(found):
                break
        else:
            return ()
        at = found[:self.max_matches]
        draft: list[int] = []
        for depth in range(min(self.num_tokens, cap)):
            following = store.tokens[at + depth]  # a continuation ends at its separator: never read past it
            values, counts = np.unique(following[following != SEPARATOR], return_counts=True)
            if not len(values):
                break
            best = values[np.argmax(counts)]
            draft.append(int(best))
            at = at[following == best]
        return tuple(draft)

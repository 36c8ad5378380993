"""REST's datastore: token sequences to retrieve drafts from, with a suffix array to find them.

He, Zhong, Cai, Lee, He, "REST: Retrieval-Based Speculative Decoding", 2023, arXiv:2311.08252,
§3.1: the datastore holds (context, continuation) pairs as one token array searched by a suffix
array, so that every occurrence of a context suffix is found in O(log N) comparisons. Here it is
one int32 array of sequences, each followed by a separator (-1), and the suffix array orders
every position by its next :data:`KEY` tokens (a suffix searched is at most that long).

Each sequence carries the fingerprint of the prompt it answered (``keys``): a prompt retrieves
nothing from its own answer, which a real decoder could not have seen (built by ``simlab
datastore build`` from a trace's outputs, then simulated on prompts of that same trace).
Written by :meth:`Datastore.save` as one ``.npz`` (numpy's own format), read by :func:`load`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from simlab.common.atomic import replace_file
from simlab.common.errors import SimlabError

KEY = 16  # the longest suffix REST searches (its default maximum, §4.1)
SEPARATOR = -1
FORMAT = "simlab-datastore-1"


def fingerprint(prompt_tokens: Sequence[int]) -> str:
    """The key of a prompt: a sha256 of its token ids."""
    return hashlib.sha256(np.asarray(prompt_tokens, dtype=np.int64).tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Datastore:
    tokens: np.ndarray  # int32: every sequence then SEPARATOR
    owner: np.ndarray  # int32 per token: the sequence it belongs to
    keys: tuple[str, ...]  # per sequence: its prompt's fingerprint
    order: np.ndarray  # int64: the positions sorted by their next KEY tokens (the suffix array)
    source: str = ""

    @classmethod
    def build(cls, sequences: Sequence[Sequence[int]], keys: Sequence[str], source: str = "") -> "Datastore":
        if not sequences:
            raise SimlabError("a datastore needs at least one sequence")
        parts = [np.append(np.asarray(s, dtype=np.int32), np.int32(SEPARATOR)) for s in sequences]
        tokens = np.concatenate(parts)
        owner = np.repeat(np.arange(len(parts), dtype=np.int32), [len(p) for p in parts])
        padded = np.concatenate([tokens, np.full(KEY, SEPARATOR, dtype=np.int32)])
        windows = np.lib.stride_tricks.sliding_window_view(padded, KEY)[:len(tokens)]
        order = np.lexsort(windows.T[::-1]).astype(np.int64)  # the first token is the primary key
        return cls(tokens, owner, tuple(keys), order, source)

    @classmethod
    def of_outputs(cls, answers: Sequence[tuple[Sequence[int], Sequence[int]]], source: str = "") -> "Datastore":
        """The outputs of (prompt tokens, output tokens) pairs, each keyed by its prompt."""
        return cls.build([out for _, out in answers], [fingerprint(prompt) for prompt, _ in answers], source)

    def save(self, path: Path) -> None:
        """Write the datastore to ``path`` in one step (a crash leaves no half-written file)."""
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, format=np.array(FORMAT), tokens=self.tokens, owner=self.owner, keys=np.array(self.keys),
                         order=self.order, source=np.array(self.source))

        replace_file(path, write)

    def occurrences(self, pattern: Sequence[int]) -> np.ndarray:
        """Positions where ``pattern`` (at most :data:`KEY` tokens) occurs, in suffix-array order."""
        tokens, order, m = self.tokens, self.order, len(pattern)
        target = tuple(int(t) for t in pattern)

        def key(pos: int) -> tuple[int, ...]:
            return tuple(tokens[pos:pos + m].tolist())

        lo, hi = 0, len(order)
        while lo < hi:  # the first suffix >= pattern
            mid = (lo + hi) // 2
            if key(int(order[mid])) < target:
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, len(order)
        while lo < hi:  # the first suffix that does not start with pattern
            mid = (lo + hi) // 2
            if key(int(order[mid])) <= target:
                lo = mid + 1
            else:
                hi = mid
        return order[first:lo]

    def answered(self, prompt_tokens: Sequence[int]) -> np.ndarray:
        """Per sequence: whether it is the answer to ``prompt_tokens`` (REST must not retrieve it)."""
        return np.asarray(self.keys) == fingerprint(prompt_tokens)

    def continuation(self, context: Sequence[int], excluded: np.ndarray, min_suffix: int, max_suffix: int,
                     max_matches: int, length: int) -> tuple[int, ...]:
        """REST's draft after ``context`` as :class:`~simlab.policies.rest.Rest` takes it (its steps
        1-2): the continuations of the longest suffix of ``max_suffix`` down to ``min_suffix``
        tokens found outside the ``excluded`` sequences (the first ``max_matches``, in suffix-array
        order), then, up to ``length`` tokens, the token most of those still followed share (a tie:
        the smallest id). Nothing when no suffix is found."""
        tokens = np.asarray(context)
        for size in range(min(max_suffix, len(tokens)), min_suffix - 1, -1):
            found = self.occurrences(tokens[-size:])
            found = found[~excluded[self.owner[found]]] + size  # where each continuation starts
            found = found[self.tokens[found] != SEPARATOR]
            if len(found):
                break
        else:
            return ()
        at = found[:max_matches]
        draft: list[int] = []
        for depth in range(length):
            following = self.tokens[at + depth]  # a continuation ends at its separator: never read past it
            values, counts = np.unique(following[following != SEPARATOR], return_counts=True)
            if not len(values):
                break
            best = values[np.argmax(counts)]
            draft.append(int(best))
            at = at[following == best]
        return tuple(draft)


@lru_cache(maxsize=4)
def load(path: str) -> Datastore:
    """The datastore at ``path`` (read once per process and path)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if str(f["format"]) != FORMAT:
                raise SimlabError(f"{path} is not a simlab datastore (format {str(f['format'])!r})")
            return Datastore(f["tokens"], f["owner"], tuple(f["keys"].tolist()), f["order"], str(f["source"]))
    except FileNotFoundError:
        raise SimlabError(f"no datastore at {path}; build one with simlab datastore build") from None
    except (OSError, KeyError, ValueError) as exc:
        raise SimlabError(f"{path} is not a simlab datastore ({exc})") from None

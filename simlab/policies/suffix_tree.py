"""Suffix decoding's trees as :mod:`simlab.policies.suffix` describes them (its module docstring),
in plain nested maps with Arctic Inference's sibling order and float32 scores.

A module of its own so that declaring the policy imports no numpy (every command's ``--help``
lists the policies); :class:`~simlab.policies.suffix.SuffixDecoding` imports it when built.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

F32 = np.float32


def token_list(context: Sequence[int]) -> list[int]:
    """A context (a list or an array) as a list of Python ints, what the trees are keyed by."""
    return np.asarray(context).tolist()


class SuffixTree:
    """Every substring of up to ``depth`` tokens of the sequences added, with its count, in nested
    nodes ``[count, children by token, child tokens in Arctic's sibling order]``."""

    def __init__(self, depth: int):
        self.depth = depth
        self.root: list = [0, {}, []]
        self._active: dict[int, list] = {}  # per sequence: the nodes of its last suffixes, longest first

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to sequence ``seq``: each new suffix of up to ``depth`` tokens is counted."""
        active = self._active.setdefault(seq, [])
        root, depth = self.root, self.depth
        for token in tokens:
            active.append(root)
            root[0] += 1
            if len(active) > depth:
                del active[0]
            for i, node in enumerate(active):
                kids = node[1]
                child = kids.get(token)
                if child is None:
                    child = kids[token] = [1, {}, []]
                    node[2].append(token)  # a new child joins the back of the order
                else:
                    if node is not root:  # the root's order is never read (a match has length >= 1)
                        _promote(node, token, child[0])
                    child[0] += 1
                active[i] = child

    def speculate(self, context: Sequence[int], max_tokens: int, factor: float, min_prob: float) -> tuple[list[int], F32]:
        """The best-scoring draft after ``context`` (:mod:`simlab.policies.suffix`, step 2) and its score."""
        best, best_score = [], F32(0.0)
        root, n, floor, factor = self.root, len(context), F32(min_prob), F32(factor)
        for m in range(1, n):
            node = root
            for token in context[n - m:]:
                node = node[1].get(token)
                if node is None:
                    return best, best_score
            cap = min(max_tokens, int(float(F32(m) * factor) + 1e-6))
            draft, score, prob = [], F32(0.0), F32(1.0)
            while len(draft) < cap:
                order = node[2]
                if not order:
                    break
                child = node[1][order[0]]
                prob = F32(prob * (F32(child[0]) / F32(node[0])))
                if prob < floor:
                    break
                draft.append(order[0])
                score = F32(score + prob)
                node = child
            if score >= best_score:
                best, best_score = draft, score
        return best, best_score


def _promote(parent: list, token: int, count: int) -> None:
    """Move child ``token`` (``count`` before it rises by one) where Arctic's sibling list puts it."""
    order, kids = parent[2], parent[1]
    j = order.index(token)
    if j == 0:
        return
    before = kids[order[j - 1]][0]
    if before > count + 1:
        return
    h = j - 1  # the front of the group of counts equal to the one just before it
    while h > 0 and kids[order[h - 1]][0] == before:
        h -= 1
    del order[j]
    order.insert(h, token)

"""Sequoia's dynamic programme: the tree of at most ``n`` nodes and depth ``d`` that maximises
the expected number of accepted drafts, from positional acceptance.

Why positional. Sequoia (Chen et al. 2024, "Sequoia: Scalable, Robust, and Hardware-aware
Speculative Decoding", arXiv 2402.12374) assumes the chance that the target's token is a node's
``r``-th candidate depends only on ``r``: ``accept[r]``. A node's path is accepted with the
product of its ranks' chances, so the expected accepted length is the sum of those products over
all nodes, and the best tree splits its budget among children by a dynamic programme. simlab
estimates ``accept[r]`` from a trace's recorded ranks (how often the target's token had rank r).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from simlab.trees.draft_tree import ROOT, DraftTree


def best_tree(accept: Sequence[float], n: int, depth: int) -> tuple[float, DraftTree]:
    """The expected accepted drafts and the tree that achieves them (ties keep fewer nodes)."""
    return _best_tree(tuple(accept), n, depth)


@lru_cache(maxsize=64)
def _best_tree(p: tuple[float, ...], n: int, depth: int) -> tuple[float, DraftTree]:
    """:func:`best_tree`, remembered: every ``tree-static`` policy built on one trace with the
    same ``n`` and ``depth`` asks for the same tree (a sweep builds one per run), and the
    programme takes longer than simulating the run (a DraftTree is immutable, so it is shared)."""

    @lru_cache(maxsize=None)
    def forest(budget: int, d: int, r: int) -> tuple[float, tuple]:
        """Best children of ranks >= r under an accepted node, ``budget`` nodes, depth <= d.
        Returns (value, ((rank, subtree_size, subtree_plan), ...))."""
        if budget == 0 or d == 0 or r >= len(p):
            return 0.0, ()
        best = forest(budget, d, r + 1) if r + 1 < len(p) else (0.0, ())
        for m in range(1, budget + 1):  # the rank-r child and m - 1 descendants
            below, plan = forest(m - 1, d - 1, 0)
            rest, others = forest(budget - m, d, r + 1)
            value = p[r] * (1.0 + below) + rest
            if value > best[0] + 1e-12:
                best = (value, ((r, plan), *others))
        return best

    value, plan = forest(n, depth, 0)
    parents: list[int] = []
    ranks: list[int] = []
    queue = [(ROOT, plan)]
    while queue:  # breadth-first, so parents precede children
        parent, children = queue.pop(0)
        for rank, sub in children:
            parents.append(parent)
            ranks.append(rank)
            queue.append((len(parents) - 1, sub))
    return value, DraftTree(tuple(parents), tuple(ranks))

"""The candidates of a tree grown level by level (EAGLE-2, the acceptance-guided tree).

A dynamic tree round shows the policy, after each draft forward, the top-k children of every
node it expanded, with the draft's probabilities. Candidates are numbered in the order they
arrive; a candidate's *value* is the product of the draft probabilities on its path (EAGLE-2
§4.1, "confidence score"; taken as P̂_acc by the acceptance-guided rule). The policy then
names the candidates to verify, and :meth:`Candidates.tree` turns them into a
:class:`~simlab.trees.draft_tree.DraftTree`.
"""

from __future__ import annotations

from typing import Sequence

from simlab.trees.draft_tree import ROOT, DraftTree


class Candidates:
    """Every candidate of one round: parent (candidate number or ``ROOT``), rank among its
    parent's children, draft probability, value (path product), depth; ``levels[d - 1]`` is
    the range of candidate numbers at depth d."""

    __slots__ = ("parents", "ranks", "probs", "values", "depths", "levels")

    def __init__(self) -> None:
        self.parents: list[int] = []
        self.ranks: list[int] = []
        self.probs: list[float] = []
        self.values: list[float] = []
        self.depths: list[int] = []
        self.levels: list[range] = []

    def add_level(self, children: Sequence[tuple[int, int, float]]) -> None:
        """(parent, rank, probability) of each new candidate, as a draft forward answered them."""
        start, depth = len(self.parents), len(self.levels) + 1
        values = self.values
        add_parent, add_rank, add_prob, add_value = (self.parents.append, self.ranks.append, self.probs.append,
                                                     values.append)
        for parent, rank, prob in children:
            add_parent(parent)
            add_rank(rank)
            add_prob(prob)
            add_value(prob if parent == ROOT else values[parent] * prob)
        self.depths.extend([depth] * len(children))
        self.levels.append(range(start, len(self.parents)))

    def __len__(self) -> int:
        return len(self.parents)

    def best(self, among: Sequence[int] | range, n: int) -> list[int]:
        """The ``n`` candidates of ``among`` with the largest value, ties to the earlier one."""
        values = self.values
        return sorted(among, key=lambda i: (-values[i], i))[:n]

    def tree(self, chosen: Sequence[int]) -> DraftTree | str:
        """The chosen candidates as a tree (in candidate order), or why they do not form one."""
        keep = sorted(set(chosen))
        if len(keep) != len(chosen):
            return "a candidate is chosen twice"
        index = {c: i for i, c in enumerate(keep)}
        parents = []
        for c in keep:
            if not 0 <= c < len(self.parents):
                return f"candidate {c} does not exist ({len(self.parents)} candidates)"
            p = self.parents[c]
            if p != ROOT and p not in index:
                return f"candidate {c} is chosen without its parent {p}"
            parents.append(ROOT if p == ROOT else index[p])
        return DraftTree(tuple(parents), tuple(self.ranks[c] for c in keep))

"""Tree data of a trace as a replay reads it: where the target's token ranks among the draft's
candidates, and EAGLE-2's recorded candidate trees (``simlab.record.tree_expansion``).

Greedy verification accepts the longest root-to-node path of a draft tree whose tokens are the
target's. A node is named by its parent and its rank among the parent's candidates, so a tree
round is answered by the *ranks of the target's tokens* along its path:

- fixed shapes read them from topk.parquet: at position t, the rank of the target's token among
  the draft's top-K given the true prefix. Rank 0 is defined by the trace's acceptance bits
  (the draft's greedy token is the target's), so a width-one tree replays exactly as a chain,
  on any greedy trace, with or without the table;
- EAGLE-2 trees follow the target's tokens through the recorded candidate tree of the round's
  first position (the nodes there were computed in the expansion's own forwards).
"""

from __future__ import annotations

import numpy as np

from simlab.common.errors import SimlabError
from simlab.trace.schema import NOT_IN_TOPK
from simlab.trace.tables import Columns


def target_ranks(topk: Columns | None, k: int, target: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """The rank of the target's token at every position (rows sorted like positions.parquet);
    0 where the draft's greedy token was accepted, ``NOT_IN_TOPK`` where unknown or absent."""
    ranks = np.where(accept, 0, NOT_IN_TOPK).astype(np.int64)
    if topk is None:
        return ranks
    tokens = topk.sorted_by(["prompt_id", "pos", "rank"])["token"].astype(np.int64).reshape(-1, k)
    match = tokens == target[:, None]
    match[:, 0] = False  # rank 0 is the acceptance bit (module docstring)
    found = match.any(axis=1)
    return np.where(accept, 0, np.where(found, match.argmax(axis=1), NOT_IN_TOPK))


class Expansions:
    """One prompt's recorded EAGLE-2 candidate trees, one per position, read lazily."""

    __slots__ = ("topk", "depth", "size", "parent", "rank", "prob", "token", "target", "_cache")

    def __init__(self, topk: int, depth: int, parent: np.ndarray, rank: np.ndarray, prob: np.ndarray, token: np.ndarray,
                 target: list[int]):
        self.topk, self.depth = topk, depth
        self.size = topk + (depth - 1) * topk ** 2  # nodes per position
        self.parent, self.rank, self.prob, self.token = parent, rank, prob, token
        self.target = target
        self._cache: dict[int, ExpansionAt] = {}

    def at(self, pos: int) -> "ExpansionAt":
        tree = self._cache.get(pos)
        if tree is None:
            lo, hi = pos * self.size, (pos + 1) * self.size
            tree = self._cache[pos] = ExpansionAt(self.parent[lo:hi].tolist(), self.rank[lo:hi].tolist(),
                                                  self.prob[lo:hi].tolist(), self.token[lo:hi].tolist(),
                                                  self.target[pos:])
        return tree


class ExpansionAt:
    """The candidate tree recorded at one position: children per node in rank order, and the
    ranks of the target's tokens along it (as deep as the recorded tree follows them)."""

    __slots__ = ("children", "prob", "answers", "path_ranks")

    def __init__(self, parent: list[int], rank: list[int], prob: list[float], token: list[int], target: list[int]):
        children: dict[int, list[int]] = {}
        for node, p in enumerate(parent):
            children.setdefault(p, []).append(node)
        self.children = {p: tuple(sorted(kids, key=rank.__getitem__)) for p, kids in children.items()}
        self.prob = prob
        # per expanded node, its children as a tree round's answer lists them: (rank, probability)
        self.answers = {p: tuple((rank[c], prob[c]) for c in kids) for p, kids in self.children.items()}
        ranks: list[int] = []
        node = -1
        for want in target:
            kids = self.children.get(node, ())
            node = next((c for c in kids if token[c] == want), None)
            if node is None:
                break
            ranks.append(rank[node])
        self.path_ranks = tuple(ranks)


def group_expansions(tree: Columns, topk: int, depth: int, prompt_ids: list[int],
                     targets: list[list[int]]) -> dict[int, Expansions]:
    """Per prompt, its :class:`Expansions` (``tree`` holds EAGLE-2 trees of ``topk`` and ``depth``)."""
    t = tree.sorted_by(["prompt_id", "pos", "node"])
    pid = t["prompt_id"].astype(np.int64)
    cols = {c: t[c] for c in ("parent", "rank", "token")}
    prob = t["prob"].astype(np.float64)
    out = {}
    for p, target in zip(prompt_ids, targets):
        lo, hi = np.searchsorted(pid, [p, p + 1])
        out[p] = Expansions(topk, depth, cols["parent"][lo:hi], cols["rank"][lo:hi], prob[lo:hi], cols["token"][lo:hi],
                            target)
    return out


def rank_acceptance(ranks: list[list[int]], topk: int) -> list[float]:
    """Sequoia's positional acceptance: the share of positions whose target token is the draft's
    r-th candidate, r = 0..topk-1 (over every prompt's positions)."""
    flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in ranks]) if ranks else np.zeros(0, np.int64)
    counts = np.bincount(flat[flat >= 0], minlength=topk)[:topk]
    return (counts / max(len(flat), 1)).tolist()


def missing_tree_data(what: str, flag: str) -> SimlabError:
    """The one-line error of a tree policy on a trace recorded without tree data."""
    return SimlabError(f"{what} needs tree data this trace was recorded without; record it with {flag}")

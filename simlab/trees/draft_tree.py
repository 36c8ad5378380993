"""A draft tree as data: every node names its parent and which of the parent's draft candidates it is.

Why this shape. Tree policies (a fixed shape per depth, Sequoia's optimised shapes, EAGLE-2's
reranked trees) differ only in *which* nodes they propose, so the executor sees one structure,
not one code path per shape. A node is the ``rank``-th most likely draft token (0-based) after
its parent's prefix; node ``-1`` is the root, the last committed token. Under greedy
verification the target accepts the longest root-to-node path whose tokens equal its own, so a
trace that stores, at every position, the rank of the target's token among the draft's
candidates given the true prefix answers every tree exactly: only on-path nodes can be accepted,
and for them the recorded prefix *is* their prefix.

A chain of ``k`` drafts is the tree ``parents = (-1, 0, 1, ..., k-2)``, all ranks 0 (the draft's
greedy token), so ``sd`` through a tree is the width-one case.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from simlab.common.errors import SimlabError
from simlab.trace.schema import NOT_IN_TOPK

ROOT = -1  # the parent index of depth-1 nodes: the last committed token


@dataclass(frozen=True)
class DraftTree:
    """Nodes in proposal order: ``parents[i] < i`` (or ``ROOT``), ``ranks[i]`` distinct among siblings."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.parents)

    def depths(self) -> tuple[int, ...]:
        """Depth of every node (depth-1 nodes hang off the root)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p == ROOT else out[p] + 1)
        return tuple(out)

    @cached_property
    def depth(self) -> int:
        return max(self.depths(), default=0)

    @cached_property
    def child(self) -> dict[tuple[int, int], int]:
        """(parent, rank) -> node: how verification walks the tree."""
        return {(p, r): i for i, (p, r) in enumerate(zip(self.parents, self.ranks))}

    @cached_property
    def widths(self) -> tuple[int, ...]:
        """Nodes the draft runs a forward over to draft each depth: the root for depth 1, then the
        nodes of depth d - 1 that have children (a chain of k: k forwards of one node)."""
        depths = self.depths()
        grown = {p for p in self.parents}
        return tuple(1 if d == 1 else sum(1 for i in grown if i != ROOT and depths[i] == d - 1)
                     for d in range(1, self.depth + 1))

    @cached_property
    def fault(self) -> str | None:
        """:meth:`problem` without a rank bound, computed once (a fixed tree is checked every round)."""
        return self.problem()

    def cut(self, depth: int) -> "DraftTree":
        """The nodes of depth at most ``depth`` (a round near the budget drafts no deeper)."""
        keep = [i for i, d in enumerate(self.depths()) if d <= depth]  # parents precede children
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree(tuple(index.get(self.parents[i], ROOT) for i in keep), tuple(self.ranks[i] for i in keep))

    def problem(self, topk: int | None = None) -> str | None:
        """Why this tree is malformed for a trace with ``topk`` recorded candidates, or None.
        The round protocol turns the message into a ``PolicyError`` naming the policy."""
        if len(self.parents) != len(self.ranks):
            return f"{len(self.parents)} parents but {len(self.ranks)} ranks"
        seen: set[tuple[int, int]] = set()
        for i, (p, r) in enumerate(zip(self.parents, self.ranks)):
            if not ROOT <= p < i:
                return f"node {i} has parent {p}; parents must be -1 (root) or an earlier node"
            if not 0 <= r < (topk if topk is not None else r + 1):
                return f"node {i} has rank {r}; ranks must be in 0..{topk - 1} (the recorded top-{topk})"
            if (p, r) in seen:
                return f"node {i} repeats rank {r} under parent {p}"
            seen.add((p, r))
        return None


def chain(k: int) -> DraftTree:
    """The width-one tree of ``k`` greedy drafts: what a chain policy drafts."""
    return DraftTree(tuple(range(ROOT, k - 1)), (0,) * k)


def static_tree(shape: Sequence[int]) -> DraftTree:
    """Every node at depth ``d`` gets ``shape[d]`` children, its top-``shape[d]`` candidates
    (``shape[0]`` children of the root), built breadth-first."""
    parents: list[int] = []
    ranks: list[int] = []
    level = [ROOT]
    for width in shape:
        nxt = []
        for p in level:
            for r in range(width):
                nxt.append(len(parents))
                parents.append(p)
                ranks.append(r)
        level = nxt
    return DraftTree(tuple(parents), tuple(ranks))


def accepted_length(tree: DraftTree, target_ranks: Sequence[int]) -> int:
    """How many drafts greedy verification accepts: the depth of the deepest node whose path
    follows ``target_ranks`` (``target_ranks[d]`` is the rank of the target's token at depth
    ``d + 1`` among the draft's candidates given the true prefix, ``NOT_IN_TOPK`` if absent)."""
    child = tree.child
    node, depth = ROOT, 0
    for r in target_ranks:
        node = child.get((node, r), None) if r != NOT_IN_TOPK else None
        if node is None:
            break
        depth += 1
    return depth


def parse_shape(text: str, max_nodes: int = 1024) -> tuple[int, ...]:
    """``"4,2,2,1"`` (or ``"4x2x2x1"``) -> children per depth; bad input fails in one line before
    anything runs."""
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise SimlabError(f"tree shape {text!r}: expected comma-separated children per depth, e.g. 4,2,2,1") from None
    if any(w < 1 for w in shape):
        raise SimlabError(f"tree shape {text!r}: every depth needs at least 1 child")
    nodes, level = 0, 1
    for width in shape:  # counted, not built: a typo like 100,100,100 must fail fast
        level *= width
        nodes += level
    if nodes > max_nodes:
        raise SimlabError(f"tree shape {text!r} has {nodes} nodes; at most {max_nodes}")
    return shape

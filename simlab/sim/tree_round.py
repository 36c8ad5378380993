"""A tree round answered from the trace, for the two executors that replay one: the simulator's
(:mod:`simlab.sim.executor`) and the serving engine's requests (:mod:`simlab.serve.request`).

Written once so that a tree policy served alone decodes exactly as ``simulate`` replays it: the
same recorded EAGLE-2 tree answers each :class:`~simlab.policies.rounds.ExpandTree`, the same
accepted path settles each :class:`~simlab.policies.rounds.VerifyTree`, and the draft's KV cache
keeps the same account (:mod:`simlab.sim.draft_cache`). Pricing stays with each executor: the
simulator prices one sequence's forwards, the engine a batch's (:mod:`simlab.latency.batch`).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from simlab.common.errors import SimlabError
from simlab.policies.rounds import ExpandTree, VerifyTree
from simlab.sim.draft_cache import DraftCache
from simlab.trace.replay import PromptReplay
from simlab.trace.schema import NO_LAYER
from simlab.trees.draft_tree import ROOT, accepted_length


class TreeOutcome(NamedTuple):
    """A settled tree round: the nodes the accepted path holds, and the tokens the round's first
    draft forward fed (what the draft's cache lacked; 0 when the round drafted nothing)."""

    accepted: int
    feed: int


class TreeRounds:
    """One prompt's tree rounds from its replay: which recorded node each candidate of the
    current round is, and which recorded nodes the round expanded."""

    __slots__ = ("rp", "grown", "expanded")

    def __init__(self, rp: PromptReplay):
        self.rp = rp
        self.grown: list[int] = []  # the recorded tree node of each candidate of the current round
        self.expanded: set[int] = set()  # the recorded tree nodes the current round expanded

    def expand(self, req: ExpandTree) -> tuple[tuple[int, int, float], ...]:
        """One level of a growing tree from the EAGLE-2 tree recorded at ``req.start``: (parent,
        rank, probability) of the top-k children of each node of ``req.expand``."""
        rp = self.rp
        if rp.expansions is None:
            raise SimlabError("a growing tree needs the trace's EAGLE-2 trees; record it with --topk K --tree-depth D")
        tree = rp.expansions.at(req.start)
        grown, expanded = self.grown, self.expanded
        if req.depth == 1:
            grown.clear()
            expanded.clear()
        out: list[tuple[int, int, float]] = []
        for e in req.expand:
            node = ROOT if e == ROOT else grown[e]
            kids = tree.children.get(node)
            if kids is None or len(kids) != req.topk:
                raise SimlabError(f"the trace's EAGLE-2 trees cannot replay this tree: they expand the top "
                                  f"{rp.expansions.topk} candidates of each level into their top-{rp.expansions.topk} "
                                  f"children, {rp.expansions.depth} levels deep (depth {req.depth}, top-k {req.topk} asked)")
            out += [(e, rank, prob) for rank, prob in tree.answers[node]]
            expanded.add(node)
            grown += kids
        return tuple(out)

    def settle(self, req: VerifyTree, cache: DraftCache) -> TreeOutcome:
        """The accepted path of ``req``'s tree (the end token is always the target's) and the
        draft cache's account: the root's forward feeds what the cache lacks; the draft then keeps
        the accepted nodes it fed, those it expanded (a leaf is never fed), and the cache is cropped
        to the committed prefix."""
        rp, c, tree = self.rp, req.start, req.tree
        ctx = rp.prompt_len + c
        grown = rp.expansions.at(c) if req.grown else None
        ranks: Sequence[int] = grown.path_ranks if grown is not None else rp.ranks[c : c + tree.depth]
        accepted = min(accepted_length(tree, ranks), rp.n_tokens - c - 1)
        feed = 0
        if req.widths:
            fed = accepted and accepted - (not self._deepest_fed(tree, grown, ranks[:accepted]))
            feed = cache.draft(NO_LAYER, ctx, 1 + fed)
        cache.crop(ctx + accepted)
        return TreeOutcome(accepted, feed)

    def _deepest_fed(self, tree, grown, path: Sequence[int]) -> bool:
        """Whether the draft fed the node the accepted ``path`` (ranks from the root) ends at: for
        a grown round (``grown``: the trace's EAGLE-2 tree at the round's start) a recorded node the
        round expanded; for a fixed tree a node with children (the draft expands every such node)."""
        node = ROOT
        if grown is not None:
            for rank in path:  # a recorded node's children are its top-k, in rank order
                node = grown.children[node][rank]
            return node in self.expanded
        child = tree.child
        for rank in path:
            node = child[(node, rank)]
        return node in tree.parents


__all__ = ["TreeOutcome", "TreeRounds"]

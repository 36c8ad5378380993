"""Tree drafting: fixed shapes and Sequoia's optimised ones, EAGLE-2's dynamic trees, and the
acceptance-guided tree (docs/policies/trees.md).

Each plans :class:`~simlab.policies.base.TreePlan` rounds: a fixed tree of (parent, rank) nodes,
or a tree grown level by level from the draft's probabilities (:meth:`grow`, :meth:`select`).
A tree's replay needs tree data in the trace (``simlab record --topk K [--tree-depth D]``);
policies check the trace's manifest, through their context, when they are built, so a missing
table or a shape the trace cannot replay fails in one line before anything runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import numpy as np

from simlab.common.errors import SimlabError
from simlab.policies.base import (
    COUNT,
    PROBABILITY,
    Kind,
    Param,
    Plan,
    Policy,
    PolicyContext,
    RoundState,
    TreePlan,
)
from simlab.policies.timing import latency_of
from simlab.trees.candidates import Candidates
from simlab.trees.draft_tree import parse_shape, static_tree
from simlab.trees.sequoia import best_tree


def _shape(name: str, value: Any) -> str:
    """A shape as ``4x2x2x1`` (commas separate values in sweep grids, so ``x`` is canonical)."""
    return "x".join(map(str, parse_shape(str(value))))


SHAPE = Kind(str, "children per depth, e.g. 4x2x1 or 4,2,1", _shape)


def _check_greedy(context: PolicyContext, name: str) -> None:
    if context.temperature > 0:
        raise SimlabError(f"policy {name!r} replays greedy verification only; this trace was recorded at "
                          f"temperature {context.temperature:g} (record with --temperature 0)")


class StaticTree(Policy):
    """Every round drafts the same tree: ``shape[d]`` children for every node at depth d (its
    top candidates), or, without a shape, Sequoia's tree of at most ``nodes`` nodes and
    ``depth`` levels that maximises the expected accepted length (Sequoia's dynamic programme,
    from the trace's positional acceptance)."""

    name = "tree-static"
    drafts_trees = True
    summary = "a fixed draft tree per round: children per depth by hand, or Sequoia's optimised shape"
    paper = "Chen et al. 2024, Sequoia, arXiv:2402.12374, §3.1 (docs/policies/trees.md)"
    params = (
        Param("shape", None, "children per depth, e.g. 4x2x1 (none: Sequoia's optimiser)", SHAPE),
        Param("nodes", 16, "Sequoia: most nodes in the tree (n)", COUNT),
        Param("depth", 5, "Sequoia: most levels (d)", COUNT),
    )
    choices = ("Sequoia's acceptance vector is the trace's share of positions whose target token is the "
               "draft's r-th candidate; the tree is fixed for the whole run (no hardware-aware search: "
               "sweep nodes and depth)")

    def __init__(self, context: PolicyContext, **values: Any):
        super().__init__(context, **values)
        _check_greedy(context, self.name)
        if self.shape is not None:
            tree = static_tree(parse_shape(self.shape))
        elif context.rank_acceptance is None:
            raise SimlabError(f"policy {self.name!r}: give a shape, or a trace for Sequoia's optimiser")
        else:
            _, tree = best_tree(context.rank_acceptance(), self.nodes, self.depth)
        widest = max(tree.ranks, default=0) + 1
        if widest > 1 and context.tree_topk == 0:
            raise SimlabError(f"policy {self.name!r} drafts the draft's top-{widest} candidates; this trace has only "
                              "its greedy token; record it with --topk K")
        if widest > max(context.tree_topk, 1):
            raise SimlabError(f"policy {self.name!r}: the shape needs the top-{widest} candidates; the trace holds "
                              f"the top-{context.tree_topk} (recorded with --topk {context.tree_topk})")
        self.tree = tree
        self._plan = TreePlan(tree)

    def plan(self, state: RoundState) -> Plan:
        return self._plan


TOP_K = Param("top_k", None, "k: nodes expanded per level, each into its top-k children (none: the trace's --topk)",
              COUNT)


class GrowingTree(Policy):
    """A tree grown as EAGLE-2 grows it (Li et al. 2024, arXiv:2406.16858, §4.1-4.2): level 1 is
    the root's top-k; each further level expands the k candidates of the newest level with the
    largest value (the product of draft probabilities on the path) into their top-k children;
    finally the ``nodes`` candidates of largest value are verified (a child never outvalues its
    parent, so they form a tree). Subclasses say which of the k to expand (:meth:`keep`)."""

    depth_param: str  # the parameter that bounds the levels
    drafts_trees = True

    def __init__(self, context: PolicyContext, **values: Any):
        super().__init__(context, **values)
        _check_greedy(context, self.name)
        if context.tree_depth == 0:
            raise SimlabError(f"policy {self.name!r} needs the trace's EAGLE-2 trees; this trace has none; "
                              "record it with --topk K --tree-depth D")
        if self.top_k is None:
            self.top_k = context.tree_topk
        if getattr(self, self.depth_param) is None:
            setattr(self, self.depth_param, context.tree_depth)
        depth = getattr(self, self.depth_param)
        if self.top_k != context.tree_topk or depth > context.tree_depth:
            raise SimlabError(f"policy {self.name!r}: top_k {self.top_k} and {self.depth_param} {depth} cannot be "
                              f"replayed from EAGLE-2 trees of top-k {context.tree_topk}, depth {context.tree_depth} "
                              f"(use top_k {context.tree_topk} and {self.depth_param} <= {context.tree_depth})")
        self._plan = TreePlan(None, self.top_k, depth)

    def plan(self, state: RoundState) -> Plan:
        return self._plan

    def grow(self, candidates: Candidates) -> Sequence[int]:
        return self.keep(candidates, candidates.best(candidates.levels[-1], self.top_k))

    def keep(self, candidates: Candidates, frontier: list[int]) -> Sequence[int]:
        return frontier

    def keep_rows(self, values: np.ndarray, candidates: np.ndarray, context_len: np.ndarray, widths: np.ndarray,
                  prices: Any) -> np.ndarray:
        """:meth:`keep` for many rounds at once (the simulator's closed form,
        :mod:`simlab.sim.trees`): which frontier nodes (their ``values``, best first, one row
        per round) to expand, after ``candidates`` candidates, at ``context_len``, after draft
        forwards over ``widths`` nodes per level; ``prices`` prices those rounds
        (:class:`simlab.sim.trees.TreePrices`, from a layer above the policies')."""
        import numpy as np  # here, not at the top: `simlab CMD --help` builds every policy's flags

        return np.ones(values.shape, dtype=bool)

    def select(self, candidates: Candidates) -> Sequence[int]:
        return candidates.best(range(len(candidates)), self.nodes)


class Eagle2(GrowingTree):
    """EAGLE-2's context-aware dynamic draft tree: expand by value to ``depth`` levels, rerank
    every candidate and verify the top ``nodes``."""

    name = "eagle2"
    summary = "EAGLE-2: expand the top-k nodes by cumulative draft probability per level, verify the top-n"
    paper = "Li et al. 2024, EAGLE-2, arXiv:2406.16858, §4.1-4.2 (docs/policies/trees.md)"
    params = (
        TOP_K,
        Param("depth", None, "levels drafted (none: the trace's --tree-depth)", COUNT),
        Param("nodes", 16, "n: candidates verified, the top-n by value (EAGLE-2's total tokens)", COUNT),
    )
    depth_param = "depth"
    choices = ("the draft is the trace's draft model (EAGLE-2 drafts with a feature-level head); value = product "
               "of raw-softmax draft probabilities; ties go to the earlier candidate")


class AcceptanceGuidedTree(GrowingTree):
    """The acceptance-guided paper's tree (Sun et al., §2.2): EAGLE-2's tree, where a branch b
    stops growing once

        P_rej^(b) = 1 − Π_i P̂_acc,i^(b) ≥ h = (T_v − T_d)/T_r          (eqs. 6-7, 11-12)

    with P̂_acc the draft's probability of each token on the branch (so Π P̂_acc is the node's
    value), T_d the draft forwards so far, T_v the verification of the candidates it would send
    now (min(nodes, candidates) + 1 tokens) and T_r = T_v, all from the latency model at the
    round's context; drafting ends when no branch is active, or at K_max levels."""

    name = "ags-tree"
    summary = "acceptance-guided tree: EAGLE-2's tree, a branch stops when 1 − ΠP̂_acc ≥ h = (T_v − T_d)/T_r"
    paper = "Sun et al., acceptance-guided adaptive SD, §2.2 eqs. 6-7, §2.3 eqs. 11-12 (docs/policies/trees.md)"
    params = (
        Param("rejection_threshold", None, "h, a fixed threshold on P_rej (none: eq. 12 from the latency model)",
              PROBABILITY),
        Param("max_draft", None, "K_max: most levels per round (none: the trace's --tree-depth)", COUNT),
        TOP_K,
        Param("nodes", 16, "n: candidates verified, the top-n by value", COUNT),
    )
    depth_param = "max_draft"
    choices = ("per-branch stopping (eq. 7), not 'any branch halts drafting' (§2.2's prose); a stopped node is "
               "still verified; P̂_acc = the draft's probability of the node's token (no trained head on trees); "
               "T_r = T_v as in ags")

    def __init__(self, context: PolicyContext, **values: Any):
        super().__init__(context, **values)
        if self.rejection_threshold is None:
            self._latency = latency_of(context, self.name)
        self._context_len = context.context_len
        self._widths: list[int] = []

    def plan(self, state: RoundState) -> Plan:
        self._context_len = state.context_len
        self._widths = [1]
        return self._plan

    def threshold(self, candidates: int) -> float:
        """h of eq. 12 after the draft forwards so far, for ``candidates`` drafted nodes."""
        if self.rejection_threshold is not None:
            return self.rejection_threshold
        t_v = self._latency.target_tree(min(candidates, self.nodes) + 1, self._context_len)
        return _eq12(t_v, self._latency.tree_draft_seconds(self._context_len, self._widths))

    def keep(self, candidates: Candidates, frontier: list[int]) -> Sequence[int]:
        h = self.threshold(len(candidates))
        values = candidates.values
        active = [i for i in frontier if _active(values[i], h)]
        if active:
            self._widths.append(len(active))
        return active

    def keep_rows(self, values: np.ndarray, candidates: np.ndarray, context_len: np.ndarray, widths: np.ndarray,
                  prices: Any) -> np.ndarray:
        import numpy as np  # here, not at the top: `simlab CMD --help` builds every policy's flags

        if self.rejection_threshold is not None:
            return _active(values, self.rejection_threshold)
        t_v = prices.target(np.minimum(candidates, self.nodes) + 1, context_len)
        return _active(values, _eq12(t_v, prices.tree_draft(context_len, widths))[:, None])


def _eq12(t_v, t_d):
    """h = (T_v − T_d)/T_r with T_r = T_v (eq. 12), for one round or many."""
    return (t_v - t_d) / t_v


def _active(value, h):
    """A branch grows on while P_rej = 1 − (its value) < h (eq. 7), for one node or many."""
    return 1.0 - value < h

"""Growing draft trees (EAGLE-2, the acceptance-guided tree) for every position at once.

Why a closed form. A growing tree round drives the protocol level by level — one generator
round trip per level, and Python sorts of each level's candidates and of all of them — which
makes these policies the slowest to simulate. Yet a round is fixed by little: tree policies do
not adapt across rounds (:mod:`simlab.rounds`), so the round that starts at committed position
``c`` depends only on the candidate tree recorded at ``c``, on the levels it may draft
(``min(budget - c - 1, depth)``) and, for the acceptance-guided tree, on the context length.
:class:`GrownTrees` therefore grows every position's tree at once with array operations over
the recorded trees, for every level cap; a prompt's rounds are then walked from position to
position (one list lookup a round), and priced as the executor prices them.

The growth repeats the protocol's, number for number:

- candidates are numbered as :class:`~simlab.trees.candidates.Candidates` numbers them — level
  by level, each expanded candidate's children in rank order, expanded candidates in the order
  the policy names them — so "ties to the earlier candidate" is a stable sort on (−value) over
  that order; a child's value is its parent's times its probability, the same product;
- each level's frontier is its top-k candidates; the policy keeps some of them
  (:meth:`~simlab.policies.trees.GrowingTree.keep_rows`, its :meth:`keep` for many rounds);
- the verified nodes are the top-``nodes`` candidates of the levels drafted. They form a tree
  when no probability exceeds 1 (a child then never outvalues its parent, and sorts after it);
  a trace where one does is left to the protocol, as is any round whose expansion the
  recording lacks (the protocol's error then names the problem);
- greedy verification accepts the leading nodes of the target's path through the recorded tree
  that are verified (:attr:`~simlab.trace.tree_replay.ExpansionAt.path_ranks`).

Times repeat :meth:`~simlab.latency.grid.LatencyGrid.tree_draft_seconds` and the target forward
of ``nodes + 1`` tokens with the same floating-point operations in the same order, and the
clock and counts are summed as :mod:`simlab.sim.vanilla` sums them, so the results are bit for
bit those of :class:`~simlab.sim.executor.SimExecutor` (``tests/test_tree_policies.py`` checks
it on the shipped tree trace and on a synthetic one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simlab.latency.grid import LatencyGrid
from simlab.sim.executor import SimRun, ad_seconds
from simlab.sim.vanilla import TargetRows, interleave, rounds_run, walls
from simlab.trace.replay import TraceReplay
from simlab.trace.schema import NO_LAYER

if TYPE_CHECKING:
    from simlab.policies.trees import GrowingTree


def replays(policy: GrowingTree) -> bool:
    """Whether ``policy`` decides as this module replays it: it grows and selects as
    :class:`~simlab.policies.trees.GrowingTree` does, its :meth:`keep_rows` is written beside
    its :meth:`keep` and :meth:`plan` (so it repeats them), and nothing else of the protocol's
    policy calls (``reset``, ``done``) is overridden. A subclass that changes one is replayed
    round by round."""
    from simlab.policies.base import Policy
    from simlab.policies.trees import GrowingTree

    def home(name: str) -> type:
        return next(c for c in type(policy).__mro__ if name in c.__dict__)

    rows = home("keep_rows")
    return (home("grow") is GrowingTree and home("select") is GrowingTree and home("reset") is Policy
            and home("done") is Policy and home("keep") is rows and home("plan") in (GrowingTree, rows))


class TreePrices:
    """A tree round's prices for many rounds at once, from the simulator's grid."""

    def __init__(self, grid: LatencyGrid):
        self.grid = grid
        self.cum = np.asarray(grid.draft_cumulative(NO_LAYER, False))
        self.rows = TargetRows(grid)

    def target(self, k: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """Seconds of a ``k``-token target forward at context ``ctx`` (elementwise)."""
        return self.rows(int(k.max()))[k - 1, self._within(ctx)]

    def _within(self, ctx: np.ndarray) -> np.ndarray:
        """``ctx`` kept inside the grid: a tree is grown at every position, and past the grid
        lie only positions too near a prompt's budget to draft that deep (their figures go
        unread); :meth:`GrownTrees.simulate` checks the rounds it prices."""
        return np.minimum(ctx, self.grid.max_context)

    def tree_draft(self, ctx: np.ndarray, widths: np.ndarray, levels: np.ndarray | None = None) -> np.ndarray:
        """:meth:`LatencyGrid.tree_draft_seconds` of the first ``levels`` (all, by default) of
        each row of ``widths`` at context ``ctx``, with its operations in its order."""
        if levels is None:
            levels = np.full(len(ctx), widths.shape[1])
        cum, ctx = self.cum, self._within(ctx)
        seconds = cum[self._within(ctx + levels)] - cum[ctx]
        rows = self.rows(max(int(widths.max(initial=1)), 1))
        for d in range(widths.shape[1]):
            w = widths[:, d]
            wide = (w > 1) & (d < levels)
            if wide.any():
                at = self._within(ctx + d)
                step = cum[at + 1] - cum[at]
                ratio = rows[np.maximum(w, 1) - 1, at] / rows[0, at]
                seconds = np.where(wide, seconds + step * (ratio - 1.0), seconds)
        return seconds


class GrownTrees:
    """A replay's recorded EAGLE-2 trees as arrays, ready to replay any growing-tree policy
    (:meth:`simulate`); :attr:`usable` is False where the trace's trees are not the complete
    top-k, ``depth``-level trees this replay reads (the protocol then replays them)."""

    def __init__(self, replay: TraceReplay, grid: LatencyGrid):
        self.grid, self.prices = grid, TreePrices(grid)
        trace, manifest = replay.trace, replay.trace.manifest
        self.topk = k = int(manifest.topk)
        self.depth = depth = int(manifest.tree_depth)
        self.size = size = k + (depth - 1) * k * k if depth else 0  # recorded nodes per position
        bounds = replay.bounds
        self.rows = rows = int(bounds[-1])  # positions of every prompt, prompt after prompt
        self.prompt_ids, self.lengths = replay.prompt_ids.tolist(), replay.lengths.tolist()
        self.budgets = replay.budgets.tolist()
        self.starts = bounds[:-1].tolist()
        self.ad_wall_time_s = [ad_seconds(grid, pl, n) for pl, n in zip(replay.prompt_lens.tolist(), self.lengths)]
        prompt = np.repeat(np.arange(len(self.lengths)), replay.lengths)
        pos = np.arange(rows) - bounds[prompt]
        self.ctx = replay.prompt_lens[prompt] + pos
        self.usable = False
        tree = trace.tree
        if tree is None or depth == 0 or k == 0 or len(tree) != rows * size:
            return
        t = tree.sort_values(["prompt_id", "pos", "node"], kind="stable")
        node = np.tile(np.arange(size), rows)
        where = np.repeat(np.arange(rows), size)
        if not (np.array_equal(t["node"].to_numpy(), node) and np.array_equal(t["pos"].to_numpy(), pos[where])
                and np.array_equal(t["prompt_id"].to_numpy(), replay.prompt_ids[prompt[where]])):
            return
        parent, rank = t["parent"].to_numpy(np.int64), t["rank"].to_numpy(np.int64)
        self.prob = t["prob"].to_numpy(np.float64).reshape(rows, size)
        if ((rank < 0) | (rank >= k) | (parent < -1) | (parent >= size)).any() or not (
                (self.prob >= 0.0) & (self.prob <= 1.0)).all():
            return
        # children[row, parent + 1, rank]: the recorded node (-1: not recorded; row 0 is the root)
        self.children = children = np.full((rows, size + 1, k), -1, dtype=np.int64)
        children[where, parent + 1, rank] = node
        if np.count_nonzero(children >= 0) != rows * size:  # two children of one rank
            return
        token = t["token"].to_numpy(np.int64).reshape(rows, size)
        target = np.concatenate([np.asarray(p.target_tokens, dtype=np.int64) for p in replay.prompts])
        end = bounds[prompt + 1]  # one past the prompt's last row
        # the target's path through the recorded tree (-2 past its end), as ExpansionAt follows it
        self.path = np.full((rows, depth), -2, dtype=np.int64)
        at = np.full(rows, -1, dtype=np.int64)
        alive = np.ones(rows, dtype=bool)
        row = np.arange(rows)
        for j in range(depth):
            alive &= row + j < end
            kids = children[row, at + 1]
            want = target[np.minimum(row + j, rows - 1)]
            match = (kids >= 0) & (token[row[:, None], np.maximum(kids, 0)] == want[:, None])
            alive &= match.any(axis=1)
            at = np.where(alive, kids[row, match.argmax(axis=1)], -1)
            self.path[:, j] = np.where(alive, at, -2)
        self.usable = True

    def simulate(self, policy: GrowingTree) -> SimRun | None:
        """What the executor reports for ``policy`` (timelines and tokens aside), or None where
        a round this replay would meet is one it leaves to the protocol (see the module), or
        where ``policy`` decides otherwise than :func:`replays` knows."""
        depth = getattr(policy, policy.depth_param)
        if not (self.usable and replays(policy)) or policy.top_k != self.topk or depth > self.depth:
            return None
        rounds = self._rounds(policy, depth)
        if rounds is None:
            return None
        prompt_calls, nodes, accepted, tree_depth, levels, widths, ctx = rounds
        if len(ctx) and (ctx + levels).max() > self.grid.max_context:  # priced by the model past the grid
            return None
        prices = self.prices
        draft = prices.tree_draft(ctx, widths, levels)
        verify = prices.target(nodes + 1, ctx)
        wall = walls(interleave(draft, verify), 2 * np.cumsum(prompt_calls))
        checked = np.where(accepted < tree_depth, accepted + 1, tree_depth)
        return rounds_run(self.prompt_ids, self.lengths, self.ad_wall_time_s, prompt_calls, wall, checked, accepted,
                          drafted=nodes, draft_calls=levels, num_drafts=tree_depth > 0, draft_busy_s=draft,
                          target_busy_s=verify)

    def _rounds(self, policy: GrowingTree, depth: int) -> tuple[np.ndarray, ...] | None:
        """Every round in executor order: rounds per prompt, then per round its nodes, accepted
        drafts, tree depth, levels drafted, nodes expanded per level and context length."""
        tables = self._grow(policy, depth)
        accepted_at, first_bad = tables[0], tables[-1]
        rows, caps, accepted = [], [], []
        for start, n, budget in zip(self.starts, self.lengths, self.budgets):
            c = 1
            while c < n:  # decode()'s loop: a round drafts at most budget - c - 1 levels
                cap = min(budget - c - 1, depth)
                row = start + c
                if first_bad[row] <= cap:
                    return None
                a = min(accepted_at[cap][row], n - c - 1)  # the end token is the target's
                rows.append(row)
                caps.append(cap)
                accepted.append(a)
                c += a + 1
        row, cap = np.array(rows, dtype=np.int64), np.array(caps, dtype=np.int64)
        prompt_calls = np.bincount(np.searchsorted(self.starts, row, side="right") - 1, minlength=len(self.lengths))
        nodes, tree_depth, levels = (np.asarray(t)[cap, row] for t in tables[1:4])
        return prompt_calls, nodes, np.array(accepted, dtype=np.int64), tree_depth, levels, tables[4][row], self.ctx[row]

    def _grow(self, policy: GrowingTree, depth: int) -> tuple:
        """Per level cap 0..``depth`` and position: accepted drafts (as lists, for the walk),
        nodes verified, tree depth, levels drafted; per position the nodes expanded per level
        and the first level whose expansion the recording lacks (``depth + 1``: none)."""
        k, n_rows, top_n = self.topk, self.rows, policy.nodes
        row = np.arange(n_rows)
        children, prob, ctx = self.children, self.prob, self.ctx
        first = children[:, 0]  # level 1: the root's children in rank order
        first_bad = np.where((first < 0).any(axis=1), 1, depth + 1)
        nodes, values, valid = [first], [prob[row[:, None], np.maximum(first, 0)]], [np.ones((n_rows, k), bool)]
        widths = np.zeros((n_rows, depth), dtype=np.int64)
        widths[:, 0] = 1
        grown = np.ones(n_rows, dtype=np.int64)  # levels that exist
        candidates = np.full(n_rows, k, dtype=np.int64)
        for d in range(1, depth):  # expand level d into level d + 1
            order = np.argsort(np.where(valid[-1], -values[-1], np.inf), axis=1, kind="stable")[:, :k]
            frontier, frontier_values = np.take_along_axis(nodes[-1], order, 1), np.take_along_axis(values[-1], order, 1)
            alive = grown == d
            keep = policy.keep_rows(frontier_values, candidates, ctx, widths[:, :d], self.prices) & alive[:, None]
            kept = keep.sum(axis=1)
            order = np.argsort(~keep, axis=1, kind="stable")  # the kept, in frontier order
            expand, expand_values = np.take_along_axis(frontier, order, 1), np.take_along_axis(frontier_values, order, 1)
            expanded = np.arange(k) < kept[:, None]
            kids = children[row[:, None], expand + 1]  # (rows, k, k)
            missing = (expanded[:, :, None] & (kids < 0)).any(axis=(1, 2))
            first_bad = np.where(missing & (first_bad > d + 1), d + 1, first_bad)
            nodes.append(kids.reshape(n_rows, k * k))
            values.append((expand_values[:, :, None] * prob[row[:, None, None], np.maximum(kids, 0)]).reshape(n_rows, k * k))
            valid.append(np.repeat(expanded, k, axis=1) & (nodes[-1] >= 0))
            grows = kept > 0
            widths[:, d] = np.where(grows, kept, 0)
            grown += grows
            candidates += k * kept
        # every candidate of every level, in candidate order; then sorted by value, ties to the earlier
        level = np.repeat(np.arange(1, depth + 1), [len(v[0]) for v in values])
        values_all, valid_all, nodes_all = (np.concatenate(a, axis=1) for a in (values, valid, nodes))
        order = np.argsort(np.where(valid_all, -values_all, np.inf), axis=1, kind="stable")
        ranked_nodes, ranked_level = np.take_along_axis(nodes_all, order, 1), level[order]
        ranked_valid = np.take_along_axis(valid_all, order, 1)
        path = self.path[:, :depth]
        on_path = ranked_nodes[:, None, :] == path[:, :, None]  # (rows, depth, candidates)
        zeros = np.zeros(n_rows, dtype=np.int64)
        accepted, nodes_n, tree_depth, levels = [zeros.tolist()], [zeros], [zeros], [zeros]
        for cap in range(1, depth + 1):
            drafted = ranked_valid & (ranked_level <= cap)
            chosen = drafted & (np.cumsum(drafted, axis=1) <= top_n)
            verified = (on_path & chosen[:, None, :]).any(axis=2)
            accepted.append(np.cumprod(verified, axis=1).sum(axis=1).tolist())
            nodes_n.append(chosen.sum(axis=1))
            tree_depth.append(np.where(chosen, ranked_level, 0).max(axis=1))
            levels.append(np.minimum(grown, cap))
        return accepted, nodes_n, tree_depth, levels, widths, first_bad

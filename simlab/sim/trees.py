"""Tree policies' rounds for every position at once: fixed trees, and trees grown as EAGLE-2
and the acceptance-guided tree grow them.

Why a closed form. A tree round through the protocol costs generator round trips (a growing
tree: one per level, with Python sorts of each level's candidates and of all of them), which
made tree policies the slowest to simulate. Yet a round is fixed by little: tree policies do
not adapt across rounds (:mod:`simlab.policies.rounds`), so the round that starts at committed position
``c`` depends only on the trace at ``c``, on the levels it may draft (``min(budget - c - 1,
depth)``: decode()'s cap) and, for the acceptance-guided tree, on the context length.
:class:`TreeRounds` therefore computes every position's round at once with array operations;
a prompt's rounds are then walked from position to position (one list lookup a round) and
priced as the executor prices them.

A fixed tree (``tree-static``) cut to the cap accepts as deep as the target's ranks follow it
(:func:`~simlab.trees.draft_tree.accepted_length`). A growing tree repeats the protocol's
growth, number for number (:class:`RecordedTrees`):

- candidates are numbered as :class:`~simlab.trees.candidates.Candidates` numbers them — level
  by level, each expanded candidate's children in rank order, expanded candidates in the order
  the policy names them — so "ties to the earlier candidate" is a sort on (−value, that order);
  a child's value is its parent's times its probability, the same product;
- each level's frontier is its top-k candidates; the policy keeps some of them
  (:meth:`~simlab.policies.trees.GrowingTree.keep_rows`, its :meth:`keep` for many rounds);
- the verified nodes are the top-``nodes`` candidates of the levels drafted. They form a tree
  when no probability exceeds 1 (a child then never outvalues its parent, and sorts after it);
  a trace where one does is left to the protocol, as is any round whose expansion the
  recording lacks (the protocol's error then names the problem);
- greedy verification accepts the leading nodes of the target's path through the recorded tree
  that are verified (:attr:`~simlab.trace.tree_replay.ExpansionAt.path_ranks`).

Times repeat :meth:`~simlab.latency.grid.LatencyGrid.tree_draft_seconds` and the tree
verification over ``nodes + 1`` tokens (``target_tree``) with the same floating-point operations
in the same order, and the clock and counts are summed as :mod:`simlab.sim.vanilla` sums them,
so the results are bit for bit those of :class:`~simlab.sim.executor.SimExecutor`
(``tests/test_tree_policies.py`` checks it on the shipped tree trace and on synthetic ones).
"""
from __future__ import annotations

import numpy as np

from simlab.latency.grid import LatencyGrid
from simlab.policies.base import Policy
from simlab.policies.trees import GrowingTree, StaticTree
from simlab.sim import extrapolation as ex
from simlab.sim.executor import SimRun, ad_seconds
from simlab.sim.vanilla import TargetRows, catch_up, interleave, rounds_run, walls
from simlab.trace.replay import TraceReplay
from simlab.trace.schema import NO_LAYER
from simlab.trees.draft_tree import DraftTree


def replays(policy: GrowingTree) -> bool:
    """Whether ``policy`` decides as this module replays it: it grows and selects as
    :class:`~simlab.policies.trees.GrowingTree` does, its :meth:`keep_rows` is written beside
    its :meth:`keep` and :meth:`plan` (so it repeats them), and nothing else of the protocol's
    policy calls (``reset``, ``done``) is overridden. A subclass that changes one is replayed
    round by round."""

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
        self.verify = TargetRows(grid, grid.target_tree_row)
        self.factors = TargetRows(grid, grid.draft_tree_row)

    def target(self, k: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """Seconds of a tree verification over ``k`` tokens at context ``ctx`` (elementwise)."""
        return self.verify(int(k.max(initial=1)))[k - 1, ctx]

    def tree_draft(self, ctx: np.ndarray, widths: np.ndarray, levels: np.ndarray | None = None) -> np.ndarray:
        """:meth:`LatencyGrid.tree_draft_seconds` of the first ``levels`` (all, by default) of
        each row of ``widths`` at context ``ctx``, with its operations in its order."""
        if levels is None:
            levels = np.full(len(ctx), widths.shape[1])
        cum = self.cum
        seconds = cum[ctx + levels] - cum[ctx]
        factors = self.factors(int(widths.max(initial=1)))
        for d in range(widths.shape[1]):
            w = widths[:, d]
            wide = (w > 1) & (d < levels)
            if wide.any():
                at = ctx + d
                step = cum[at + 1] - cum[at]
                seconds = np.where(wide, seconds + step * (factors[np.maximum(w, 1) - 1, at] - 1.0), seconds)
        return seconds


class TreeRounds:
    """A replay's tree rounds in closed form (the module): :meth:`simulate` answers for
    ``tree-static`` and for growing trees that :func:`replays` knows."""

    def __init__(self, replay: TraceReplay, grid: LatencyGrid):
        self.replay, self.grid, self.prices = replay, grid, TreePrices(grid)
        bounds = replay.bounds
        self.rows = rows = int(bounds[-1])  # positions of every prompt, prompt after prompt
        self.prompt_ids, self.lengths = replay.prompt_ids.tolist(), replay.lengths.tolist()
        self.starts = bounds[:-1].tolist()
        self.ad_wall_time_s = [ad_seconds(grid, pl, n) for pl, n in zip(replay.prompt_lens.tolist(), self.lengths)]
        prompt = np.repeat(np.arange(len(self.lengths)), replay.lengths)
        self.pos = pos = np.arange(rows) - bounds[prompt]
        self.ctx = replay.prompt_lens[prompt] + pos
        self.room = replay.budgets[prompt] - pos - 1  # the most levels a round from here drafts
        self._recorded: RecordedTrees | None = None

    def simulate(self, policy: Policy) -> SimRun | None:
        """What the executor reports for ``policy`` (timelines and tokens aside), or None where
        the protocol must replay it: a policy this module does not know (:func:`replays`), a
        malformed fixed tree, or a round whose expansion the recording lacks (see the module)."""
        if type(policy) is StaticTree:
            tables = self._fixed(policy.tree) if policy.tree.fault is None else None
        elif isinstance(policy, GrowingTree) and replays(policy):
            if self._recorded is None:
                self._recorded = RecordedTrees(self)
            tables = self._recorded.grow(policy)
        else:
            tables = None
        rounds = self._rounds(*tables) if tables is not None else None
        if rounds is None:
            return None
        prompt_calls, nodes, accepted, tree_depth, levels, widths, ctx, feed = rounds
        if len(ctx) and (ctx + levels).max() > self.grid.max_context:  # priced by the model past the grid
            return None
        prices = self.prices
        draft = catch_up(self.grid, prices.tree_draft(ctx, widths, levels), ctx, (feed > 1) & (levels > 0))
        verify = prices.target(nodes + 1, ctx)
        wall = walls(interleave(draft, verify), 2 * np.cumsum(prompt_calls))
        checked = np.where(accepted < tree_depth, accepted + 1, tree_depth)
        priced = ex.Extrapolated()
        ex.tree_drafts(priced, self.grid, ctx, widths, levels, feed)
        ex.forwards(priced, self.grid, "target_tree", nodes + 1, ctx)
        return rounds_run(self.prompt_ids, self.lengths, self.ad_wall_time_s, prompt_calls, wall, checked, accepted,
                          extrapolated=priced, drafted=nodes, draft_calls=levels, num_drafts=tree_depth > 0, draft_busy_s=draft,
                          target_busy_s=verify)

    def _rounds(self, nodes: np.ndarray, accepted_at: list[int], tree_depth: np.ndarray, levels: np.ndarray,
                widths: np.ndarray, leaf: list[bool], bad: list[bool] | None) -> tuple[np.ndarray, ...] | None:
        """Every round in executor order, from the round at every position (nodes verified,
        accepted drafts, tree depth, levels drafted, nodes expanded per level, whether its
        deepest accepted node is a leaf the draft never fed, and whether the protocol must
        replay it): rounds per prompt, then those figures per round, its context length and
        the tokens its first draft forward feeds (:mod:`simlab.sim.draft_cache`: two after a
        round that ended on such a leaf). Accepted drafts may be counted past the prompt's end
        (the next prompt's positions): the walk clips them to the end, as the executor does, and
        a cut never binds tighter (a round's cap is at least the positions left before the end);
        only a prompt's last round is clipped, and no round follows it."""
        rows, accepted, feed = [], [], []
        for start, n in zip(self.starts, self.lengths):
            c, lacks = 1, 1
            while c < n:  # decode()'s loop
                row = start + c
                if bad is not None and bad[row]:
                    return None
                a = min(accepted_at[row], n - c - 1)  # the end token is the target's
                rows.append(row)
                accepted.append(a)
                feed.append(lacks)
                lacks = 1 + leaf[row]
                c += a + 1
        row = np.array(rows, dtype=np.int64)
        prompt_calls = np.bincount(np.searchsorted(self.starts, row, side="right") - 1, minlength=len(self.lengths))
        return (prompt_calls, nodes[row], np.array(accepted, dtype=np.int64), tree_depth[row], levels[row], widths[row],
                self.ctx[row], np.array(feed, dtype=np.int64))

    def _fixed(self, tree: DraftTree) -> tuple:
        """The round of ``tree`` from every position, cut to decode()'s cap (see :meth:`_rounds`):
        the cut keeps the levels up to the cap, so it verifies the nodes that deep and drafts
        those levels over the tree's widths; it accepts as deep as the target's ranks follow it."""
        depth, rows = tree.depth, np.arange(self.rows)
        cap = np.minimum(self.room, depth)
        depths = np.array(tree.depths(), dtype=np.int64)
        nodes_within = np.searchsorted(np.sort(depths), np.arange(depth + 1), side="right")
        child = np.full((tree.size + 1, max(tree.ranks, default=0) + 1), -1, dtype=np.int64)  # (parent + 1, rank)
        child[np.array(tree.parents, dtype=np.int64) + 1, np.array(tree.ranks, dtype=np.int64)] = np.arange(tree.size)
        ranks = np.concatenate([np.asarray(p.ranks, dtype=np.int64) for p in self.replay.prompts])
        node = np.full(self.rows, -1, dtype=np.int64)
        follows = np.ones(self.rows, dtype=bool)
        accepted = np.zeros(self.rows, dtype=np.int64)
        for j in range(depth):  # accepted_length, at every position
            r = ranks[np.minimum(rows + j, self.rows - 1)]
            follows &= (r >= 0) & (r < child.shape[1])
            nxt = child[node + 1, np.where(follows, r, 0)]
            follows &= nxt >= 0
            node = np.where(follows, nxt, node)
            accepted += follows
        widths = np.broadcast_to(np.array(tree.widths, dtype=np.int64), (self.rows, depth))
        has_children = np.zeros(tree.size + 1, dtype=bool)  # by node + 1 (0: the root)
        has_children[np.array(tree.parents, dtype=np.int64) + 1] = True
        leaf = (accepted > 0) & ~has_children[node + 1]  # the draft expands, so feeds, every node with children
        return nodes_within[cap], accepted.tolist(), cap, cap, widths, leaf.tolist(), None


class RecordedTrees:
    """A replay's recorded EAGLE-2 trees as arrays, ready to grow any growing-tree policy's
    rounds (:meth:`grow`); :attr:`usable` is False where the trace's trees are not the complete
    top-k, ``depth``-level trees this replay reads (the protocol then replays them).

    What does not depend on the policy is computed here once: each recorded node's level, value
    and place in candidate order. A node's number among its level's candidates depends on which
    nodes a policy expands, but their order does not — level, then the parent's place in its
    level's order by value, then rank — so every node is ranked once by (−value, that order),
    and a policy's candidates are the nodes it reaches, in that ranking."""

    def __init__(self, rounds: TreeRounds):
        self.rounds = rounds
        replay = rounds.replay
        trace, manifest = replay.trace, replay.trace.manifest
        self.topk = k = int(manifest.topk)
        self.depth = depth = int(manifest.tree_depth)
        self.size = size = k + (depth - 1) * k * k if depth else 0  # recorded nodes per position
        self.rows = rows = rounds.rows
        pos, prompt = rounds.pos, np.repeat(np.arange(len(rounds.lengths)), replay.lengths)
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
        prob = t["prob"].to_numpy(np.float64).reshape(rows, size)
        if ((rank < 0) | (rank >= k) | (parent < -1) | (parent >= size)).any() or not (
                (prob >= 0.0) & (prob <= 1.0)).all():
            return
        # children[row, parent + 1, rank]: the recorded node (-1: not recorded; row 0 is the root)
        self.children = children = np.full((rows, size + 1, k), -1, dtype=np.int64)
        children[where, parent + 1, rank] = node
        if np.count_nonzero(children >= 0) != rows * size:  # two children of one rank
            return
        row = np.arange(rows)[:, None]
        parent, rank = parent.reshape(rows, size), rank.reshape(rows, size)
        top = parent < 0
        up = np.maximum(parent, 0)
        level, value = np.ones((rows, size), dtype=np.int64), prob
        for _ in range(depth - 1):  # a child's value is its parent's times its probability, as in Candidates
            level, value = np.where(top, 1, level[row, up] + 1), np.where(top, prob, value[row, up] * prob)
        widths = [k] + [k * k] * (depth - 1)
        if not all(((level == d + 1).sum(axis=1) == w).all() for d, w in enumerate(widths)):
            return
        order = rank.copy()  # a node's place in candidate order among its level
        place = np.zeros((rows, size), dtype=np.int64)  # a node's place among its level by (−value, order)
        self.by_level = []  # per level, its nodes by (−value, candidate order): how frontiers are picked
        for d, w in enumerate(widths):
            nodes = np.nonzero(level == d + 1)[1].reshape(rows, w)
            if d:
                order[row, nodes] = place[row, up[row, nodes]] * k + rank[row, nodes]
            ranked = np.take_along_axis(nodes, np.lexsort((order[row, nodes], -value[row, nodes]), axis=1), 1)
            self.by_level.append(ranked)
            place[row, ranked] = np.arange(w)
        self.value = value
        self.ranked = np.lexsort((order, level, -value), axis=1)  # every node, as top-n selection ranks them
        self.ranked_level = level[row, self.ranked]
        token = t["token"].to_numpy(np.int64).reshape(rows, size)
        target = np.concatenate([np.asarray(p.target_tokens, dtype=np.int64) for p in replay.prompts])
        # the target's path through the recorded tree, as ExpansionAt follows it (past the prompt's
        # end too, see TreeRounds._rounds): the depth of each node on it (0: off it)
        on_path = np.zeros((rows, size), dtype=np.int64)
        at = np.full(rows, -1, dtype=np.int64)
        alive = np.ones(rows, dtype=bool)
        flat = row[:, 0]
        for j in range(depth):
            kids = children[flat, at + 1]
            want = target[np.minimum(flat + j, rows - 1)]
            match = (kids >= 0) & (token[row, np.maximum(kids, 0)] == want[:, None])
            alive &= match.any(axis=1)
            at = np.where(alive, kids[flat, match.argmax(axis=1)], -1)
            on_path[flat[alive], at[alive]] = j + 1
        self.ranked_path = on_path[row, self.ranked]
        self.usable = True

    def grow(self, policy: GrowingTree) -> tuple | None:
        """The round of ``policy`` from every position (see :meth:`TreeRounds._rounds`), or None
        where these trees cannot replay it."""
        depth = getattr(policy, policy.depth_param)
        if not self.usable or policy.top_k != self.topk or depth > self.depth:
            return None
        k, rows, ctx, prices = self.topk, self.rows, self.rounds.ctx, self.rounds.prices
        cap = np.minimum(self.rounds.room, depth)
        candidate = np.zeros((rows, self.size), dtype=bool)  # the recorded nodes the policy reaches
        candidate[np.arange(rows)[:, None], self.by_level[0]] = True
        first_bad = np.full(rows, depth + 1)  # the first level whose expansion the recording lacks
        widths = np.zeros((rows, depth), dtype=np.int64)
        widths[:, 0] = 1
        grown = np.ones(rows, dtype=np.int64)  # levels that exist
        candidates = np.full(rows, k, dtype=np.int64)
        expanded = np.zeros((rows, self.size), dtype=bool)  # the recorded nodes the draft expands (feeds)
        for d in range(1, depth):  # expand level d into level d + 1 where the round goes on
            live = np.flatnonzero((grown == d) & (cap > d) & (first_bad > d))
            order = self.by_level[d - 1][live]
            reached = candidate[live[:, None], order]
            frontier = order[reached & (np.cumsum(reached, axis=1) <= k)].reshape(len(live), k)
            keep = policy.keep_rows(self.value[live[:, None], frontier], candidates[live], ctx[live], widths[live, :d],
                                    prices)
            kept = keep.sum(axis=1)
            expanded[np.broadcast_to(live[:, None], frontier.shape)[keep], frontier[keep]] = True
            kids = self.children[live[:, None], frontier + 1]  # (rows, k, k)
            keep = np.broadcast_to(keep[:, :, None], kids.shape)
            first_bad[live[(keep & (kids < 0)).any(axis=(1, 2))]] = d + 1
            new = keep & (kids >= 0)
            candidate[np.broadcast_to(live[:, None, None], kids.shape)[new], kids[new]] = True
            widths[live, d] = kept
            grown[live] += kept > 0
            candidates[live] += k * kept
        drafted = candidate[np.arange(rows)[:, None], self.ranked] & (self.ranked_level <= cap[:, None])
        chosen = drafted & (np.cumsum(drafted, axis=1) <= policy.nodes)  # the top-n of the levels drafted
        # the chosen nodes hold their ancestors (a child never outvalues its parent, and ranks after
        # it), so the accepted path is as deep as the deepest chosen node on the target's path
        accepted = np.where(chosen, self.ranked_path, 0).max(axis=1)
        tree_depth = np.where(chosen, self.ranked_level, 0).max(axis=1)
        row = np.arange(rows)
        deepest = self.ranked[row, np.argmax(chosen & (self.ranked_path == accepted[:, None]), axis=1)]
        leaf = (accepted > 0) & ~expanded[row, deepest]
        return (chosen.sum(axis=1), accepted.tolist(), tree_depth, np.minimum(grown, cap), widths, leaf.tolist(),
                (first_bad <= cap).tolist())

"""DEL's rounds, every prompt in one compiled loop: the SimPy executor's numbers without the
round protocol.

Why. DEL adapts after every round (its update reads every exit layer's shadow tokens), so its
rounds cannot be computed for all positions at once as fixed-γ SD's (:mod:`simlab.sim.vanilla`)
or the tree policies' (:mod:`simlab.sim.trees`) are. Through the protocol a round cost about
11 µs of Python (two generator round trips, a drafted token's signal and the policy's
decision, the update), and on ``smollm2-selfspec`` DEL keeps about one token a round: 0.1 M
simulated tokens per CPU-second where ``simlab bench`` asks 0.5. Yet its decisions never read
the clock, so they can be made first and priced after:

1. :func:`_decide` (numba) walks each prompt as :func:`simlab.policies.rounds.decode` walks DEL: the plan
   (exit layer E, up to d_max drafts, or γ with ``dynamic_exit`` off), the draft run read from
   the replay as ``PromptReplay.draft_until`` reads it (:func:`simlab.sim.draft_paths.confidence`:
   the layer's true path to its first rejection, then its divergence rollout or its
   teacher-forced signals, the tail past the path's end, rollout overruns), the drop at
   confidence < τ_E, the verification's acceptance (the end token always the target's), the
   draft caches' account
   (:class:`~simlab.sim.draft_cache.DraftCache`: what each round's first draft forward feeds),
   and the update, :func:`simlab.policies.del_update.update` itself;
2. :meth:`DelRounds.simulate` prices the rounds with the grid's own floats — ``k`` draft steps of
   layer E as ``LatencyGrid.draft_seconds`` subtracts them, the catch-up of a first forward that
   feeds more than one token by ``LatencyGrid.catch_up_seconds`` itself, the verification's row,
   the exit heads of each shadow read — and sums each prompt's clock (shadow read after the
   prefill, then per round draft, verification, shadow read) and the devices' busy times in the
   executor's order (:func:`~simlab.sim.vanilla.walls`, :func:`~simlab.sim.vanilla.rounds_run`).

So the results are bit for bit those of :class:`~simlab.sim.executor.SimExecutor` running
:class:`~simlab.policies.early_exit.Del` (``tests/test_del_rounds.py`` checks it on the shipped
self-speculative trace, both topologies, and on traces made to reach every branch). A trace this
module cannot replay — a prompt without some exit layer's signals, a rollout recorded with no
step — is left to the protocol, whose errors then name the problem.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simlab.latency.grid import LatencyGrid
from simlab.policies.del_update import update
from simlab.policies.early_exit import Del
from simlab.sim import extrapolation as ex
from simlab.sim.draft_paths import FlatPaths, confidence
from simlab.sim.executor import SimRun, ad_seconds, shadow_heads
from simlab.sim.vanilla import TargetRows, rounds_run, walls
from simlab.trace.replay import TraceReplay


class DelRounds:
    """A trace's exit-layer paths (:class:`~simlab.sim.draft_paths.FlatPaths`, rows in ascending layer
    order) and shadow-token tables (stacked in the same entries) for :func:`_decide`, and the
    pricing of its rounds."""

    def __init__(self, replay: TraceReplay, grid: LatencyGrid):
        self.replay, self.grid = replay, grid
        self.layers = tuple(sorted(replay.trace.manifest.exit_layers))
        self.ad_wall_time_s = [ad_seconds(grid, pl, n) for pl, n in zip(replay.prompt_lens.tolist(),
                                                                        replay.lengths.tolist())]
        self.usable = bool(self.layers) and all(tuple(sorted(p.layers)) == self.layers for p in replay.prompts)
        if not self.usable:
            return
        self.paths = FlatPaths(replay, self.layers)
        self.usable = self.paths.usable
        self.table = np.zeros((int(self.paths.start[-1]), 1 + 3 * len(self.layers)))
        for a, rp in zip(self.paths.start.tolist(), replay.prompts):
            self.table[a:a + rp.n_tokens] = rp.shadow_tokens.table
        self.cum = np.array([grid.draft_cumulative(layer) for layer in self.layers])
        self.verify = TargetRows(grid)

    def replays(self, policy: Del) -> bool:
        """Whether this module gives ``policy``'s numbers: DEL itself (a subclass may decide
        otherwise, and is replayed round by round) drafting on past its own end token, on a trace
        it could read (:attr:`usable`)."""
        return self.usable and type(policy) is Del and not policy.stops_at_draft_end

    def simulate(self, policy: Del) -> SimRun:
        """Everything the SimPy executor reports for ``policy``, timelines and tokens aside."""
        replay, grid = self.replay, self.grid
        decided = _decide(replay.prompt_lens, replay.lengths, replay.budgets, self.paths.arrays, self.table,
                          policy.dynamic_exit, policy.constants)
        rounds, overruns, prompt, c, drafted, layer, feed, k, accepted = decided
        ctx = replay.prompt_lens[prompt] + c
        # LatencyGrid.draft_seconds (inside the grid: no draft passes the budget, and the grid
        # tabulates past the longest prompt's budget)
        draft = self.cum[layer, ctx + drafted] - self.cum[layer, ctx]
        for r in np.flatnonzero(feed > 1).tolist():  # the first forward feeds what the cache lacks
            draft[r] += grid.catch_up_seconds(int(ctx[r]), int(feed[r]), self.layers[layer[r]])
        verify = self.verify(int(k.max(initial=0)) + 1)[k, ctx]
        heads = shadow_heads(grid, replay.trace.manifest, policy)
        shadow_rows = accepted + 1
        shadow = np.zeros(len(k))
        if heads:
            for rows in np.unique(shadow_rows).tolist():
                shadow[shadow_rows == rows] = grid.shadow_seconds(rows, heads)
        # each prompt's bookings: its shadow read after the prefill, then per round draft,
        # verification and shadow read (0.0 where nothing is booked: the same clock)
        per_prompt = 1 + 3 * rounds
        ends = np.cumsum(per_prompt)
        first = ends - per_prompt
        seconds = np.zeros(int(ends[-1]) if len(ends) else 0)
        seconds[first] = grid.shadow_seconds(1, heads) if heads else 0.0
        at = np.repeat(first + 1, rounds) + 3 * _round_of_prompt(rounds)
        seconds[at], seconds[at + 1], seconds[at + 2] = draft, verify, shadow
        target = seconds.copy()
        target[at] = 0.0
        owner = np.repeat(np.arange(len(rounds)), per_prompt)
        priced = ex.Extrapolated()
        ex.draft_runs(priced, grid, ctx, drafted, np.array(self.layers)[layer], feed=feed)
        ex.verifications(priced, grid, k + 1, ctx)
        ex.shadows(priced, grid, np.concatenate([np.ones(len(rounds), np.int64), shadow_rows]), heads)
        return rounds_run(replay.prompt_ids.tolist(), replay.lengths.tolist(), self.ad_wall_time_s, rounds,
                          walls(seconds, ends), np.where(accepted < k, accepted + 1, k), accepted,
                          totals={"target_busy_s": np.bincount(owner, weights=target, minlength=len(rounds)),
                                  "rollout_overruns": overruns}, extrapolated=priced,
                          drafted=drafted, draft_calls=drafted, verified=k, num_drafts=k > 0, draft_busy_s=draft)


def _round_of_prompt(rounds: np.ndarray) -> np.ndarray:
    """0, 1, .. within each prompt's rounds."""
    return np.arange(int(rounds.sum())) - np.repeat(np.cumsum(rounds) - rounds, rounds)


@njit(cache=True)
def _decide(prompt_lens, lengths, budgets, paths, table, dynamic, constants):
    """Every prompt's DEL rounds as :func:`simlab.policies.rounds.decode` and the executor make them
    (module docstring, step 1): per prompt its rounds and rollout overruns; per round its
    prompt, start position, tokens drafted (a dropped one included), exit layer (index), tokens
    its first draft forward fed, drafts verified and drafts accepted."""
    k_layers, d_max, run = len(constants[3]), constants[4], paths[1]
    total = int(lengths.sum())
    ints = np.zeros((7, total), np.int64)  # per round: prompt, c, drafted, exit layer, fed, k, accepted
    rounds, overruns = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    r = 0
    for p in range(len(lengths)):
        pl, n, budget, a = prompt_lens[p], lengths[p], budgets[p], paths[0][p]
        sums, alpha = np.zeros(1 + 3 * k_layers), np.zeros(k_layers)
        guess, searched = np.zeros(k_layers, np.int64), np.zeros(k_layers, np.bool_)
        held = np.zeros(k_layers, np.int64)  # each exit layer's draft cache (DraftCache.held)
        e, gamma, tau = update(sums, table[a:a + 1], alpha, guess, searched, constants)  # after the prefill
        committed = 1
        while committed < n:
            c = committed
            cap = min(d_max if dynamic else gamma, budget - c - 1)
            drafted, k = 0, 0
            if cap > 0 and dynamic:  # PromptReplay.draft_until: up to cap tokens, dropping one below τ_E
                for j in range(1, cap + 1):
                    x, over = confidence(paths, e, p, n, c, j)
                    overruns[p] += over
                    drafted, k = j, j
                    if x < tau:
                        k = j - 1
                        break
            elif cap > 0:  # a fixed plan: its signals are never read
                drafted, k = cap, cap
            fed = 0
            if drafted > 0:
                fed = pl + c - held[e]
                held[e] = pl + c + drafted - 1
            accepted = min(run[e, a + c], k)
            if accepted >= n - c:  # the end token is always the target's
                accepted = n - c - 1
            for i in range(k_layers):  # every cache cropped to the committed prefix
                held[i] = min(held[i], pl + c + accepted)
            ints[0, r], ints[1, r], ints[2, r], ints[3, r], ints[4, r], ints[5, r], ints[6, r] = \
                p, c, drafted, e, fed, k, accepted
            r += 1
            rounds[p] += 1
            e, gamma, tau = update(sums, table[a + c:a + c + accepted + 1], alpha, guess, searched, constants)
            committed = c + accepted + 1
    return rounds, overruns, ints[0, :r], ints[1, :r], ints[2, :r], ints[3, :r], ints[4, :r], ints[5, :r], ints[6, :r]

"""SPIDE's rounds (and its two ablations'), every prompt in one compiled loop: the SimPy
executor's numbers without the round protocol.

Why. SPIDE's mapping table learns from every verification, so its rounds cannot be computed for
all positions at once; through the protocol its parallel rounds cost about 6 µs of Python each,
and ``simlab bench`` measured 0.45-0.52 M simulated tokens per CPU-second against a goal of 0.5.
Its decisions never read the clock (the window s is fixed when the policy is built), so, as for
DEL (:mod:`simlab.sim.del_rounds`), they are made first and priced after:

1. :func:`_decide` (numba) walks each prompt as :func:`simlab.policies.rounds.decode` walks
   :class:`~simlab.policies.spide.Spide`: serial dynamic drafting (Γ_0 = π_0, Γ_i = Γ_(i-1)·α_b
   from the mapping table, eq. 3; stop when Γ ≤ τ, eq. 4; the ablation without it stops at γ),
   each drafted token's confidence read as the protocol reads it
   (:func:`simlab.sim.draft_paths.confidence`); parallel draft verification (the pending drafts and
   the first of s new ones, the window cut to the budget as ``decode`` cuts it; all accepted:
   the other s - 1 stay pending); serial verification where the ablation has no parallel
   module or the draft reached its cap; the table updated with each verification's checked
   tokens (Alg. 1 line 29, :meth:`~simlab.policies.spide.MappingTable.record_checked`) and kept
   across prompts; the draft cache's account (:class:`~simlab.sim.draft_cache.DraftCache`);
2. :meth:`SpideRounds.simulate` prices them with the grid's floats — serial draft steps (and a
   first forward's catch-up) solo, a parallel round's draft steps and verification co-running
   in the one-device topology — and sums each prompt's clock (per round: the serial drafting
   that led to it, then its forward; a parallel round ends with the later of its two forwards,
   which adds to the clock what the later of the two additions gives, rounding being monotonic)
   and the devices' busy times in the executor's order.

So the results are bit for bit those of :class:`~simlab.sim.executor.SimExecutor`
(``tests/test_spide_rounds.py`` checks it on shipped and random traces, greedy and sampled, both
topologies). A subclass of these policies is replayed round by round.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simlab.latency.grid import LatencyGrid
from simlab.policies.spide import UPPER_EDGES, Spide, SpideNoDynaDraft, SpideNoParaVerify
from simlab.sim import extrapolation as ex
from simlab.sim.draft_paths import FlatPaths, confidence
from simlab.sim.executor import SimRun, ad_seconds
from simlab.sim.vanilla import TargetRows, rounds_run, walls
from simlab.trace.replay import TraceReplay
from simlab.trace.schema import NO_LAYER, Topology

VARIANTS = (Spide, SpideNoDynaDraft, SpideNoParaVerify)


class SpideRounds:
    """A trace's draft path (:class:`~simlab.sim.draft_paths.FlatPaths`) for :func:`_decide`, and the
    pricing of its rounds in one topology."""

    def __init__(self, replay: TraceReplay, grid: LatencyGrid, topology: Topology):
        self.replay, self.grid = replay, grid
        self.corun = topology is Topology.ONE_DEVICE
        self.paths = FlatPaths(replay, [None])
        self.ad_wall_time_s = [ad_seconds(grid, pl, n) for pl, n in zip(replay.prompt_lens.tolist(),
                                                                        replay.lengths.tolist())]
        self.cum = np.asarray(grid.draft_cumulative(NO_LAYER, False))
        self.pcum = np.asarray(grid.draft_cumulative(NO_LAYER, self.corun))
        self.verify = TargetRows(grid)
        self.pverify = TargetRows(grid, lambda k: grid.target_row(k, self.corun))

    def replays(self, policy: Spide) -> bool:
        """Whether this module gives ``policy``'s numbers: one of the SPIDE classes itself,
        drafting on past its own end token, on a trace it could read."""
        return self.paths.usable and type(policy) in VARIANTS and not policy.stops_at_draft_end

    def simulate(self, policy: Spide) -> SimRun:
        """Everything the SimPy executor reports for ``policy``, timelines and tokens aside."""
        replay, grid, corun = self.replay, self.grid, self.corun
        table = policy.table
        decided = _decide(replay.prompt_lens, replay.lengths, replay.budgets, self.paths.arrays,
                          np.array(UPPER_EDGES), np.array(table.total, dtype=np.int64),
                          np.array(table.accepted, dtype=np.int64), np.array(table.rate), policy.dyna_draft,
                          policy.para_verify, float(getattr(policy, "tau", 0.0)), float(getattr(policy, "prior", 1.0)),
                          int(getattr(policy, "window", 1)), int(getattr(policy, "gamma", 0) or 0))
        rounds, overruns, prompt, c, parallel, unpaid, feed, checked_n, window, feed_new, accepted, first_new = decided
        ctx = replay.prompt_lens[prompt] + c
        # the serial drafting that led to each forward (none: 0.0), solo
        serial = _steps(grid, self.cum, ctx, unpaid, False, len(self.cum) - 1)
        for r in np.flatnonzero(feed > 1).tolist():
            serial[r] += grid.catch_up_seconds(int(ctx[r]), int(feed[r]))
        # the drafts verified: a serial round's k, solo (a k+1-token forward); a parallel round's m
        # pending and the first new one, co-running in the one-device topology (an m+1-token forward)
        k = checked_n + parallel
        verify = self.verify(int(k.max(initial=0)) + 1)[k, ctx]
        par = np.flatnonzero(parallel)
        if len(par):
            verify[par] = self.pverify(int(k[par].max()))[k[par] - 1, ctx[par]]
        start = ctx + checked_n  # a parallel round's s new drafts follow the pending ones (serial rounds: s = 0)
        new = _steps(grid, self.pcum, start, window, corun, grid.max_context)
        for r in np.flatnonzero(feed_new > 1).tolist():
            new[r] += grid.catch_up_seconds(int(start[r]), int(feed_new[r]), NO_LAYER, corun)
        forward = np.where(parallel, np.maximum(new, verify), verify)
        seconds = np.empty(2 * len(k))
        seconds[0::2], seconds[1::2] = serial, forward
        draft_booked = np.empty(2 * len(k))
        draft_booked[0::2], draft_booked[1::2] = serial, new
        owner = np.repeat(np.arange(len(rounds)), 2 * rounds)
        accepted_all = accepted + first_new
        checked = np.where(accepted < checked_n, accepted + 1, checked_n + parallel)
        serial_round = ~parallel
        priced = ex.Extrapolated()
        ex.draft_runs(priced, grid, ctx, unpaid, feed=feed)
        ex.verifications(priced, grid, k[serial_round] + 1, ctx[serial_round])
        ex.forwards(priced, grid, "target_forward", k[par], ctx[par], corun)
        ex.draft_runs(priced, grid, start[par], window[par], corun=corun, feed=feed_new[par])
        return rounds_run(replay.prompt_ids.tolist(), replay.lengths.tolist(), self.ad_wall_time_s, rounds,
                          walls(seconds, np.cumsum(2 * rounds)), checked, accepted_all,
                          totals={"draft_busy_s": np.bincount(owner, weights=draft_booked, minlength=len(rounds)),
                                  "rollout_overruns": overruns}, extrapolated=priced,
                          drafted=unpaid + window, draft_calls=unpaid + window, verified=k, parallel_rounds=parallel,
                          num_drafts=k > 0, target_busy_s=verify)


def _steps(grid: LatencyGrid, cum: np.ndarray, ctx: np.ndarray, steps: np.ndarray, corun: bool, last: int) -> np.ndarray:
    """Seconds of ``steps`` draft steps from ``ctx``: ``cum``'s difference where ``ctx + steps``
    is at most ``last`` (as the executor reads it), else ``LatencyGrid.draft_seconds``."""
    end = ctx + steps
    inside = end <= last
    out = cum[np.where(inside, end, 0)] - cum[np.where(inside, ctx, 0)]
    for r in np.flatnonzero(~inside).tolist():
        out[r] = grid.draft_seconds(int(ctx[r]), int(steps[r]), NO_LAYER, corun)
    return out


@njit(cache=True)
def _bin(edges: np.ndarray, x: float) -> int:
    """``bisect_right(edges, x)``: the mapping table's interval of confidence x."""
    lo, hi = 0, len(edges)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < edges[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
def _record(edges, total, hits, rate, checked: np.ndarray, count: int, accepted: int) -> None:
    """``MappingTable.record_checked`` of the first ``count`` confidences of ``checked``."""
    for x in checked[:count]:
        b = _bin(edges, x)
        total[b] += 1
        if accepted:
            accepted -= 1
            hits[b] += 1
        rate[b] = hits[b] / total[b]


@njit(cache=True)
def _decide(prompt_lens, lengths, budgets, paths, edges, total, hits, rate, dyna_draft, para_verify, tau, prior,
            window, gamma):
    """Every prompt's rounds as :func:`simlab.policies.rounds.decode` and the executor make them (module
    docstring, step 1): per prompt its rounds and rollout overruns; per round (each one target
    forward) its prompt, start position, whether it is parallel, the serial drafts booked before
    it and what their first forward fed, its drafts verified (serial) or pending (parallel), new
    drafts and what their first forward fed, drafts accepted (pending ones, for a parallel round),
    and whether a parallel round's first new draft was accepted."""
    run = paths[1]
    size = int(lengths.sum())
    ints = np.zeros((9, size), np.int64)  # prompt, c, parallel, unpaid, feed, checked_n, window, feed_new, accepted
    firsts = np.zeros(size, np.bool_)
    rounds, overruns = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    pending = np.empty(int(budgets.max()) + window + 1)  # confidences of the drafts pending, then those checked
    drafted = np.empty(int(budgets.max()) + window + 1)
    r = 0
    for p in range(len(lengths)):
        pl, n, budget, a = prompt_lens[p], lengths[p], budgets[p], paths[0][p]
        held = pl  # the draft's cache: it was prefilled with the prompt
        parallel_mode, m = False, 0
        committed, unpaid, fed = 1, 0, 0
        while committed < n:
            c = committed
            if parallel_mode:  # parallel draft verification (Alg. 1 lines 18-28)
                s = window
                room = budget - c - m - 1
                if room < s:
                    s = room if room > 1 else 1
                accepted = min(run[0, a + c], m, n - 1 - c)
                first_new = accepted == m and c + m < n - 1 and run[0, a + c + m] > 0
                feed_new = pl + c + m - held
                held = pl + c + m + s - 1
                if not first_new:
                    held = min(held, pl + c + accepted)
                ints[0, r], ints[1, r], ints[2, r], ints[3, r], ints[4, r] = p, c, 1, unpaid, fed
                ints[5, r], ints[6, r], ints[7, r], ints[8, r], firsts[r] = m, s, feed_new, accepted, first_new
                if accepted < m:  # the checked drafts: the pending ones to the first rejected
                    _record(edges, total, hits, rate, pending, accepted + 1, accepted)
                    parallel_mode, m = False, 0
                else:  # all pending accepted: and the first new one, read (all s when it was accepted too)
                    for j in range(1, (s if first_new else 1) + 1):
                        x, over = confidence(paths, 0, p, n, c, m + j)
                        overruns[p] += over
                        drafted[j - 1] = x
                    pending[m] = drafted[0]
                    _record(edges, total, hits, rate, pending, m + 1, m + first_new)
                    parallel_mode = first_new  # lines 30-39: none rejected
                    if first_new:
                        pending[:s - 1] = drafted[1:s]
                    m = s - 1 if first_new else 0
                r, rounds[p], unpaid, fed, committed = r + 1, rounds[p] + 1, 0, 0, c + accepted + 1
                continue
            # serial dynamic drafting (lines 4-15), or the ablation's γ
            reliability = prior
            cap = min(budget - c if dyna_draft else gamma, budget - c - 1)
            k, handed = 0, False
            for j in range(1, cap + 1):
                x, over = confidence(paths, 0, p, n, c, j)
                overruns[p] += over
                pending[j - 1] = x
                k = j
                if dyna_draft:
                    reliability *= rate[_bin(edges, x)]
                    stop = reliability <= tau  # eq. 4
                else:
                    stop = j == gamma
                if stop:
                    handed = para_verify
                    break
            if k > 0:  # the executor books these drafts at the next forward
                unpaid, fed = k, pl + c - held
                held = pl + c + k - 1
            if handed:  # the drafts go to parallel verification
                parallel_mode, m = True, k
                continue
            accepted = min(run[0, a + c], k)
            if accepted >= n - c:  # the end token is always the target's
                accepted = n - c - 1
            held = min(held, pl + c + accepted)
            _record(edges, total, hits, rate, pending, min(accepted + 1, k), accepted)
            ints[0, r], ints[1, r], ints[2, r], ints[3, r], ints[4, r] = p, c, 0, unpaid, fed
            ints[5, r], ints[6, r], ints[7, r], ints[8, r] = k, 0, 0, accepted
            r, rounds[p], unpaid, fed, committed = r + 1, rounds[p] + 1, 0, 0, c + accepted + 1
    return (rounds, overruns, ints[0, :r], ints[1, :r], ints[2, :r] > 0, ints[3, :r], ints[4, :r], ints[5, :r],
            ints[6, :r], ints[7, :r], ints[8, :r], firsts[:r])

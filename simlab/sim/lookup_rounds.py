"""Prompt lookup's rounds (``pld``, ``ngram``), every prompt in one compiled loop: the SimPy
executor's numbers without the round protocol.

Why. A lookup round costs the protocol two generator round trips and a Python call into the
compiled matcher, about as much as the simulated tokens it emits allow (``simlab bench`` asks
2 µs a token). Its decisions read no clock, so they are made first and priced after:

1. :func:`_decide` (numba) walks each prompt as :func:`simlab.policies.rounds.decode` walks
   :class:`~simlab.policies.lookup.PromptLookup`: the cap (``num_tokens`` and the budget's room),
   the lookup over the prompt's tokens and the tokens committed — the compiled matcher the policy
   calls, :func:`simlab.policies.ngram_match.match`, over ``tokens[:prompt_len + committed]``,
   nothing later — and the target's verification (the longest prefix of the proposal that is the
   target's path, the end token always the target's);
2. :meth:`LookupRounds.simulate` prices the rounds with the grid's floats — the policy's own
   :meth:`~simlab.policies.lookup.PromptLookup.lookup_seconds` where a lookup ran, the verification's row
   (the plain target step where nothing was proposed) — and sums each prompt's clock in the
   executor's order (:func:`~simlab.sim.vanilla.walls`, :func:`~simlab.sim.vanilla.rounds_run`).

Bit for bit :class:`~simlab.sim.executor.SimExecutor` running the policy
(``tests/test_lookup.py`` checks it on shipped and random traces).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simlab.latency.grid import LatencyGrid
from simlab.policies.lookup import PromptLookup
from simlab.policies.ngram_match import match, proposal_length
from simlab.sim import extrapolation as ex
from simlab.sim.executor import SimRun, ad_seconds
from simlab.sim.vanilla import TargetRows, interleave, rounds_run, walls
from simlab.trace.replay import TraceReplay


class LookupRounds:
    """A trace's prompts as token arrays, and the pricing of prompt lookup's rounds on them."""

    def __init__(self, replay: TraceReplay, grid: LatencyGrid):
        self.replay, self.grid = replay, grid
        self.ad_wall_time_s = [ad_seconds(grid, pl, n) for pl, n in zip(replay.prompt_lens.tolist(),
                                                                        replay.lengths.tolist())]
        # a round that proposes nothing is the plain target step (the policy runs no draft model)
        self.rows = TargetRows(grid, lambda k: grid.target_step_row() if k == 1 else grid.target_row(k))

    def simulate(self, policy: PromptLookup) -> SimRun:
        replay = self.replay
        starts, ks, accepted, calls = [], [], [], []
        for rp in replay.prompts:
            out = np.zeros((max(rp.n_tokens, 1), 3), dtype=np.int64)
            n = _decide(rp.tokens, rp.prompt_len, rp.n_tokens, rp.budget, policy.num_tokens, policy.ngram_min,
                        policy.ngram_max, policy.eos, policy.cut_at_eos, out)
            calls.append(n)
            starts.append(out[:n, 0] + rp.prompt_len)
            ks.append(out[:n, 1])
            accepted.append(out[:n, 2])
        ctx, k, acc = np.concatenate(starts), np.concatenate(ks), np.concatenate(accepted)
        looked_up = _caps(replay, calls, ctx, policy.num_tokens) > 0
        fixed, per_token = policy.COST
        lookup = np.where(looked_up, fixed + per_token * ctx, 0.0)
        verify = self.rows(int(k.max()) + 1 if len(k) else 1)[k, ctx]
        calls = np.asarray(calls, dtype=np.int64)
        wall = walls(interleave(lookup, verify), 2 * np.cumsum(calls))
        priced = ex.Extrapolated()
        ex.verifications(priced, self.grid, k + 1, ctx, plain=True)
        return rounds_run(replay.prompt_ids.tolist(), replay.lengths.tolist(), self.ad_wall_time_s, calls, wall,
                          np.where(acc < k, acc + 1, k), acc, extrapolated=priced, drafted=k, verified=k, num_drafts=k > 0,
                          draft_busy_s=lookup, target_busy_s=verify)


def _caps(replay: TraceReplay, calls: list[int], ctx: np.ndarray, num_tokens: int) -> np.ndarray:
    """Each round's cap, min(num_tokens, budget - committed - 1): no lookup runs where it is 0."""
    prompt = np.repeat(np.arange(len(calls)), calls)
    committed = ctx - replay.prompt_lens[prompt]
    return np.minimum(num_tokens, replay.budgets[prompt] - committed - 1)


@njit(cache=True)
def _decide(tokens, prompt_len, end, budget, num_tokens, ngram_min, ngram_max, eos, cut_at_eos, out):
    """One prompt's rounds into ``out`` (committed position, tokens proposed, accepted); returns
    how many. ``tokens``: the prompt's then the target's tokens; a lookup reads only the first
    ``prompt_len + committed`` of them."""
    committed, r = 1, 0
    while committed < end:
        cap = min(num_tokens, budget - committed - 1)
        n = prompt_len + committed
        k = acc = 0
        if cap > 0:
            start, size = match(tokens, n, ngram_min, ngram_max)
            if size:
                k = proposal_length(tokens, n, start, num_tokens, cap, eos, cut_at_eos)
                limit = min(k, end - committed - 1)  # the end token is always the target's
                while acc < limit and tokens[start + acc] == tokens[n + acc]:
                    acc += 1
        out[r, 0], out[r, 1], out[r, 2] = committed, k, acc
        r += 1
        committed += acc + 1
    return r

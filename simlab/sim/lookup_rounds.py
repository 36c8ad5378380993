"""Drafting by lookup (``pld``, ``ngram``, ``pld-sd``, ``suffix``, ``rest``), every prompt in one
compiled loop: the SimPy executor's numbers without the round protocol.

Why. A lookup round costs the protocol two generator round trips and a Python call into the
lookup, about as much as the simulated tokens it emits allow (``simlab bench`` asks 2 µs a token;
suffix decoding's and REST's Python lookups take hundreds). Its decisions read no clock, so they
are made first and priced after:

1. a compiled loop walks each prompt as :func:`simlab.policies.rounds.decode` walks the policy:
   the cap (``num_tokens`` and the budget's room), the lookup over the prompt's tokens and the
   tokens committed, ``tokens[:prompt_len + committed]``, nothing later, and the target's
   verification (the longest prefix of the proposal that is the target's path, the end token
   always the target's). The lookups: prompt lookup's compiled matcher, the one the policy calls
   (:func:`simlab.policies.ngram_match.match`); suffix decoding's trees in arrays
   (:mod:`simlab.sim.suffix_rounds`); REST's retrieval over the datastore's arrays
   (:mod:`simlab.sim.rest_rounds`). ``pld-sd``'s rounds whose lookup proposes nothing are the
   draft model's γ tokens, accepted as the trace's draft path says, as fixed-γ SD's are
   (:mod:`simlab.sim.vanilla`), its draft cache's catch-up kept as :mod:`simlab.sim.draft_cache` keeps it;
2. :meth:`LookupRounds.simulate` prices the rounds with the grid's floats — the policy's own
   :meth:`~simlab.policies.lookup.LookupPolicy.lookup_seconds` where a lookup ran, the draft's
   steps where it drafted, the verification's row (the plain target step where a policy with no
   draft model proposed nothing) — and sums each prompt's clock in the executor's order
   (:func:`~simlab.sim.vanilla.walls`, :func:`~simlab.sim.vanilla.rounds_run`).

Nothing is computed ahead of a run or kept between runs: each simulation looks up at its rounds'
starts only, so one run's CPU time is the figure ``simlab bench`` reports (the one-off costs of a
process, numba's load of the compiled code and the datastore's read, aside: README of
``results/lookup``). Bit for bit :class:`~simlab.sim.executor.SimExecutor` running the policy
(``tests/test_lookup.py``, ``tests/test_lookup_compiled.py`` check it on shipped and random traces).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simlab.latency.grid import LatencyGrid
from simlab.policies.base import Policy
from simlab.policies.lookup import LookupPolicy, LookupThenDraft, Ngram, PromptLookup
from simlab.policies.ngram_match import match, proposal_length
from simlab.policies.rest import Rest
from simlab.policies.suffix import SuffixDecoding
from simlab.policies.vllm import VllmEnd
from simlab.sim import extrapolation as ex
from simlab.sim import rest_rounds, suffix_rounds
from simlab.sim.executor import SimRun, ad_seconds
from simlab.sim.lookup_verify import accepted
from simlab.sim.vanilla import TargetRows, interleave, rounds_run, walls
from simlab.trace.replay import TraceReplay
from simlab.trace.schema import NO_LAYER

CACHE_NODES = 1 << 20  # the suffix cache's room at the start, at most (beyond, it grows as it fills)


class LookupRounds:
    """A trace's prompts as token arrays, and the pricing of lookup rounds on them. A prompt's
    rounds are rows of five: the committed position, the tokens proposed, how many were accepted,
    whether the draft model drafted them (pld-sd), and the tokens its first forward fed
    (:mod:`simlab.sim.draft_cache`)."""

    POLICIES = (PromptLookup, Ngram, LookupThenDraft, SuffixDecoding, Rest)

    def __init__(self, replay: TraceReplay, grid: LatencyGrid):
        self.replay, self.grid = replay, grid
        self.ad_wall_time_s = [ad_seconds(grid, pl, n) for pl, n in zip(replay.prompt_lens.tolist(),
                                                                        replay.lengths.tolist())]
        # a round that proposes nothing is the plain target step (the policy runs no draft model)
        self.plain_rows = TargetRows(grid, lambda k: grid.target_step_row() if k == 1 else grid.target_row(k))
        self.rows = TargetRows(grid)  # pld-sd runs a draft model: every verification is a target forward
        self._cum = np.asarray(grid.draft_cumulative(NO_LAYER, False))

    def replays(self, policy: Policy) -> bool:
        """Whether this replay runs ``policy``: one of :data:`POLICIES` as shipped (an engine's own
        end of a request, ``done``, ``kept`` or ``past_end``, is the round protocol's alone: vLLM's,
        :class:`~simlab.policies.vllm.VllmEnd`, when its ``vllm_end`` is on)."""
        kind = type(policy)
        if kind not in self.POLICIES or policy.past_end:
            return False
        if isinstance(policy, VllmEnd):
            return not policy.ends_as_vllm
        return kind.done is Policy.done and kind.kept is Policy.kept

    def simulate(self, policy: LookupPolicy) -> SimRun:
        """What the executor reports for ``policy`` (:meth:`replays` says which), timelines and tokens aside."""
        rounds = self._rounds(policy)
        calls = np.array([len(r) for r in rounds], dtype=np.int64)
        c, k, acc, model, feed = np.concatenate(rounds).T if len(rounds) else np.zeros((5, 0), dtype=np.int64)
        prompt = np.repeat(np.arange(len(calls)), calls)
        ctx = c + self.replay.prompt_lens[prompt]
        cap = np.minimum(policy.num_tokens, self.replay.budgets[prompt] - c - 1)
        fixed, per_token = policy.COST
        lookup = np.where(cap > 0, fixed + per_token * ctx, 0.0)  # no lookup runs where the cap is 0
        rows = self.rows if policy.drafts else self.plain_rows
        verify = rows(int(k.max()) + 1 if len(k) else 1)[k, ctx]
        priced = ex.Extrapolated()
        ex.verifications(priced, self.grid, k + 1, ctx, plain=not policy.drafts)
        shared = dict(checked=np.where(acc < k, acc + 1, k), accepted=acc, extrapolated=priced, drafted=k, verified=k,
                      num_drafts=k > 0, target_busy_s=verify)
        if not policy.drafts:
            wall = walls(interleave(lookup, verify), 2 * np.cumsum(calls))
            return rounds_run(self.replay.prompt_ids.tolist(), self.replay.lengths.tolist(), self.ad_wall_time_s,
                              calls, wall, draft_busy_s=lookup, **shared)
        drafting = (model == 1) & (k > 0)
        draft = self._draft_seconds(ctx, np.where(drafting, k, 0), feed)
        ex.draft_runs(priced, self.grid, ctx[drafting], k[drafting], feed=feed[drafting])
        wall = walls(_stack(lookup, draft, verify), 3 * np.cumsum(calls))
        # the draft device's busy time adds each round's lookup, then its drafting, as it books them
        busy = np.bincount(np.repeat(prompt, 2), weights=interleave(lookup, draft), minlength=len(calls))
        return rounds_run(self.replay.prompt_ids.tolist(), self.replay.lengths.tolist(), self.ad_wall_time_s, calls,
                          wall, totals={"draft_busy_s": busy}, draft_calls=np.where(drafting, k, 0), **shared)

    def _draft_seconds(self, ctx: np.ndarray, k: np.ndarray, feed: np.ndarray) -> np.ndarray:
        """Each round's draft steps (0.0 where none), the first one's catch-up included, as the
        executor prices them: ``cum`` differences, the grid's own sum past it, then the catch-up."""
        grid, cum = self.grid, self._cum
        inside = ctx + k < len(cum)
        seconds = np.zeros(len(ctx))
        seconds[inside] = cum[(ctx + k)[inside]] - cum[ctx[inside]]
        for j in np.flatnonzero(~inside).tolist():
            seconds[j] = grid.draft_seconds(int(ctx[j]), int(k[j]), NO_LAYER)
        two = (feed == 2) & (k > 0)
        seconds[two] = seconds[two] + np.asarray(grid.catch_up_row(2))[ctx[two]]
        for j in np.flatnonzero((feed > 2) & (k > 0)).tolist():
            seconds[j] = seconds[j] + grid.catch_up_seconds(int(ctx[j]), int(feed[j]), NO_LAYER)
        return seconds

    def _rounds(self, policy: LookupPolicy) -> list[np.ndarray]:
        """Every prompt's rounds, one row a round, in the replay's prompt order."""
        if isinstance(policy, SuffixDecoding):
            return self._suffix(policy)
        if isinstance(policy, Rest):
            return self._rest(policy)
        gamma = policy.gamma if isinstance(policy, LookupThenDraft) else 0
        out = []
        for rp in self.replay.prompts:
            rounds = np.zeros((max(rp.n_tokens, 1), 5), dtype=np.int64)
            run = np.asarray(rp.draft.run, dtype=np.int64) if gamma else np.zeros(1, dtype=np.int64)
            n = _prompt_lookup(rp.tokens, rp.prompt_len, rp.n_tokens, rp.budget, policy.num_tokens, policy.ngram_min,
                               policy.ngram_max, policy.eos, policy.cut_at_eos, gamma, run, rounds)
            out.append(rounds[:n])
        return out

    def _suffix(self, policy: SuffixDecoding) -> list[np.ndarray]:
        depth = policy.max_tree_depth
        prompts = self.replay.prompts
        own = suffix_rounds.Tree(depth, max(rp.prompt_len + rp.n_tokens for rp in prompts))
        # rows for every response's tokens, up to CACHE_NODES; the table grows with each prompt's room
        cache = suffix_rounds.Tree(depth, min(sum(rp.n_tokens for rp in prompts), CACHE_NODES // depth), ahead=0)
        draft, best, theirs = (np.zeros(policy.num_tokens, dtype=np.int64) for _ in range(3))
        factor, floor = np.float32(policy.max_spec_factor), np.float32(policy.min_token_prob)
        out = []
        for rp in prompts:
            own.clear()
            cache.new_sequence()
            cache.room(rp.n_tokens)
            rounds = np.zeros((max(rp.n_tokens, 1), 5), dtype=np.int64)
            n = suffix_rounds.rounds(rp.tokens, rp.prompt_len, rp.n_tokens, rp.budget, policy.num_tokens, depth, factor,
                                     floor, policy.global_cache, own.arrays(), cache.arrays(), draft, best, theirs,
                                     rounds)
            out.append(rounds[:n])
        return out

    def _rest(self, policy: Rest) -> list[np.ndarray]:
        store = policy.store
        at, values = np.zeros(policy.max_matches, dtype=np.int64), np.zeros(policy.max_matches, dtype=store.tokens.dtype)
        draft = np.zeros(policy.num_tokens, dtype=np.int64)
        out = []
        for rp in self.replay.prompts:
            own = store.answered(rp.tokens[:rp.prompt_len])
            rounds = np.zeros((max(rp.n_tokens, 1), 5), dtype=np.int64)
            n = rest_rounds.rounds(rp.tokens, rp.prompt_len, rp.n_tokens, rp.budget, policy.num_tokens,
                                   policy.min_suffix, policy.max_suffix, policy.max_matches, store.tokens, store.owner,
                                   store.order, own, at, values, draft, rounds)
            out.append(rounds[:n])
        return out


def _stack(*seconds: np.ndarray) -> np.ndarray:
    """Each round's seconds of every kind, round by round: the order the prompt's clock adds them."""
    return np.stack(seconds, axis=1).reshape(-1)


@njit(cache=True)
def _prompt_lookup(tokens, prompt_len, end, budget, num_tokens, ngram_min, ngram_max, eos, cut_at_eos, gamma, run, out):
    """One prompt's rounds of prompt lookup into ``out`` (a row a round); returns how many.
    ``tokens``: the prompt's then the target's tokens; a lookup reads only the first
    ``prompt_len + committed`` of them. ``gamma`` > 0 (pld-sd): a round whose lookup proposes
    nothing drafts ``gamma`` tokens with the draft model, which accepts ``run[committed]`` of them
    (the trace's draft path), its cache holding ``held`` tokens (:class:`~simlab.sim.draft_cache.DraftCache`)."""
    committed, r, held = 1, 0, prompt_len
    while committed < end:
        cap = min(num_tokens, budget - committed - 1)
        n = prompt_len + committed
        k = acc = model = feed = 0
        if cap > 0:
            start, size = match(tokens, n, ngram_min, ngram_max)
            if size:
                k = proposal_length(tokens, n, start, num_tokens, cap, eos, cut_at_eos)
                acc = accepted(tokens[start:], tokens, n, k, end - committed - 1)
        if k == 0 and gamma > 0:  # nothing looked up: the draft model drafts this round
            model, k = 1, max(min(gamma, budget - committed - 1), 0)
            if k > 0:
                feed, held = n - held, n + k - 1  # the first forward feeds what the cache lacks
                acc = min(run[committed], k, end - committed - 1)
        if held > n + acc:  # the verification crops the cache to the committed prefix
            held = n + acc
        out[r, 0], out[r, 1], out[r, 2], out[r, 3], out[r, 4] = committed, k, acc, model, feed
        r += 1
        committed += acc + 1
    return r

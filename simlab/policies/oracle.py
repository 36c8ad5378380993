"""The oracle: the fastest serial schedule for a trace, found with perfect knowledge.

The one declared exception to "a policy never sees the future" (docs/architecture.md): it
reads the replay's acceptance outcomes and is a *serial-schedule bound*: no serial policy (draft
k tokens, then verify them) is faster on the same trace and latency model. It is not an upper
bound on every policy: parallel policies (PEARL, SPIDE) overlap drafting with verification,
which no serial schedule does, and can beat it. Drafting exactly the tokens that will be
accepted is *not* optimal when verify cost is not monotone in k (on 2 CPU cores a 4-token
verify of the Qwen pair measured cheaper than a 3-token one), so the oracle plans by dynamic
programming over rounds.

A round's price depends on more than its position: its first draft forward feeds every token
the draft's KV cache lacks (:mod:`simlab.sim.draft_cache`): one after a round that rejected a
draft, two after a round that accepted every draft, one more for each round before it that
drafted nothing. So the programme's state is (position c, tokens fed f). With ``run[c]`` the
accepted run from c, r = min(run[c], n-c-1), n the prompt's end, ``T(c, k)`` the price of a
serial round (k draft steps, then a (k+1)-token verify, both at context c) and ``u(c, f)`` the
catch-up of a first draft forward that feeds f tokens (0 for f = 1), all from the same
:class:`~simlab.latency.grid.LatencyGrid` the simulator prices with:

    V(n, f) = 0
    V(c, f) = min( T(c, 0) + V(c+1, f+1),                   a round that drafts nothing
                   u(c, f) + W(c) )                          a round that drafts
    W(c)    = min over k in 1..min(K, budget-c-1) of  T(c, k) + (V(c+k+1, 2) if k <= r
                                                                 else V(c+r+1, 1))

A drafting round from c always emits min(k, r) + 1 tokens, whatever policy chose k, and
leaves the draft lacking two tokens if it accepted all k, else one; so ``V(1, 1)`` is no more
than the time of any serial policy that drafts at most K tokens per round on the same trace and
latency model, and it is the time the simulator reports for the oracle's own schedule. Only
f = 1 and f = 2 follow a drafting round; unrolling the first line, V(c, 2) is the least over j
of j rounds that draft nothing, then a drafting round at c+j that feeds 2+j tokens:

    V(c, 2) = min over j >= 0 of  Z(c, c+j) + u(c+j, 2+j) + W(c+j),  or Z(c, n)

with Z(c, c') the price of the plain target steps from c to c'. Every term is at least
Z(c, c') + V(c', 1) for c' = c+j (as W(c') >= V(c', 1)), so the scan over j stops where the
least of those over c' >= c+j already exceeds the best found: usually at once, after a
stretch of rejections at most.
"""

from __future__ import annotations

import math
from itertools import accumulate
from operator import add
from typing import Callable

from simlab.common.errors import SimlabError
from simlab.policies.base import (
    COUNT,
    Param,
    Plan,
    Policy,
    PromptInfo,
    RoundState,
    Serial,
)
from simlab.policies.timing import latency_of

_SLACK = 1e-9  # relative: the bound's prefix sums round differently from the terms' own sums


def schedule(rounds: list[list[float]], tails: tuple[list[list[float]], list[list[int]]], run: list[int], n: int,
             budget: int, top_k: int, catch_up: Callable[[int], list[float]]) -> tuple[float, list[int]]:
    """The dynamic programme of the module docstring: ``V(1, 1)`` and the draft length chosen at
    each position the optimal schedule reaches (0 elsewhere), from ``rounds[c - 1][k]`` = T(c, k)
    for c = 1..n-1, k = 0..top_k, their ``tails`` (the least T(c, k) over k >= i and the first
    such k: :func:`~simlab.latency.grid.suffix_least`), and ``catch_up(f)[c]`` = u(c, f) for
    f >= 2 (a row per f, asked for once). On ties the earliest drafting round and the least k win."""
    inf = math.inf
    rows = {2: catch_up(2)}
    v1 = [0.0] * (n + 1)  # V(c, 1)
    v2 = [0.0] * (n + 1)  # V(c, 2)
    w = [inf] * (n + 1)  # W(c)
    k_w = [0] * (n + 1)  # the k attaining W(c)
    j2 = [0] * (n + 1)  # the plain steps from (c, 2) before its drafting round
    z = [0.0, 0.0, *accumulate([row[0] for row in rounds])]  # z[c] = Z(1, c)
    floor = [0.0] * (n + 1)  # least of Z(1, c') + V(c', 1) over c' >= c
    floor[n] = least_after = end = z[n]
    two, slack = rows[2], 1.0 + _SLACK
    tail_least, tail_k = tails
    for c in range(n - 1, 0, -1):
        seconds = rounds[c - 1]
        r = run[c]
        if r > n - c - 1:
            r = n - c - 1
        top = budget - c - 1
        if top > top_k:
            top = top_k
        # W(c). k <= r: every draft accepted, the next round feeds two tokens (head = 1, common,
        # without the slices)
        head = r if r < top else top
        if head == 1:
            best_t, best_k = seconds[1] + v2[c + 2], 1
        else:
            best_t, best_k = inf, 0
            if head:
                k = 0
                for t in map(add, seconds[1 : head + 1], v2[c + 2 : c + head + 2]):
                    k += 1
                    if t < best_t:
                        best_t, best_k = t, k
        if r < top:  # k > r: each emits r + 1 tokens and rejects one, so the least T(c, k) wins
            if top == top_k:
                least, k = tail_least[c - 1][r + 1], tail_k[c - 1][r + 1]
            else:  # near the budget
                tail = seconds[r + 1 : top + 1]
                least = min(tail)
                k = r + 1 + tail.index(least)
            if least + v1[c + r + 1] < best_t:
                best_t, best_k = least + v1[c + r + 1], k
        w[c] = best_t
        k_w[c] = best_k
        # V(c, 2): j plain steps, then a drafting round feeding 2 + j tokens, or plain steps to
        # the end; drafting now (inf if nothing can be drafted) unless a later term may win
        base = z[c]
        best2 = two[c] + best_t
        if least_after - base <= best2 * slack:
            best_j = 0
            cap = best2 if best2 < end - base else end - base
            j = 1
            while c + j < n and floor[c + j] - base <= cap * slack:
                if w[c + j] < inf:
                    row = rows.get(2 + j) or rows.setdefault(2 + j, catch_up(2 + j))
                    t = z[c + j] - base + row[c + j] + w[c + j]
                    if t < best2:
                        best2, best_j = t, j
                        if t < cap:
                            cap = t
                j += 1
            if end - base < best2:
                best2, best_j = end - base, n - c
            j2[c] = best_j
        v2[c] = best2
        # V(c, 1): a drafting round feeds one token; a plain step leaves (c + 1, 2)
        plain = seconds[0] + v2[c + 1]
        v1c = v1[c] = best_t if best_t <= plain else plain
        if base + v1c < least_after:
            least_after = base + v1c
        floor[c] = least_after
    choice = [0] * (n + 1)
    c, fed_two = 1, False  # the walk from (1, 1)
    while c < n:
        if fed_two:
            c += j2[c]
        elif w[c] > rounds[c - 1][0] + v2[c + 1]:  # a plain step, to (c + 1, 2)
            c, fed_two = c + 1, True
            continue
        if c >= n:
            break
        k = choice[c] = k_w[c]
        r = min(run[c], n - c - 1)
        fed_two = k <= r
        c += (k if fed_two else r) + 1
    return v1[1], choice


class Oracle(Policy):
    name = "oracle"
    summary = ("perfect-knowledge serial schedule (dynamic programming): a serial-schedule bound, not a "
               "policy; parallel policies can beat it")
    paper = "bound over serial schedules (docs/policies/oracle.md); Leviathan et al. 2023 round model, arXiv:2211.17192"
    params = (Param("max_draft", 16, "largest draft length K the oracle considers", COUNT),)
    needs_future = True

    def __init__(self, context, **values):
        super().__init__(context, **values)
        self._choice: list[int] = []
        self._plans: dict[int, Serial] = {}  # a plan per k, built when first chosen

    def reset(self, prompt: PromptInfo) -> None:
        if prompt.replay is None:
            raise SimlabError("the oracle needs a trace to see the future; it cannot run live")
        self._choice = self._solve(prompt)

    def _solve(self, prompt: PromptInfo) -> list[int]:
        run = prompt.replay.draft.run
        n, pl, budget = prompt.n_tokens, prompt.prompt_len, prompt.budget
        top_k = min(self.max_draft, max(budget - 2, 0))
        grid = latency_of(self.context, self.name)
        # T(c, k) for c = 1..n-1 (row c - 1), tabulated at once; u(c, f) by c, a row per f
        rounds = grid.serial_rounds(pl + 1, n - 1, top_k)
        tails = grid.serial_round_tails(pl + 1, n - 1, top_k)

        def catch_up(feed: int) -> list[float]:
            if pl + n <= grid.max_context:
                return grid.catch_up_row(feed)[pl : pl + n]
            return [grid.catch_up_seconds(pl + c, feed) for c in range(n)]

        self.expected_seconds, choice = schedule(rounds, tails, run, n, budget, top_k, catch_up)
        return choice

    def plan(self, state: RoundState) -> Plan:
        k = self._choice[state.committed]
        plan = self._plans.get(k)
        if plan is None:
            plan = self._plans[k] = Serial(k, fixed=True)
        return plan

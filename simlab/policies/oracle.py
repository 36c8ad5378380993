"""The oracle: the fastest serial schedule for a trace, found with perfect knowledge.

The one declared exception to "a policy never sees the future" (docs/architecture.md): it
reads the replay's acceptance outcomes and is a *serial-schedule bound*: no serial policy (draft
k tokens, then verify them) is faster on the same trace and latency model. It is not an upper
bound on every policy: parallel policies (PEARL, SPIDE) overlap drafting with verification,
which no serial schedule does, and can beat it. Drafting exactly the tokens that will be
accepted is *not* optimal when verify cost is not monotone in k (on 2 CPU cores a 4-token
verify of the Qwen pair measured cheaper than a 3-token one), so the oracle plans by dynamic
programming over rounds. Let ``run[c]`` be the accepted run from position c and ``T(c, k)``
the price of a serial round (k draft steps, then a (k+1)-token verify, both at context c;
priced by the same :class:`~simlab.latency.grid.LatencyGrid` the simulator uses):

    best[n] = 0
    best[c] = min over k in 0..min(K, budget-c-1) of  T(c, k) + best[c + min(k, run[c], n-c-1) + 1]

A serial round that drafts k tokens from c always emits min(k, run[c], n-c-1) + 1 tokens, whatever
the policy that chose k, so ``best[1]`` is no more than the time of any serial policy that
drafts at most K tokens per round on the same trace and latency model.
"""

from __future__ import annotations

from operator import add

from simlab.errors import SimlabError
from simlab.policies.base import (
    COUNT,
    Param,
    Plan,
    Policy,
    PromptInfo,
    RoundState,
    Serial,
)
from simlab.policies.timing import latency_of, serial_round_seconds


def schedule(rounds: list[list[float]], run: list[int], n: int, budget: int, top_k: int) -> tuple[list[float], list[int]]:
    """The dynamic programme of the module docstring: ``best[c]`` and the k that attains it
    (the first on ties) for c = 1..n-1, from ``rounds[c - 1][k]`` = T(c, k) for k = 0..top_k.

    For each c it is the scan over k = 0..min(K, budget - c - 1) for the least
    T(c, k) + best[c + min(k, r) + 1], done in C loops (a Python step per k was most of the
    oracle's time): for k ≤ r the sums are added by map; every k > r emits r + 1 tokens as well
    and so adds the same best[c + r + 1], where the least T(c, k) wins unless an earlier k's sum
    rounds to the same float (then the scan's first such k). tests/test_replay.py pins it to the
    scan.
    """
    best = [0.0] * (n + 1)
    choice = [0] * (n + 1)
    for c in range(n - 1, 0, -1):  # (scalar minima by comparisons: a builtin call costs more)
        seconds = rounds[c - 1]
        r = run[c]  # a round from c emits min(k, r) + 1 tokens (rounds.py), r = min(run[c], n - c - 1)
        if r > n - c - 1:
            r = n - c - 1
        top = budget - c - 1
        if top > top_k:
            top = top_k
        head = r if r < top else top
        # the first least of T(c, k) + best[c + k + 1] for k = 0..head (head = 1, common, without
        # the slices)
        best_t, best_k = seconds[0] + best[c + 1], 0
        if head == 1:
            t = seconds[1] + best[c + 2]
            if t < best_t:
                best_t, best_k = t, 1
        elif head:
            k = 0
            for t in map(add, seconds[1 : head + 1], best[c + 2 : c + head + 2]):
                k += 1
                if t < best_t:
                    best_t, best_k = t, k
        if r < top:
            tail = seconds[r + 1 : top + 1]
            after, least = best[c + r + 1], min(tail)
            if least + after < best_t:
                j = tail.index(least)
                if j and min(tail[:j]) + after == least + after:
                    j = next(i for i, s in enumerate(tail) if s + after == least + after)
                best_k, best_t = r + 1 + j, least + after
        best[c], choice[c] = best_t, best_k
    return best, choice


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
        self._plans = [Serial(k, fixed=True) for k in range(self.max_draft + 1)]  # a plan per k, built once

    def reset(self, prompt: PromptInfo) -> None:
        if prompt.replay is None:
            raise SimlabError("the oracle needs a trace to see the future; it cannot run live")
        self._choice = self._solve(prompt)

    def _solve(self, prompt: PromptInfo) -> list[int]:
        run = prompt.replay.draft.run
        n, pl, budget = prompt.n_tokens, prompt.prompt_len, prompt.budget
        top_k = min(self.max_draft, max(budget - 2, 0))
        # T(c, k) for c = 1..n-1 (row c - 1), tabulated at once
        rounds = serial_round_seconds(latency_of(self.context, self.name), pl + 1, n - 1, top_k)
        best, choice = schedule(rounds, run, n, budget, top_k)
        self.expected_seconds = best[1]
        return choice

    def plan(self, state: RoundState) -> Plan:
        return self._plans[self._choice[state.committed]]

"""The target's greedy verification of a looked-up proposal, compiled for the lookup replays
(:mod:`simlab.sim.lookup_rounds`, :mod:`simlab.sim.suffix_rounds`, :mod:`simlab.sim.rest_rounds`): one
rule where each replay wrote the loop again, the same as the executor's (``sim/executor.py``)."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def accepted(proposal, tokens, n, k, room):
    """How many of ``proposal[:k]`` the target keeps at context length ``n``: the longest prefix that is
    its own path ``tokens[n:]``, at most ``room`` (the end token is always the target's)."""
    limit = min(k, room)
    acc = 0
    while acc < limit and proposal[acc] == tokens[n + acc]:
        acc += 1
    return acc

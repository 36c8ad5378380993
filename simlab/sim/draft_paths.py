"""Drafters' paths through a trace as flat arrays, and the signal a drafted token shows, for the
simulator's compiled replays (DEL's :mod:`simlab.sim.del_rounds`, SPIDE's
:mod:`simlab.sim.spide_rounds`).

:func:`confidence` is ``PromptReplay.signals`` for one token: the confidence of the j-th token
of a draft run that starts at position c, and whether reading it is a rollout overrun, by the
rules of :mod:`simlab.trace.replay` (the true path to the run's first rejection d, the tail's
step 0 past the path's end, then the drafter's rollout recorded at d, or its teacher-forced
signals where it has none; past a recorded rollout its last step again, an overrun). A replay
calls it wherever the protocol reads a signal, so overruns are counted as the protocol counts
them: once per read.

Editing this file: numba caches a compiled function beside its own file and checks only that
file for changes, so the compiled replays calling into this one keep the old code until
``simlab/sim/__pycache__/*.nbi`` and ``*.nbc`` are deleted (their tests then fail, not pass)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from simlab.trace.replay import TraceReplay


class FlatPaths:
    """The paths of ``drafters`` (None: the trace's draft model; an int: that exit layer), rows
    in that order, for every prompt of ``replay``.

    Prompt p's positions 0..n-1 are entries ``start[p]..start[p] + n - 1`` of every per-position
    array, with one more entry for position n (where a run that reaches the path's end reads the
    tail): ``run`` (accepted positions from there) and ``conf`` per drafter, ``rollout_at`` /
    ``rollout_len`` the drafter's rollout recorded at a divergence position (steps 1.. in
    ``rollout_conf``; length -1: none), ``head`` the tail's step 0 at position n where
    ``has_head``. :attr:`arrays` holds them in :func:`confidence`'s order. ``usable``: False where a
    prompt lacks a drafter's path or holds a rollout with no step past its first (the protocol
    then meets the problem, and names it).
    """

    def __init__(self, replay: TraceReplay, drafters: Sequence[int | None]):
        prompts = replay.prompts
        self.start = np.concatenate([[0], np.cumsum(replay.lengths + 1)]).astype(np.int64)
        rows, size = len(drafters), int(self.start[-1])
        self.usable = all(d is None or d in p.layers for p in prompts for d in drafters)
        self.run, self.conf = np.zeros((rows, size), dtype=np.int64), np.zeros((rows, size))
        self.rollout_at, self.rollout_len = np.zeros((rows, size), dtype=np.int64), np.full((rows, size), -1, dtype=np.int64)
        self.head, self.has_head = np.zeros((rows, len(prompts))), np.zeros((rows, len(prompts)), dtype=np.bool_)
        flat: list[float] = []
        for p, rp in enumerate(prompts):
            a, n = int(self.start[p]), rp.n_tokens
            for i, drafter in enumerate(drafters if self.usable else ()):
                path = rp.path(drafter)
                self.run[i, a:a + n], self.conf[i, a:a + n] = path.run, path.confidence
                head = path.rollouts.head(n)
                if head is not None:
                    self.head[i, p], self.has_head[i, p] = head[0], True
                for d in range(n + 1):
                    rollout = path.rollouts.get(d)
                    if rollout is None:
                        continue
                    if not rollout[0]:
                        self.usable = False
                        break
                    self.rollout_at[i, a + d], self.rollout_len[i, a + d] = len(flat), len(rollout[0])
                    flat += rollout[0]
        self.rollout_conf = np.array(flat)
        self.arrays = (self.start, self.run, self.conf, self.rollout_at, self.rollout_len, self.rollout_conf,
                       self.head, self.has_head)


@njit(cache=True)
def confidence(paths: tuple, i: int, p: int, n: int, c: int, j: int) -> tuple[float, bool]:
    """Drafter i's confidence at the j-th (1-based) token of a run from position c of prompt p
    (``n`` positions), and whether the read is a rollout overrun (module docstring)."""
    start, run, conf, rollout_at, rollout_len, rollout_conf, head, has_head = paths
    a = start[p]
    d = c + run[i, a + c]  # the run's first rejected position (n when the run reaches the end)
    t = c + j - 1  # the token's position
    if t <= d and t < n:  # on the true path
        return conf[i, a + t], False
    if t == n and d == n:  # past the path's end: the tail's step 0, else the last position's again
        if has_head[i, p]:
            return head[i, p], False
        return conf[i, a + n - 1], True
    length = rollout_len[i, a + d]
    if length < 0:  # no rollout: teacher-forced signals at the next positions, the last one repeated
        return conf[i, a + min(t, n - 1)], False
    step = t - d - 1
    if step < length:
        return rollout_conf[rollout_at[i, a + d] + step], False
    return rollout_conf[rollout_at[i, a + d] + length - 1], True  # past the recorded rollout

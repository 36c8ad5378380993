"""How many of a run's priced forwards were priced past what was measured, and by which rule.

Every executor prices a forward by reading a row of the simulator's
:class:`~simlab.latency.grid.LatencyGrid` at a context length; the grid tabulates beside each row
the rule bits of its prices (:meth:`~simlab.latency.grid.LatencyGrid.codes`,
:mod:`simlab.latency.coverage`). Counting therefore needs only the forwards a run priced, as
arrays of (size, context): the closed-form replays have them already (they price rounds from
such arrays after deciding them), and the SimPy executor notes them in a :class:`ForwardLog` as
it books them — one list append per round, no lookup — and counts them once at the end. No
price is read or changed here.

A priced forward is one latency-model figure the run's times add: each draft step (a draft
run of k tokens is k steps; the first one's catch-up, where it feeds more than one token, is
part of it), each target forward (a verification, a plain step, a tree's verification), each
tree level's draft forward, each exit head of a shadow read, and each plain step of the
target-alone decoding the speedup divides by (:func:`baseline`). Prompt lookups are priced by
the policy's own cost, not by the latency model, and are not counted.
"""

from __future__ import annotations

from array import array

import numpy as np

from simlab.latency.grid import LatencyGrid
from simlab.latency.priced import (
    Extrapolated,
    draft_runs,
    forwards,
    rules_text,
    runs,
    shadows,
    tree_drafts,
    verifications,
)

# what the executors count with, from here (simlab.latency.priced holds them, below the serving engine too)
__all__ = ["Extrapolated", "ForwardLog", "baseline", "draft_runs", "forwards", "rules_text", "shadows", "tree_drafts",
           "verifications"]


def baseline(out: Extrapolated, grid: LatencyGrid, prompt_lens, tokens) -> None:
    """Add the target-alone decoding of each prompt's ``tokens[i]`` tokens: one plain step at each
    context after the prompt's (:func:`~simlab.sim.executor.ad_seconds`)."""
    runs(out, grid, "target_step", 1, np.asarray(prompt_lens, dtype=np.int64) + 1, tokens)


class ForwardLog:
    """The forwards the SimPy executor booked, noted as it books them (one append a round, into
    flat integer arrays) and counted at the end (:meth:`count`)."""

    STRIDE = 1 << 32  # a verification's size and context in one int

    def __init__(self) -> None:
        self.verify = array("q")  # serial verifications (solo): size * STRIDE + context
        self.drafts = array("q")  # serial draft runs: layer, context, steps, fed
        self.parallel = array("q")  # parallel rounds: draft start, steps, fed, verify size, context
        self.trees: list[tuple[int, tuple[int, ...], int, int]] = []  # (context, widths, fed, verify size)
        self.shadows = array("q")  # rows of each priced shadow read

    def count(self, grid: LatencyGrid, corun: bool, plain: bool, heads: int) -> Extrapolated:
        """``corun``: parallel rounds co-run (one device); ``plain``: a one-token verification is
        the plain step (a policy that runs no draft model); ``heads``: exit heads per shadow read."""
        out = Extrapolated()
        v = np.frombuffer(self.verify, dtype=np.int64)
        verifications(out, grid, v // self.STRIDE, v % self.STRIDE, plain)
        layer, ctx, steps, fed = np.frombuffer(self.drafts, dtype=np.int64).reshape(-1, 4).T
        draft_runs(out, grid, ctx, steps, layer, feed=fed)
        start, steps, fed, size, ctx = np.frombuffer(self.parallel, dtype=np.int64).reshape(-1, 5).T
        draft_runs(out, grid, start, steps, corun=corun, feed=fed)
        forwards(out, grid, "target_forward", size, ctx, corun)
        for ctx, widths, fed, size in self.trees:
            if widths:
                tree_drafts(out, grid, [ctx], [widths], feed=[fed])
            forwards(out, grid, "target_tree", [size], [ctx])
        shadows(out, grid, np.frombuffer(self.shadows, dtype=np.int64), heads)
        return out

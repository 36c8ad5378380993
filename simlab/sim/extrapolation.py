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

import numpy as np

from simlab.latency.grid import LatencyGrid
from simlab.latency.priced import (
    Extrapolated,
    draft_runs,
    each_step,
    forwards,
    rules_text,
    shadows,
    tree_drafts,
    verifications,
)

# what the executors count with, from here (simlab.latency.priced holds them, below the serving engine too)
__all__ = ["Extrapolated", "ForwardLog", "baseline", "draft_runs", "forwards", "rules_text", "shadows", "tree_drafts",
           "verifications"]


def baseline(grid: LatencyGrid, prompt_lens, tokens) -> np.ndarray:
    """The rule bits of the target-alone decoding of each prompt's ``tokens[i]`` tokens, one
    plain step at each context after the prompt's (:func:`~simlab.sim.executor.ad_seconds`)."""
    steps = each_step(np.asarray(prompt_lens, dtype=np.int64) + 1, np.asarray(tokens, dtype=np.int64))
    return grid.codes_at("target_step", 1, steps) if grid.measured is not None else np.zeros(len(steps), np.uint8)


class ForwardLog:
    """The forwards the SimPy executor booked, noted as it books them (one append a round) and
    counted at the end (:meth:`count`)."""

    def __init__(self) -> None:
        self.verify: list[int] = []  # serial verifications (solo): size * STRIDE + context
        self.drafts: list[tuple[int, int, int, int]] = []  # serial draft runs: (layer, context, steps, fed)
        self.parallel: list[tuple[int, int, int, int, int]] = []  # (draft start, steps, fed, verify size, context)
        self.trees: list[tuple[int, tuple[int, ...], int, int]] = []  # (context, widths, fed, verify size)
        self.shadows: list[int] = []  # rows of each priced shadow read

    STRIDE = 1 << 32  # a verification's size and context in one int

    def count(self, grid: LatencyGrid, corun: bool, plain: bool, heads: int) -> Extrapolated:
        """``corun``: parallel rounds co-run (one device); ``plain``: a one-token verification is
        the plain step (a policy that runs no draft model); ``heads``: exit heads per shadow read."""
        out = Extrapolated()
        v = np.asarray(self.verify, dtype=np.int64)
        out.add(verifications(grid, v // self.STRIDE, v % self.STRIDE, plain))
        if self.drafts:
            layer, ctx, steps, fed = np.asarray(self.drafts, dtype=np.int64).T
            out.add(draft_runs(grid, ctx, steps, layer, feed=fed))
        if self.parallel:
            start, steps, fed, size, ctx = np.asarray(self.parallel, dtype=np.int64).T
            out.add(draft_runs(grid, start, steps, corun=corun, feed=fed))
            out.add(forwards(grid, "target_forward", size, ctx, corun))
        for ctx, widths, fed, size in self.trees:
            if widths:
                out.add(tree_drafts(grid, [ctx], [widths], feed=[fed]))
            out.add(forwards(grid, "target_tree", [size], [ctx]))
        if self.shadows:
            out.add(shadows(grid, self.shadows, heads))
        return out

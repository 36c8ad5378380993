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

from dataclasses import dataclass, field

import numpy as np

from simlab.latency.coverage import RULES
from simlab.latency.grid import LatencyGrid
from simlab.trace.schema import NO_LAYER


@dataclass
class Extrapolated:
    """Priced forwards of a run, those priced past what was measured, and per rule how many."""

    priced: int = 0
    forwards: int = 0  # priced past the measured range by at least one rule
    by_rule: dict[str, int] = field(default_factory=dict)

    def add(self, codes: np.ndarray) -> "Extrapolated":
        """Count forwards whose rule bits are ``codes`` (one entry per forward)."""
        codes = np.asarray(codes, dtype=np.uint8).ravel()
        self.priced += codes.size
        flagged = codes[codes != 0]
        self.forwards += flagged.size
        for bit, (name, _) in RULES.items():
            n = int(np.count_nonzero(flagged & bit))
            if n:
                self.by_rule[name] = self.by_rule.get(name, 0) + n
        return self

    def __iadd__(self, other: "Extrapolated") -> "Extrapolated":
        self.priced += other.priced
        self.forwards += other.forwards
        for name, n in other.by_rule.items():
            self.by_rule[name] = self.by_rule.get(name, 0) + n
        return self

    def to_dict(self) -> dict:
        """The fields runs report (summary ``extra``, ``--json``)."""
        return {"priced_forwards": self.priced, "extrapolated_forwards": self.forwards,
                "extrapolated_by_rule": {name: self.by_rule[name] for name, _ in RULES.values() if name in self.by_rule}}


def rules_text(by_rule: dict[str, int] | None) -> str:
    """``k=12,context=3``: a run's ``extrapolated_by_rule`` as one table cell ("" for none)."""
    return ",".join(f"{rule}={n}" for rule, n in (by_rule or {}).items())


def forwards(grid: LatencyGrid, op: str, sizes, ctx, corun: bool = False) -> np.ndarray:
    """The rule bits of one ``op`` forward of ``sizes[i]`` at context ``ctx[i]`` each."""
    sizes, ctx = np.asarray(sizes, dtype=np.int64), np.asarray(ctx, dtype=np.int64)
    out = np.zeros(ctx.shape, np.uint8)
    if grid.measured is None:
        return out
    for size in np.unique(sizes).tolist():
        at = sizes == size
        out[at] = grid.codes_at(op, size, ctx[at], corun)
    return out


def verifications(grid: LatencyGrid, sizes, ctx, plain: bool = False) -> np.ndarray:
    """The rule bits of serial verifications over ``sizes[i]`` tokens at ``ctx[i]``; ``plain``:
    a one-token one is the target's plain step (a policy that runs no draft model)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    bits = forwards(grid, "target_forward", sizes, ctx)
    if plain:
        one = sizes == 1
        bits[one] = forwards(grid, "target_step", sizes[one], np.asarray(ctx, dtype=np.int64)[one])
    return bits


def _each_step(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """start[i], start[i] + 1, .. start[i] + count[i] - 1, run after run."""
    count = np.maximum(count, 0)
    first = np.cumsum(count) - count
    return np.repeat(start, count) + np.arange(int(count.sum())) - np.repeat(first, count)


def draft_runs(grid: LatencyGrid, ctx, count, layers=NO_LAYER, corun: bool = False, feed=None) -> np.ndarray:
    """The rule bits of every step of draft runs of ``count[i]`` steps from ``ctx[i]`` (exit
    layer ``layers[i]``, or one for all; runs of one layer keep their order), the first step's
    with its catch-up's where it feeds ``feed[i]`` > 1 tokens
    (:meth:`~simlab.latency.grid.LatencyGrid.catch_up_seconds`: part of that step's price)."""
    ctx, count = np.asarray(ctx, dtype=np.int64), np.maximum(np.asarray(count, dtype=np.int64), 0)
    layers = np.broadcast_to(np.asarray(layers, dtype=np.int64), ctx.shape)
    if grid.measured is None:
        return np.zeros(int(count.sum()), np.uint8)
    parts = [np.zeros(0, np.uint8)]
    for layer in np.unique(layers).tolist():
        at = layers == layer
        n = count[at]
        bits = grid.codes_at("draft_step", layer, _each_step(ctx[at], n), corun)
        if feed is not None:
            fed = np.asarray(feed, dtype=np.int64)[at]
            wide = (fed > 1) & (n > 0)
            first = (np.cumsum(n) - n)[wide]
            for tokens in np.unique(fed[wide]).tolist():
                some = fed[wide] == tokens
                bits[first[some]] |= grid.codes_at("catch_up", tokens, ctx[at][wide][some], corun, layer)
        parts.append(bits)
    return np.concatenate(parts)


def tree_drafts(grid: LatencyGrid, ctx, widths, levels=None, feed=None) -> np.ndarray:
    """The rule bits of a tree round's draft forwards, one per level d < ``levels[i]`` over
    ``widths[i, d]`` nodes at context ``ctx[i] + d``: the level's step's and, over more than one
    node, its tree factor's (:meth:`~simlab.latency.grid.LatencyGrid.tree_draft_seconds`)."""
    ctx, widths = np.asarray(ctx, dtype=np.int64), np.asarray(widths, dtype=np.int64).reshape(len(ctx), -1)
    levels = np.full(len(ctx), widths.shape[1]) if levels is None else np.asarray(levels, dtype=np.int64)
    bits = draft_runs(grid, ctx, levels, feed=feed)
    first = np.cumsum(levels) - levels
    for d in range(widths.shape[1]):
        wide = (widths[:, d] > 1) & (d < levels)
        bits[first[wide] + d] |= forwards(grid, "draft_tree", widths[wide, d], ctx[wide] + d)
    return bits


def shadows(grid: LatencyGrid, rows, heads: int) -> np.ndarray:
    """The rule bits of ``heads`` exit heads per shadow read over ``rows[i]`` rows."""
    if not heads:
        return np.zeros(0, np.uint8)
    rows = np.asarray(rows, dtype=np.int64)
    return np.repeat(forwards(grid, "exit_head", rows, np.zeros(len(rows), np.int64)), heads)


def baseline(grid: LatencyGrid, prompt_lens, tokens) -> np.ndarray:
    """The rule bits of the target-alone decoding of each prompt's ``tokens[i]`` tokens, one
    plain step at each context after the prompt's (:func:`~simlab.sim.executor.ad_seconds`)."""
    steps = _each_step(np.asarray(prompt_lens, dtype=np.int64) + 1, np.asarray(tokens, dtype=np.int64))
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

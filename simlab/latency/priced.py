"""Counting priced forwards by the rules that priced them past what was measured.

:class:`Extrapolated` tallies forwards from their rule bits (:mod:`simlab.latency.coverage`); the
functions below give those bits for arrays of forwards a
:class:`~simlab.latency.grid.LatencyGrid` prices — forwards of one operation, draft runs (the
first step's catch-up included), a tree round's draft levels, shadow reads' exit heads — read from
the grid's tabulated bits (:meth:`~simlab.latency.grid.LatencyGrid.codes`), never from a price.
The simulator's executors (:mod:`simlab.sim.extrapolation`) and the serving engine's batch prices
(:mod:`simlab.latency.batch`) count with them.
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

    def add_one(self, bits: int) -> None:
        """Count one forward whose rule bits are ``bits`` (a serving engine's, priced one at a time)."""
        self.priced += 1
        if bits:
            self.forwards += 1
            for bit, (name, _) in RULES.items():
                if bits & bit:
                    self.by_rule[name] = self.by_rule.get(name, 0) + 1

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


def each_step(start: np.ndarray, count: np.ndarray) -> np.ndarray:
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
        bits = grid.codes_at("draft_step", layer, each_step(ctx[at], n), corun)
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

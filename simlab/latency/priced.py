"""Counting priced forwards by the rules that priced them past what was measured.

:class:`Extrapolated` tallies forwards from their rule bits (:mod:`simlab.latency.coverage`); the
functions below add arrays of forwards that a :class:`~simlab.latency.grid.LatencyGrid` prices to
one — forwards of one operation, runs of draft steps (the first step's catch-up included), a tree
round's draft levels, shadow reads' exit heads, the target-alone baseline's steps — reading the
grid's tabulated bits (:meth:`~simlab.latency.grid.LatencyGrid.codes`), never a price. A run of
steps is counted from the row's cumulative bit counts
(:meth:`~simlab.latency.grid.LatencyGrid.code_sums`) in one subtraction, and a row with no bit
set costs a sum, so counting stays a small share of a replay that prices the same rounds. The
simulator's executors (:mod:`simlab.sim.extrapolation`) and the serving engine
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

    def tally(self, planes) -> None:
        """Add counts of extrapolated forwards: ``planes`` = (any rule, then each rule of
        :data:`~simlab.latency.coverage.RULES` in order), as :func:`planes` gives them."""
        planes = [int(n) for n in planes]
        self.forwards += planes[0]
        for (name, _), n in zip(RULES.values(), planes[1:]):
            if n:
                self.by_rule[name] = self.by_rule.get(name, 0) + n

    def add(self, codes) -> "Extrapolated":
        """Count forwards whose rule bits are ``codes`` (one entry per forward)."""
        codes = np.asarray(codes, dtype=np.uint8).ravel()
        self.priced += codes.size
        self.tally(planes(codes))
        return self

    def add_one(self, bits: int) -> None:
        """Count one forward whose rule bits are ``bits`` (a serving engine's, priced one at a time)."""
        self.priced += 1
        if bits:
            self.tally([1, *(bool(bits & bit) for bit in RULES)])

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


def planes(codes: np.ndarray) -> np.ndarray:
    """How many of ``codes`` have any rule bit set, then how many each rule's."""
    codes = np.asarray(codes, dtype=np.uint8)
    return np.array([np.count_nonzero(codes), *(np.count_nonzero(codes & bit) for bit in RULES)])


def rules_text(by_rule: dict[str, int] | None) -> str:
    """``k=12,context=3``: a run's ``extrapolated_by_rule`` as one table cell ("" for none)."""
    return ",".join(f"{rule}={n}" for rule, n in (by_rule or {}).items())


def _ints(values, shape=None) -> np.ndarray:
    out = np.asarray(values, dtype=np.int64)
    return out if shape is None else np.broadcast_to(out, shape)


def each_step(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """start[i], start[i] + 1, .. start[i] + count[i] - 1, run after run."""
    count = np.maximum(count, 0)
    first = np.cumsum(count) - count
    return np.repeat(start, count) + np.arange(int(count.sum())) - np.repeat(first, count)


def runs(out: Extrapolated, grid: LatencyGrid, op: str, size: int, start, count, corun: bool = False,
         layer: int = NO_LAYER) -> None:
    """Add ``count[i]`` consecutive forwards of one row of the grid (``op`` at ``size``) from
    context ``start[i]``: a draft run's steps, a baseline's plain steps, or single forwards."""
    start, count = _ints(start), np.maximum(_ints(count), 0)
    out.priced += int(count.sum())
    if grid.measured is None or not len(start):
        return
    end = start + count
    inside = end <= grid.max_context + 1
    sums = grid.code_sums(op, size, corun, layer)
    if sums is not None and inside.any():  # sum of sums[:, end] - sums[:, start], as a histogram of both
        n = sums.shape[1]
        runs_at = np.bincount(end[inside], minlength=n) - np.bincount(start[inside], minlength=n)
        out.tally(sums @ runs_at)
    if not inside.all():  # runs past the grid: the model's own bits, step by step
        out.tally(planes(grid.codes_at(op, size, each_step(start[~inside], count[~inside]), corun, layer)))


def _more(out: Extrapolated, grid: LatencyGrid, ctx: np.ndarray, more: np.ndarray, layer: int, corun: bool) -> None:
    """Forwards counted as draft steps at ``ctx`` whose price also reads figures with the bits
    ``more`` (a catch-up, a tree level's factor): what those add to the counts."""
    some = more != 0
    if some.any():
        base = grid.codes_at("draft_step", layer, ctx[some], corun)
        out.tally(planes(base | more[some]) - planes(base))


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values, ascending: ``np.unique`` imports ``numpy.ma`` (some 20 ms of a
    command's start-up) for what a set of a few values does."""
    return sorted(set(values.tolist()))


def codes_of(grid: LatencyGrid, op: str, sizes, ctx, corun: bool = False) -> np.ndarray:
    """The rule bits of one ``op`` forward of ``sizes[i]`` at context ``ctx[i]`` each."""
    sizes, ctx = _ints(sizes), _ints(ctx)
    bits = np.zeros(ctx.shape, np.uint8)
    if grid.measured is not None:
        for size in _distinct(sizes):
            at = sizes == size
            bits[at] = grid.codes_at(op, size, ctx[at], corun)
    return bits


def forwards(out: Extrapolated, grid: LatencyGrid, op: str, sizes, ctx, corun: bool = False) -> None:
    """Add one ``op`` forward of ``sizes[i]`` at context ``ctx[i]`` each."""
    sizes, ctx = _ints(sizes), _ints(ctx)
    order = np.argsort(sizes, kind="stable")
    sizes, ctx = sizes[order], ctx[order]
    values, first = np.unique(sizes, return_index=True)
    for size, a, b in zip(values.tolist(), first.tolist(), [*first[1:].tolist(), len(sizes)]):
        runs(out, grid, op, size, ctx[a:b], np.ones(b - a, np.int64), corun)


def verifications(out: Extrapolated, grid: LatencyGrid, sizes, ctx, plain: bool = False) -> None:
    """Add serial verifications over ``sizes[i]`` tokens at ``ctx[i]``; ``plain``: a one-token
    one is the target's plain step (a policy that runs no draft model)."""
    sizes, ctx = _ints(sizes), _ints(ctx)
    one = (sizes == 1) if plain else np.zeros(len(sizes), bool)
    forwards(out, grid, "target_forward", sizes[~one], ctx[~one])
    forwards(out, grid, "target_step", sizes[one], ctx[one])


def draft_runs(out: Extrapolated, grid: LatencyGrid, ctx, count, layers=NO_LAYER, corun: bool = False,
               feed=None) -> None:
    """Add every step of draft runs of ``count[i]`` steps from ``ctx[i]`` (exit layer
    ``layers[i]``, or one for all), the first step's catch-up included where it feeds ``feed[i]``
    > 1 tokens (:meth:`~simlab.latency.grid.LatencyGrid.catch_up_seconds`: part of that step's
    price)."""
    ctx, count = _ints(ctx), np.maximum(_ints(count), 0)
    layers = _ints(layers, ctx.shape)
    for layer in _distinct(layers):
        at = layers == layer
        runs(out, grid, "draft_step", layer, ctx[at], count[at], corun)
        if feed is not None:
            _more(out, grid, ctx[at], catch_ups(grid, ctx[at], _ints(feed)[at] * (count[at] > 0), layer, corun),
                  layer, corun)


def catch_ups(grid: LatencyGrid, ctx: np.ndarray, feed: np.ndarray, layer: int = NO_LAYER,
              corun: bool = False) -> np.ndarray:
    """The rule bits of each round's catch-up at ``ctx`` feeding ``feed`` tokens (0: none)."""
    bits = np.zeros(ctx.shape, np.uint8)
    if grid.measured is not None:
        for tokens in _distinct(feed[feed > 1]):
            at = feed == tokens
            bits[at] = grid.codes_at("catch_up", tokens, ctx[at], corun, layer)
    return bits


def tree_drafts(out: Extrapolated, grid: LatencyGrid, ctx, widths, levels=None, feed=None) -> None:
    """Add a tree round's draft forwards, one per level d < ``levels[i]`` over ``widths[i, d]``
    nodes at context ``ctx[i] + d``: the level's draft step, its tree factor over more than one
    node, the first level's catch-up (:meth:`~simlab.latency.grid.LatencyGrid.tree_draft_seconds`)."""
    ctx, widths = _ints(ctx), _ints(widths).reshape(len(ctx), -1)
    levels = np.full(len(ctx), widths.shape[1]) if levels is None else _ints(levels)
    runs(out, grid, "draft_step", NO_LAYER, ctx, levels)
    first = np.zeros(len(ctx), np.uint8) if feed is None else catch_ups(grid, ctx, _ints(feed) * (levels > 0))
    for d in range(widths.shape[1]):
        wide = (widths[:, d] > 1) & (d < levels)
        more = first.copy() if d == 0 else np.zeros(len(ctx), np.uint8)
        more[wide] |= codes_of(grid, "draft_tree", widths[wide, d], ctx[wide] + d)
        _more(out, grid, ctx + d, more, NO_LAYER, False)


def shadows(out: Extrapolated, grid: LatencyGrid, rows, heads: int) -> None:
    """Add ``heads`` exit heads per shadow read over ``rows[i]`` rows."""
    if heads:
        rows = _ints(rows)
        out.add(np.repeat(codes_of(grid, "exit_head", rows, np.zeros(len(rows), np.int64)), heads))

"""Where a latency model's prices were measured, and by which rule it prices elsewhere.

A table (:class:`~simlab.latency.model.TableLatency`) interpolates between measured points and
holds or extends past them; a fit (:class:`~simlab.latency.fitted.FittedLatency`) continues its
surface. Both answer every question, so a trace probed at k = 1 only still prices a 6-token
verification (as the 1-token one) and nothing says so unless it is counted. This module says, for
each forward a model prices, which of its axes lie outside what was measured — a set of
:data:`RULES`, one bit each, so a forward can be past the measured range on several axes:

- ``k``: the forward's size (new tokens of a target forward, rows of an exit head) is outside the
  measured sizes: below the smallest, the smallest's figure; past the largest, the last segment's
  slope (one measured size: its figure);
- ``context``: the context length is outside the range measured for the sizes the price reads
  (a table holds the nearest end; a fit holds below its smallest context and extends above);
- ``tree_size``: a tree forward's node count is outside the probed tree sizes (the tree/chain
  ratio of the nearest probed size);
- ``layer``: an exit layer outside the measured ones (the nearest segment extended);
- ``batch``: a batch of sequences priced past the measured batch sizes, or from batch-1
  figures (:mod:`simlab.latency.batch`).

Nothing here changes a price: a model's ``coverage(op, size, ctx, corun)`` is read beside its
price, and :class:`~simlab.latency.grid.LatencyGrid` tabulates it as it tabulates prices. A model
without ``coverage`` (a roofline profile: priced from first principles, not from measurements)
flags nothing. A co-running price that stands in with a solo figure is reported on its own
(``corun_latency``), not here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.trace.schema import NO_LAYER

K, CONTEXT, TREE_SIZE, LAYER, BATCH = 1, 2, 4, 8, 16
# bit -> (name in JSON and tables, what the rule did)
RULES: dict[int, tuple[str, str]] = {
    K: ("k", "forward size outside the measured k (nearest k held, or the last slope extended)"),
    CONTEXT: ("context", "context outside the measured contexts (nearest held, or a fit continued)"),
    TREE_SIZE: ("tree_size", "tree size outside the probed tree sizes (nearest tree/chain ratio held)"),
    LAYER: ("layer", "exit layer outside the measured layers (last segment extended)"),
    BATCH: ("batch", "batch size outside the measured batch sizes (extended, or from batch-1 figures)"),
}


def rule_names(code: int) -> list[str]:
    """The names of the rules whose bits ``code`` holds."""
    return [name for bit, (name, _) in RULES.items() if code & bit]


@dataclass(frozen=True)
class Span:
    """Where one series (one operation, solo or co-running) was measured: each measured size
    with the range of contexts measured at it."""

    ranges: dict[int, tuple[int, int]]

    @classmethod
    def of_curves(cls, curves: dict) -> "Span | None":
        """The span of ``{size: Curve}`` (None where there are none)."""
        if not curves:
            return None
        return cls({int(k): (c.context_len[0], c.context_len[-1]) for k, c in curves.items()})

    def codes(self, size: int, ctx, size_rule: int):
        """The rule bits of a price at ``size`` and contexts ``ctx`` (a number or an array): the
        size rule outside the measured sizes; the context rule outside the contexts measured at
        every size the price reads (the size itself, the two around it, or the nearest ones)."""
        sizes = sorted(self.ranges)
        code = 0
        if size in self.ranges:
            used = [size]
        elif size < sizes[0]:
            used, code = sizes[:1], size_rule
        elif size > sizes[-1]:
            used, code = sizes[-2:], size_rule  # the last segment's slope reads both ends
        else:
            i = int(np.searchsorted(sizes, size)) - 1
            used = sizes[i:i + 2]
        lo = max(self.ranges[s][0] for s in used)
        hi = min(self.ranges[s][1] for s in used)
        return code | np.where((np.asarray(ctx) < lo) | (np.asarray(ctx) > hi), CONTEXT, 0)


def coverage_of(model, op: str, size: int, ctx, corun: bool = False):
    """The rule bits of ``model``'s price of ``op`` (the grid's operation names) at ``size`` and
    contexts ``ctx``, read from ``model.span(series, corun)`` the way the model prices:
    ``draft_step`` (size: the exit layer, or NO_LAYER), ``target_forward``, ``target_step``,
    ``target_tree`` (its chain's bits too where ``model.tree_on_chain``: a table corrects the
    chain price), ``draft_tree`` (the factor: the target's growth and the draft's step),
    ``exit_head`` (rows, no context term), ``target_prefill`` / ``draft_prefill`` (None where
    prefills were not timed: :mod:`simlab.latency.batch` prices them from other forwards)."""
    span = model.span
    if op == "draft_step":
        layer = size
        if layer == NO_LAYER and span("draft", False) is None:
            layer = model.draft_layer
        if layer == NO_LAYER:
            return span("draft", corun).codes(1, ctx, 0)
        return span("exit", corun).codes(layer, ctx, LAYER)
    if op == "target_forward":
        return span("target", corun).codes(size, ctx, K)
    if op == "target_step":
        plain = span("target_step", False)
        return coverage_of(model, "target_forward", 1, ctx) if plain is None else plain.codes(1, ctx, K)
    if op == "target_tree":
        chain = coverage_of(model, "target_forward", size, ctx, corun)
        tree = span("target_tree", corun)
        if tree is None:
            return chain
        own = tree.codes(size, ctx, TREE_SIZE)
        return own | chain if model.tree_on_chain else own
    if op == "draft_tree":
        chain = coverage_of(model, "target_forward", size, ctx, corun) | coverage_of(model, "target_forward", 1, ctx,
                                                                                     corun)
        tree = span("draft_tree", corun)
        if tree is None:
            return chain
        own = tree.codes(size, ctx, TREE_SIZE) | coverage_of(model, "draft_step", NO_LAYER, ctx, corun)
        return own | chain if model.tree_on_chain else own
    if op == "exit_head":
        heads = span("exit_head", False)
        return 0 if heads is None else int(heads.codes(size, 0, K))
    if op in ("target_prefill", "draft_prefill"):  # where prefills were timed (else: None, priced otherwise)
        timed = span(op, False)
        return None if timed is None else timed.codes(size, ctx, K)
    raise ValueError(f"unknown operation {op!r}")

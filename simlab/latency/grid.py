"""A latency model tabulated over every context length a run can meet.

The simulator asks for durations millions of times per second; interpolating a table on each
call would dominate its run time. :class:`LatencyGrid` evaluates the wrapped model once per
context length (vectorised) and answers from lists afterwards. It is itself a latency model,
so policies and the simulator can share one grid and price rounds identically — in
particular the oracle's dynamic programme and the executor use the same
:meth:`draft_seconds`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simlab.common.errors import SimlabError
from simlab.latency.coverage import RULES, coverage_of
from simlab.latency.model import LatencyModel
from simlab.trace.schema import MAX_FORWARD_SECONDS, NO_LAYER


def suffix_least(rows: list[list[float]]) -> tuple[list[list[float]], list[list[int]]]:
    """For each row, the least of row[i:] and the first index attaining it, for every i."""
    least, first = [], []
    for row in rows:
        top = len(row) - 1
        m, a = row[top], top
        mins, args = [0.0] * (top + 1), [0] * (top + 1)
        for k in range(top, -1, -1):
            if row[k] <= m:
                m, a = row[k], k
            mins[k], args[k] = m, a
        least.append(mins)
        first.append(args)
    return least, first


class LatencyGrid:
    """Durations of ``model`` for context lengths 0..``max_context`` (beyond that: the model)."""

    def __init__(self, model: LatencyModel, max_context: int):
        self.model = model
        self.name = model.name
        self.max_context = int(max_context)
        self._ctx = np.arange(self.max_context + 1)
        # (operation, corun) -> {size: row over context length}
        self._rows: dict[tuple[str, bool], dict[int, list[float]]] = {}
        self._draft_cum: dict[tuple[int, bool], list[float]] = {}
        self._serial: dict[int, tuple] = {}  # top_k -> serial round table (_serial_table)
        self._heads: dict[int, float | None] = {}  # rows -> seconds of one exit head (None: not priced)
        # the model that says where it was measured (simlab.latency.coverage), None if it does not
        inner = model.measured if isinstance(model, LatencyGrid) else model
        self.measured = inner if hasattr(inner, "span") else None
        self._codes: dict[tuple, np.ndarray] = {}  # (op, size, corun, layer) -> rule bits by context
        self._sums: dict[tuple, np.ndarray | None] = {}  # the same key -> cumulative counts of those bits

    def _column(self, fn, what: str, unit: str = " s") -> np.ndarray:
        """``fn`` over every context length: one call on the array if the model takes arrays
        (the table model does), else one call per context length. A duration no device could
        take (a profile with a negative coefficient, a corrupt one) is the user's input to fix,
        so it is refused here, once, rather than met by the executor as time running backwards."""
        try:
            out = np.asarray(fn(self._ctx), dtype=float)
        except (TypeError, ValueError):
            out = None
        if out is None or out.shape != self._ctx.shape:
            out = np.fromiter((fn(int(c)) for c in self._ctx), dtype=float, count=len(self._ctx))
        bad = ~(np.isfinite(out) & (out > 0) & (out <= MAX_FORWARD_SECONDS))
        if bad.any():
            c = int(np.flatnonzero(bad)[0])
            raise SimlabError(f"latency model {self.name!r} gives {out[c]:g}{unit} for {what} at context {c}; a duration "
                              f"must be positive and at most {MAX_FORWARD_SECONDS:g} s (check the profile's coefficients)")
        return out

    def _row(self, op: str, size: int, corun: bool, fn, what: str, unit: str = " s") -> list[float]:
        rows = self._rows.setdefault((op, corun), {})
        row = rows.get(size)
        if row is None:
            row = rows[size] = self._column(fn, what, unit).tolist()
        return row

    def target_row(self, k: int, corun: bool = False) -> list[float]:
        """Seconds of a k-token target forward, indexed by context length."""
        return self._row("target_forward", k, corun, lambda c: self.model.target_forward(k, c, corun),
                         f"a {k}-token target forward")

    def target_rows(self, corun: bool = False) -> dict[int, list[float]]:
        """The rows tabulated so far, by k (filled by :meth:`target_row`); for hot loops."""
        return self._rows.setdefault(("target_forward", corun), {})

    def target_step_row(self) -> list[float]:
        """Seconds of the target's plain decoding step (the model's ``target_step``), by context:
        what autoregressive decoding pays per token."""
        return self._row("target_step", 1, False, self.model.target_step, "the target's plain decoding step")

    def target_tree_row(self, k: int, corun: bool = False) -> list[float]:
        """Seconds of a tree verification over k tokens (the model's ``target_tree``), by context."""
        return self._row("target_tree", k, corun, lambda c: self.model.target_tree(k, c, corun),
                         f"a {k}-token tree verification")

    def draft_tree_row(self, w: int, corun: bool = False) -> list[float]:
        """A draft forward over w tree nodes in draft steps (the model's ``draft_tree_factor``), by context."""
        return self._row("draft_tree", w, corun, lambda c: self.model.draft_tree_factor(w, c, corun),
                         f"the draft's {w}-node tree forward", " draft steps")

    def draft_cumulative(self, layer: int = NO_LAYER, corun: bool = False) -> list[float]:
        """cum[c] = seconds of draft steps at context 0..c-1: k steps from c cost cum[c+k] - cum[c]."""
        return self._cum(layer, corun)

    def _cum(self, layer: int, corun: bool) -> list[float]:
        key = (layer, corun)
        cum = self._draft_cum.get(key)
        if cum is None:
            steps = self._column(lambda c: self.model.draft_step(c, layer, corun), "a draft step")
            cum = np.concatenate([[0.0], np.cumsum(steps)]).tolist()
            self._draft_cum[key] = cum
        return cum

    def serial_rounds(self, first: int, count: int, top_k: int) -> list[list[float]]:
        """For each context c in ``first..first+count-1``, the seconds of a serial round drafting
        k = 0..``top_k`` tokens from c: ``draft_seconds(c, k) + target_forward(k + 1, c)``
        (a planner like the oracle asks for every c and k; the same differences and sums of the
        same floats as the scalar methods, so bit for bit equal). Within the grid the rows are
        tabulated once for every context and shared: callers must not change them."""
        if first + count - 1 + top_k > self.max_context:  # past the grid: the scalar methods
            return [[self.draft_seconds(c, k) + self.target_forward(k + 1, c) for k in range(top_k + 1)]
                    for c in range(first, first + count)]
        return self._serial_table(top_k)[0][first : first + count]

    def serial_round_tails(self, first: int, count: int, top_k: int) -> tuple[list[list[float]], list[list[int]]]:
        """For each row of :meth:`serial_rounds`: the least round time over k = i..``top_k`` and
        the first k attaining it, for i = 0..``top_k`` (a planner's best round that drafts at
        least i tokens, looked up rather than searched for every context)."""
        if first + count - 1 + top_k > self.max_context:
            return suffix_least(self.serial_rounds(first, count, top_k))
        _, least, first_k = self._serial_table(top_k)
        return least[first : first + count], first_k[first : first + count]

    def _serial_table(self, top_k: int) -> tuple[list[list[float]], list[list[float]], list[list[int]]]:
        """:meth:`serial_rounds` and :meth:`serial_round_tails` for every context up to
        ``max_context - top_k``, computed once per ``top_k``."""
        table = self._serial.get(top_k)
        if table is None:
            cum = np.asarray(self._cum(NO_LAYER, False))
            ctx = np.arange(self.max_context - top_k + 1)
            draft = cum[ctx[:, None] + np.arange(top_k + 1)] - cum[ctx][:, None]
            verify = np.stack([np.asarray(self.target_row(k + 1))[ctx] for k in range(top_k + 1)], axis=1)
            rows = (draft + verify).tolist()
            table = self._serial[top_k] = (rows, *suffix_least(rows))
        return table

    # -- where the prices were measured (simlab.latency.coverage) ----------------------------

    def codes(self, op: str, size: int, corun: bool = False, layer: int = NO_LAYER) -> np.ndarray:
        """The rule bits (:data:`~simlab.latency.coverage.RULES`) of a row's prices, by context
        length, tabulated once as the prices are: ``op`` one of
        :func:`~simlab.latency.coverage.coverage_of`'s operations (``draft_step``: ``size`` is the
        exit layer, or NO_LAYER), or ``catch_up`` (what a first draft forward feeding ``size``
        tokens adds, :meth:`catch_up_seconds`, of ``layer``). All 0 for a model that does not say
        where it was measured."""
        key = (op, size, corun, layer)
        row = self._codes.get(key)
        if row is None:
            row = self._codes[key] = self._code_column(op, size, self._ctx, corun, layer)
        return row

    def code_sums(self, op: str, size: int, corun: bool = False, layer: int = NO_LAYER) -> np.ndarray | None:
        """For :meth:`codes`' row: ``sums[p, c]`` = how many of the contexts 0..c-1 have any rule
        bit set (p = 0), then each rule's (p = 1..): forwards from c to c + n hold
        ``sums[:, c + n] - sums[:, c]``. None for a row with no bit set."""
        key = (op, size, corun, layer)
        if key not in self._sums:
            row = self.codes(op, size, corun, layer)
            planes = [row != 0, *((row & bit) != 0 for bit in RULES)]
            self._sums[key] = None if not row.any() else np.concatenate(
                [np.zeros((len(planes), 1), np.int64), np.cumsum(planes, axis=1)], axis=1)
        return self._sums[key]

    def codes_at(self, op: str, size: int, ctx: np.ndarray, corun: bool = False, layer: int = NO_LAYER) -> np.ndarray:
        """:meth:`codes` at the context lengths ``ctx`` (past the grid: the model's own)."""
        ctx = np.asarray(ctx, dtype=np.int64)
        inside = ctx <= self.max_context
        if inside.all():
            return self.codes(op, size, corun, layer)[ctx]
        out = np.empty(ctx.shape, np.uint8)
        out[inside] = self.codes(op, size, corun, layer)[ctx[inside]]
        out[~inside] = self._code_column(op, size, ctx[~inside], corun, layer)
        return out

    def _code_column(self, op: str, size: int, ctx: np.ndarray, corun: bool, layer: int) -> np.ndarray:
        model = self.measured
        if model is None or (op == "catch_up" and (size <= 1 or (
                layer == NO_LAYER and getattr(self.model, "verify_feeds_draft", False)))):
            return np.zeros(ctx.shape, np.uint8)
        if op == "catch_up":  # the step times the target's growth from 1 to size tokens
            bits = (coverage_of(model, "draft_step", layer, ctx, corun) | coverage_of(model, "target_forward", size, ctx, corun)
                    | coverage_of(model, "target_forward", 1, ctx, corun))
        else:
            bits = coverage_of(model, op, size, ctx, corun)
        return np.broadcast_to(np.asarray(bits, np.uint8), ctx.shape).copy()

    @property
    def prices_shadows(self) -> bool:
        """Whether the model prices exit heads (its trace was probed with an exit-head axis)."""
        return self.model.exit_head(1) is not None

    def shadow_seconds(self, rows: int, layers: int) -> float:
        """Time of a shadow read (DEL's shadow tokens): ``layers`` exit heads, one after another
        on the target, each over the ``rows`` positions a target forward settled; 0 where the
        model has no exit-head figures (:attr:`prices_shadows`)."""
        head = self.exit_head(rows)
        return 0.0 if head is None else layers * head

    # -- the LatencyModel protocol ----------------------------------------------------------

    def exit_head(self, rows: int) -> float | None:
        """The model's exit head over ``rows`` rows (None where it has none), checked as every
        duration the grid holds."""
        if rows not in self._heads:
            head = self.model.exit_head(rows)
            if head is not None and not (math.isfinite(head) and 0 < head <= MAX_FORWARD_SECONDS):
                raise SimlabError(f"latency model {self.name!r} gives {head:g} s for an exit head over {rows} rows; "
                                  f"a duration must be positive and at most {MAX_FORWARD_SECONDS:g} s")
            self._heads[rows] = head
        return self._heads[rows]

    def target_forward(self, k: int, context_len: int, corun: bool = False) -> float:
        if context_len > self.max_context:
            return self.model.target_forward(k, context_len, corun)
        return self.target_row(k, corun)[context_len]

    def target_step(self, context_len: int) -> float:
        if context_len > self.max_context:
            return self.model.target_step(context_len)
        return self.target_step_row()[context_len]

    def draft_step(self, context_len: int, layer: int = NO_LAYER, corun: bool = False) -> float:
        return self.draft_seconds(context_len, 1, layer, corun)

    def target_tree(self, k: int, context_len: int, corun: bool = False) -> float:
        if context_len > self.max_context:
            return self.model.target_tree(k, context_len, corun)
        return self.target_tree_row(k, corun)[context_len]

    def draft_tree_factor(self, w: int, context_len: int, corun: bool = False) -> float:
        if context_len > self.max_context:
            return self.model.draft_tree_factor(w, context_len, corun)
        return self.draft_tree_row(w, corun)[context_len]

    def tree_draft_seconds(self, context_len: int, widths: Sequence[int]) -> float:
        """Time of a tree's draft forwards, one per level, over ``widths[d]`` nodes at context
        ``context_len + d``: a forward over w nodes is a draft step times the model's
        ``draft_tree_factor`` (the probed expansion, or the target's k=w over k=1 cost where the
        draft's tree forwards were not probed: :mod:`simlab.latency.model`). Width-one levels
        are exactly :meth:`draft_seconds`, so a width-one tree is priced as a chain's drafts."""
        seconds = self.draft_seconds(context_len, len(widths))
        for d, w in enumerate(widths):
            if w > 1:
                ctx = context_len + d
                step = self.draft_seconds(ctx, 1)
                seconds += step * (self.draft_tree_factor(w, ctx) - 1.0)
        return seconds

    def catch_up_row(self, tokens: int) -> list[float]:
        """:meth:`catch_up_seconds` of the draft model at every context length, solo (the same
        floats, looked up by the executor's serial rounds: a round after a fully accepted one
        feeds two tokens)."""
        rows = self._rows.setdefault(("catch_up", False), {})
        row = rows.get(tokens)
        if row is None:
            row = rows[tokens] = [self.catch_up_seconds(c, tokens) for c in range(self.max_context + 1)]
        return row

    def catch_up_seconds(self, context_len: int, tokens: int, layer: int = NO_LAYER, corun: bool = False) -> float:
        """What a draft forward that feeds ``tokens`` tokens (what the draft's KV cache lacks at the
        start of a round: :mod:`simlab.sim.draft_cache`) costs beyond a one-token draft step at
        ``context_len``: the step times the target's growth from 1 to ``tokens`` tokens, less
        one (:func:`~simlab.latency.model.chain_factor`: a causal forward, not a tree-mask one,
        whose probed figures cost more on a CPU; never below one step). 0 for one token, and 0
        for the draft model when the measured verifications fed it too (``verify_feeds_draft``:
        llama.cpp's, whose draft cache then lacks only the round's last token)."""
        if tokens <= 1 or (layer == NO_LAYER and getattr(self.model, "verify_feeds_draft", False)):
            return 0.0
        step = self.draft_seconds(context_len, 1, layer, corun)
        growth = self.target_forward(tokens, context_len, corun) / self.target_forward(1, context_len, corun)
        return step * (max(growth, 1.0) - 1.0)

    def draft_seconds(self, context_len: int, k: int, layer: int = NO_LAYER, corun: bool = False) -> float:
        """Time of ``k`` consecutive draft steps from ``context_len`` (the draft's KV cache grows
        by one token per step)."""
        if context_len + k > self.max_context:
            return sum(self.model.draft_step(context_len + i, layer, corun) for i in range(k))
        cum = self._cum(layer, corun)
        return cum[context_len + k] - cum[context_len]

"""Forwards of a batch: B sequences at once, sequence i bringing k_i new tokens at context c_i.

A serving engine runs one forward for every request in its batch; what that forward costs is
the whole question of speculative decoding under load. Three sources, in this order:

- **Roofline profiles** (``kind: roofline``) price the batch from first principles: the weights
  are read once per forward, each sequence's KV cache is read, and compute scales with the
  batch's tokens (:func:`~simlab.latency.roofline.batch_ideal_seconds`); the framework's fixed
  overhead is paid once per forward. Not extrapolated.
- **Measured batches** (a trace probed with a batch axis, or a table/fitted profile made from
  one: the model's ``batches``): the forward of B sequences x k tokens at context c was timed
  for a few B (1, 2, 4, 8 by default). A batch is priced as a *padded* forward, the way a
  batched decoder without paged attention runs it (``simlab.live.batched``): every sequence
  brings as many tokens as the longest, ``k = max k_i``, at the longest context,
  ``c = max c_i``. Between measured batch sizes the price is linear in B; beyond the largest
  it extends the last segment's slope (never downwards), at most 2x the largest measured B
  before the result is flagged as extrapolated. A draft step of B sequences is the measured
  batched step of the drafting model (the draft, or the trace's drafting exit layer); another
  exit layer takes that layer's single-sequence step times the measured batch growth.
- **Measured tables without a batch axis** (older traces) use the *token-count rule*: a target
  forward over the batch costs the single-sequence forward over the batch's total tokens
  K = Σ k_i at the batch's mean context, ``T(K, mean c)``; a draft step of B sequences costs
  the measured draft step scaled by the target's measured growth from 1 to B tokens,
  ``D(mean c) · T(B, mean c) / T(1, mean c)``. On a CPU, where a forward is compute-bound, the
  batch's tokens are what costs; the KV reads of separate sequences and the draft's own
  scaling are not measured, so results on such models are flagged as extrapolated.

Prefills (prompts of hundreds of tokens, beyond most probed k) use the token-count rule unless
the profile is a roofline: the model's timed prefills of that many tokens where the probe has
them (the llama.cpp trace tool's ``target_prefill`` / ``draft_prefill``), else the k-token
target forward. At B = 1 every price is the single-request model's own figure (the
same grid cells the SimPy executor reads), so a batch of one reproduces ``simulate`` exactly.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from simlab.latency.coverage import BATCH, coverage_of
from simlab.latency.grid import LatencyGrid
from simlab.latency.model import _interp_k
from simlab.latency.priced import Extrapolated, draft_runs, tree_drafts
from simlab.latency.roofline import RooflineLatency
from simlab.trace.schema import NO_LAYER

TOKEN_COUNT_RULE = ("batched forwards priced by the token-count rule (B sequences x k tokens = one sequence of "
                    "B*k tokens at the mean context; draft steps scaled by the target's k-growth): extrapolated "
                    "from batch-1 measurements")
ROOFLINE_RULE = "batched forwards priced by the roofline (weights read once per forward, KV per sequence)"
MEASURED_RULE = ("batched forwards priced from measured batches B={sizes} (padded: the longest k at the longest "
                 "context; linear in B between them)")
BEYOND_MEASURED = 2  # batches up to this many times the largest measured one count as measured


class BatchLatency:
    """Durations of batched draft steps, verifications and prefills on one latency grid."""

    def __init__(self, grid: LatencyGrid):
        self.grid = grid
        model = grid.model
        self.roofline = model if isinstance(model, RooflineLatency) else None
        self.name = grid.name
        measured = (getattr(model, "batches", None) or {}) if self.roofline is None else {}
        # batch size -> the grid of B-sequence forwards (1: the single-request grid)
        self.grids = {1: grid, **{b: LatencyGrid(m, grid.max_context) for b, m in sorted(measured.items())}}
        self.sizes = tuple(self.grids)
        self.beyond = False  # set when a batch above BEYOND_MEASURED x the largest measured one was priced

    @property
    def measured(self) -> bool:
        """True when the model holds forwards of more than one sequence, timed."""
        return len(self.sizes) > 1

    @property
    def extrapolated(self) -> bool:
        """True when batches of more than one sequence are priced by the token-count rule, or
        far beyond the measured batch sizes."""
        return self.roofline is None and (not self.measured or self.beyond)

    @property
    def rule(self) -> str:
        if self.roofline is not None:
            return ROOFLINE_RULE
        if not self.measured:
            return TOKEN_COUNT_RULE
        rule = MEASURED_RULE.format(sizes=",".join(map(str, self.sizes)))
        return rule + ("; batches beyond the measured ones extrapolated linearly" if self.beyond else "")

    # -- the rule bits of each price (simlab.latency.coverage): what the engine counts ----------
    # Each mirrors the price of the same name, reading the grids' tabulated bits, never a price;
    # ``batch``: past the largest measured batch size, or by the token-count rule.

    def _bits_in_batch(self, b: int, bits: Callable[[LatencyGrid], int]) -> int:
        """:meth:`_in_batch`'s: the batch sizes it reads, and the batch rule past the largest."""
        if b in self.grids:
            return bits(self.grids[b])
        sizes = self.sizes
        if b > sizes[-1]:
            return BATCH | bits(self.grids[sizes[-2]]) | bits(self.grids[sizes[-1]])
        i = int(np.searchsorted(sizes, b)) - 1
        return bits(self.grids[sizes[i]]) | bits(self.grids[sizes[i + 1]])

    def target_bits(self, ks: Sequence[int], ctxs: Sequence[int], trees: Sequence[bool] | None = None) -> int:
        """The rule bits of :meth:`target`'s forward."""
        if self.roofline is not None:
            return 0
        if trees is not None and any(trees):
            if len(ks) == 1:
                return _bit(self.grid, "target_tree", ks[0], ctxs[0])
            k, c = max((k, c) for k, c, tree in zip(ks, ctxs, trees) if tree)
            return (self.target_bits(ks, ctxs) | _bit(self.grid, "target_tree", k, c)
                    | _bit(self.grid, "target_forward", k, c))
        if len(ks) == 1:
            return _bit(self.grid, "target_forward", ks[0], ctxs[0])
        if self.measured:
            k, c = max(ks), max(ctxs)
            return self._bits_in_batch(len(ks), lambda g: _bit(g, "target_forward", k, c))
        return BATCH | _bit(self.grid, "target_forward", sum(ks), _mean(ctxs))

    def step_bits(self, ctxs: Sequence[int]) -> int:
        """The rule bits of :meth:`step`'s forward."""
        if self.roofline is not None:
            return 0
        if len(ctxs) == 1:
            return _bit(self.grid, "target_step", 1, ctxs[0])
        if self.measured:
            c = max(ctxs)
            return self._bits_in_batch(len(ctxs), lambda g: _bit(g, "target_step", 1, c))
        c = _mean(ctxs)
        return (BATCH | _bit(self.grid, "target_forward", len(ctxs), c) | _bit(self.grid, "target_step", 1, c)
                | _bit(self.grid, "target_forward", 1, c))

    def draft_bits(self, ks: Sequence[int], ctxs: Sequence[int], layer: int = NO_LAYER) -> int:
        """The rule bits of :meth:`draft`'s forward."""
        grid = self.grid
        if len(ks) == 1 and ks[0] == 1:
            return _bit(grid, "draft_step", layer, ctxs[0])
        if self.roofline is not None:
            return 0
        if self.measured and max(ks) == 1:
            c = max(ctxs)
            return (self._bits_in_batch(len(ks), lambda g: _bit(g, "draft_step", NO_LAYER, c))
                    | _bit(grid, "draft_step", NO_LAYER, c) | _bit(grid, "draft_step", layer, c))
        c = _mean(ctxs)
        return (BATCH | _bit(grid, "draft_step", layer, c) | _bit(grid, "target_forward", sum(ks), c)
                | _bit(grid, "target_forward", 1, c))

    def count_draft_phase(self, out: Extrapolated, drafts: Sequence[int], ctxs: Sequence[int], layer: int = NO_LAYER,
                          feeds: Sequence[int] | None = None,
                          widths: Sequence[Sequence[int] | None] | None = None) -> None:
        """Add :meth:`draft_phase`'s draft forwards to ``out``."""
        feeds = feeds or [1] * len(drafts)
        widths = widths or [None] * len(drafts)
        active = [(c, k, f, w) for c, k, f, w in zip(ctxs, drafts, feeds, widths) if k > 0]
        grid = self.grid
        if len(active) == 1:  # the simulator's prices, counted as it counts them
            c, k, f, w = active[0]
            if w is None:
                draft_runs(out, grid, [c], [k], layer, feed=[f])
            else:
                tree_drafts(out, grid, [c], [w], feed=[f])
            return
        longest = max((k for _, k, _, _ in active), default=0)
        widest = max((f for _, _, f, _ in active), default=1)
        for j in range(longest):
            step = [c + j for c, k, _, _ in active if k > j]
            bits = self.draft_bits([1] * len(step), step, layer)
            if j == 0 and widest > 1 and grid.catch_up_seconds(max(step), widest, layer):
                bits |= self.target_bits([widest] * len(step), step) | self.target_bits([1] * len(step), step)
            for c, k, _, w in active:
                if w is not None and k > j and w[j] > 1:
                    bits |= _bit(grid, "draft_tree", w[j], c + j)
            out.add_one(bits)

    def prefill_bits(self, prompt_lens: Sequence[int], layer: int = NO_LAYER, drafts: bool = True) -> list[int]:
        """The rule bits of :meth:`prefill`'s forwards (the target's, then the draft's)."""
        if self.roofline is not None:
            return [0, 0] if drafts else [0]
        model, k = self.grid.measured, sum(prompt_lens)
        if model is None:
            return [0, 0] if drafts else [0]
        target = coverage_of(model, "target_prefill", k, 0)
        forward = int(coverage_of(model, "target_forward", k, 0))
        target = forward if target is None else int(target)
        if not drafts:
            return [target]
        draft = coverage_of(model, "draft_prefill", k, 0)
        if draft is None:
            draft = int(coverage_of(model, "draft_step", layer, 0)) | target | int(coverage_of(model, "target_forward", 1, 0))
        return [target, int(draft)]

    def beside_bits(self, prompt_lens: Sequence[int], step_tokens: int, drafts: bool = True) -> int:
        """The rule bits of :meth:`beside`'s share of the step's forward (both prefills it differs)."""
        bits = 0
        for part in (*self.prefill_bits([*prompt_lens, step_tokens], drafts=drafts),
                     *self.prefill_bits([step_tokens], drafts=drafts)):
            bits |= part
        return bits

    def _in_batch(self, b: int, price) -> float:
        """``price(grid)`` at batch size ``b``: linear in B between measured sizes, the last
        segment's slope (not downwards) beyond the largest."""
        if b in self.grids:
            return price(self.grids[b])
        if b > BEYOND_MEASURED * self.sizes[-1]:
            self.beyond = True
        return float(_interp_k(b, self.sizes, [price(self.grids[x]) for x in self.sizes]))

    def target(self, ks: Sequence[int], ctxs: Sequence[int], trees: Sequence[bool] | None = None) -> float:
        """One target forward: sequence i brings ``ks[i]`` tokens at context ``ctxs[i]``;
        ``trees[i]``: those tokens are a draft tree's root and nodes, verified under a tree mask.
        Alone, a tree is the single-sequence ``target_tree``. In a batch the forward is the chain
        forward of the same tokens times the tree/chain ratio of the batch's largest tree (the
        most tokens; then the longest context) at its context: the mask is the padded batch's, as
        wide as its widest row, and no probe times batches of trees."""
        if trees is not None and any(trees):
            if len(ks) == 1:
                return self.grid.target_tree(ks[0], ctxs[0])
            k, c = max((k, c) for k, c, tree in zip(ks, ctxs, trees) if tree)
            return self.target(ks, ctxs) * (self.grid.target_tree(k, c) / self.grid.target_forward(k, c))
        if len(ks) == 1:
            return self.grid.target_forward(ks[0], ctxs[0])
        if self.roofline is not None:
            return self.roofline.batch_forward(ks, ctxs, draft=False)
        if self.measured:
            k, c = max(ks), max(ctxs)
            return self._in_batch(len(ks), lambda g: g.target_forward(k, c))
        return self.grid.target_forward(sum(ks), _mean(ctxs))

    def step(self, ctxs: Sequence[int]) -> float:
        """One step of plain decoding (no draft runs): every sequence brings one token. The
        target's ``target_step`` priced as :meth:`target` prices a one-token forward; by the
        token-count rule, that forward scaled by the plain step's share of a one-token forward."""
        if len(ctxs) == 1:
            return self.grid.target_step(ctxs[0])
        if self.roofline is not None:
            return self.roofline.batch_forward([1] * len(ctxs), ctxs, draft=False)
        if self.measured:
            c = max(ctxs)
            return self._in_batch(len(ctxs), lambda g: g.target_step(c))
        c = _mean(ctxs)
        return self.grid.target_forward(len(ctxs), c) * self.grid.target_step(c) / self.grid.target_forward(1, c)

    def draft(self, ks: Sequence[int], ctxs: Sequence[int], layer: int = NO_LAYER) -> float:
        """One draft forward (a draft step when every k is 1; a prefill otherwise)."""
        if len(ks) == 1 and ks[0] == 1:
            return self.grid.draft_step(ctxs[0], layer)
        if self.roofline is not None:
            return self.roofline.batch_forward(ks, ctxs, draft=True, layer=layer)
        if self.measured and max(ks) == 1:
            c = max(ctxs)
            growth = self._in_batch(len(ks), lambda g: g.draft_step(c)) / self.grid.draft_step(c)
            return self.grid.draft_step(c, layer) * growth
        c = _mean(ctxs)
        return self.grid.draft_step(c, layer) * self.grid.target_forward(sum(ks), c) / self.grid.target_forward(1, c)

    def draft_phase(self, drafts: Sequence[int], ctxs: Sequence[int], layer: int = NO_LAYER,
                    feeds: Sequence[int] | None = None,
                    widths: Sequence[Sequence[int] | None] | None = None) -> tuple[float, int]:
        """Ragged drafting: sequence i drafts ``drafts[i]`` tokens from context ``ctxs[i]``. Draft
        step j runs over the sequences that draft at least j tokens, so the phase lasts as many
        steps as the longest draft. The first step feeds sequence i ``feeds[i]`` tokens (what its
        draft's cache lacks, :mod:`simlab.sim.draft_cache`; one each when None): a padded forward,
        the batched step grown as one sequence's step grows to the widest feed; alone, a sequence's step
        plus :meth:`~simlab.latency.grid.LatencyGrid.catch_up_seconds`, the simulator's price.
        Several sequences' first step is one padded forward of ``widest`` tokens each: the batched
        step grown as the target's batched forward grows from one to ``widest`` tokens per
        sequence at this batch size (the proxy of ``catch_up_seconds``, measured at the batch's own
        size: on a CPU a second token costs one sequence 2.1x, two sequences 1.0x, Qwen2.5-Coder-1.5B).
        A tree round's sequence (``widths[i]`` not None) drafts one level per step, step j a
        forward over ``widths[i][j]`` nodes: alone, the simulator's
        :meth:`~simlab.latency.grid.LatencyGrid.tree_draft_seconds`; in a batch, step j is the
        batched step times the largest of its rows' tree factors
        (:meth:`~simlab.latency.grid.LatencyGrid.draft_tree_factor` of a row's width at its
        context; 1 for a chain's token or a one-node level): the padded forward is as wide as its
        widest row, the rule the first step's feed follows.
        Returns (seconds, draft forwards)."""
        feeds = feeds or [1] * len(drafts)
        widths = widths or [None] * len(drafts)
        active = [(c, k, f, w) for c, k, f, w in zip(ctxs, drafts, feeds, widths) if k > 0]
        if not active:
            return 0.0, 0
        grid = self.grid
        if len(active) == 1:
            c, k, f, w = active[0]
            seconds = grid.draft_seconds(c, k, layer) if w is None else grid.tree_draft_seconds(c, w)
            if f > 1:
                seconds += grid.catch_up_seconds(c, f, layer)
            return seconds, k
        longest = max(k for _, k, _, _ in active)
        widest = max(f for _, _, f, _ in active)
        seconds = 0.0
        for j in range(longest):
            step = [c + j for c, k, _, _ in active if k > j]
            price = self.draft([1] * len(step), step, layer)
            if j == 0 and widest > 1 and grid.catch_up_seconds(max(step), widest, layer):
                price *= max(self.target([widest] * len(step), step) / self.target([1] * len(step), step), 1.0)
            trees = [grid.draft_tree_factor(w[j], c + j) if w[j] > 1 else 1.0
                     for c, k, _, w in active if w is not None and k > j]
            if trees:
                price *= max(trees if len(trees) == len(step) else [*trees, 1.0])
            seconds += price
        return seconds, longest

    def prefill(self, prompt_lens: Sequence[int], layer: int = NO_LAYER, drafts: bool = True) -> float:
        """The prompts' prefill: one target forward over every prompt, then one draft forward
        (the draft needs its own KV cache of the prompt) unless no request ``drafts`` (a plain
        server, like llama-server without a draft model, prefills the target alone). Each is
        the model's prefill of all the prompts' tokens where the probe timed prefills (a server's,
        only the last position's logits: the llama.cpp trace tool's); otherwise the k-token
        target forward, and the draft's that forward scaled by the draft's step over the target's."""
        zeros = [0] * len(prompt_lens)
        if self.roofline is None:  # the grid tabulates k up to a few hundred; prompts go to the model
            model, k, c = self.grid.model, sum(prompt_lens), 0
            target = model.prefill(k, c)
            if target is None:
                target = model.target_forward(k, c)
            draft = model.prefill(k, c, draft=True) if drafts else 0.0
            if draft is None:
                draft = model.draft_step(c, layer) * target / model.target_forward(1, c)
            return target + draft
        return self.target(prompt_lens, zeros) + (self.draft(prompt_lens, zeros, layer) if drafts else 0.0)

    def beside(self, prompt_lens: Sequence[int], step_tokens: int, drafts: bool = True) -> float:
        """What the prompts add to a step's forward of ``step_tokens`` tokens when they ride in
        it (a mixed scheduler, :mod:`simlab.serve.scheduler`): :meth:`prefill` of the prompts and
        those tokens together less :meth:`prefill` of the tokens alone, so the forward's fixed
        cost (the weights read once) is paid once, by the step's own price. Never below zero
        (a measured k axis can dip between neighbouring sizes)."""
        step = [step_tokens]
        return max(self.prefill([*prompt_lens, step_tokens], drafts=drafts) - self.prefill(step, drafts=drafts), 0.0)


def _bit(grid: LatencyGrid, op: str, size: int, ctx: int) -> int:
    """The rule bits of one price of ``grid`` (its draft steps' ``size``: the exit layer)."""
    if grid.measured is None:
        return 0
    return int(grid.codes_at(op, size, np.array([ctx]))[0])


def _mean(values: Sequence[int]) -> int:
    return (sum(values) + len(values) // 2) // len(values)

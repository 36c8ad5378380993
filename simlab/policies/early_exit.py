"""Self-speculative drafting with the target's own first layers: LayerSkip and DEL.

The draft of exit layer ℓ runs the target's first ℓ decoder layers and its LM head; the trace
must carry per-layer early-exit signals (``layers.parquet``, recorded with ``--exit-layers``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simlab.errors import SimlabError
from simlab.policies.base import (
    BOOL,
    COUNT,
    PROBABILITY,
    Decision,
    Param,
    Plan,
    Policy,
    PolicyContext,
    PromptInfo,
    RoundState,
    Serial,
)
from simlab.signals import ShadowTokens, TokenSignal


def exit_layers(name: str, context: PolicyContext) -> list[int]:
    if not context.exit_layers:
        raise SimlabError(f"{name} needs a trace with early-exit signals (layers.parquet; record with --exit-layers)")
    return sorted(context.exit_layers)


class LayerSkip(Policy):
    """LayerSkip self-speculative decoding: a fixed exit layer E and a fixed γ (docs/policies/early-exit.md)."""

    name = "layerskip"
    summary = "LayerSkip: draft γ tokens with the target's first E layers, verify with all layers"
    paper = ("Elhoushi et al. 2024, LayerSkip, arXiv:2404.16710 (docs/policies/early-exit.md); "
             "DEL §2, baseline LS(E-γ)")
    params = (
        Param("exit_layer", None, "exit layer E (none: the deepest recorded exit layer)", COUNT),
        Param("gamma", 6, "num_speculations γ (README example: E=8, γ=6 on Llama2-7B)", COUNT),
    )

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        layers = exit_layers(self.name, context)
        self.exit_layer = layers[-1] if self.exit_layer is None else self.exit_layer
        if self.exit_layer not in layers:
            raise SimlabError(f"exit_layer {self.exit_layer} was not recorded; the trace has layers {layers}")
        self._plan = Serial(self.gamma, fixed=True, layer=self.exit_layer)

    def plan(self, state: RoundState) -> Plan:
        return self._plan


def tpl(alpha: float, lost: float, d: int, layer: int, n_layers: int) -> float:
    """Token-per-Layer (DEL eq. 1) of drafting d tokens with exit layer ℓ, for α < 1 (``lost``
    = 1 − α): the expected tokens of a round, (1 − α^(d+1))/(1 − α), over the layers it loads,
    d·ℓ + L."""
    return (1.0 - alpha ** (d + 1)) / lost / (d * layer + n_layers)


def tpl_row(alpha: float, layer: int, d_max: int, n_layers: int) -> list[float]:
    """:func:`tpl` for d = 0..d_max (at α = 1, (d + 1)/(d·ℓ + L)): the row of one layer that
    DEL's update maximises."""
    if alpha >= 1.0:
        return [(d + 1.0) / (d * layer + n_layers) for d in range(d_max + 1)]
    lost = 1.0 - alpha
    return [tpl(alpha, lost, d, layer, n_layers) for d in range(d_max + 1)]


def row_max(row: list[float]) -> tuple[float, int]:
    """The largest entry of a TPL row and its first index (§4.3's argmax: the first d on ties)."""
    best = max(row)
    return best, row.index(best)


# "Clearly lower" (tpl_argmax): lower by far more than the few roundings of a computed entry
# (a relative 2⁻⁵³ each, and pow's error, under one ulp in glibc's, musl's and macOS's libm) ...
_UP, _DOWN = 1.0 + 1e-12, 1.0 - 1e-12
# ... and than pow's error in absolute terms: 1 − α^(d+1) cancels as α nears 1, and that error
# over 1 − α can dwarf the relative ones; it stays below _SLACK / (1 − α), with room to spare.
_SLACK = 1e-15
# ... and, from α alone: α·L below ℓ·_FALLS puts TPL(1) below TPL(0) by a relative 1e-6/(L + 1)
# at least, above the error of a computed entry for any layer count below 10^5
_FALLS = 1.0 - 1e-6


def tpl_argmax(alpha: float, layer: int, d_max: int, n_layers: int, guess: int = 0) -> tuple[float, int]:
    """``row_max(tpl_row(alpha, layer, d_max, n_layers))``, bit for bit, from a few entries of
    the row: DEL evaluates every exit layer's row after every verification, and whole rows (a
    pow per entry) were nearly all the time of a simulated DEL round.

    Why a few entries suffice: 1 − α^(d+1) is concave in d and d·ℓ + L is positive and affine,
    so TPL is quasi-concave in d (once it falls, it keeps falling). A d whose neighbours are
    both lower holds the row's maximum, and every other entry is no higher than one of those
    neighbours. A computed entry is off the real one by a few roundings; a neighbour lower by
    far more than that (:data:`_UP`, :data:`_DOWN`, :data:`_SLACK`) is lower in reals too, so
    every entry left uncomputed is below the computed maximum, which is therefore the row's
    first maximum. From ``guess`` (the layer's d at the previous update: α moves little from one
    verification to the next) the search climbs to such a d; where two entries are too close to
    call, it computes the whole row. tests/test_policies.py pins it to :func:`row_max`.

    Most rows need no entry at all: TPL(0) is exactly 1/L for every α < 1 ((1 − α)/(1 − α) is
    one to the last bit), and TPL(1) = (1 + α)/(ℓ + L) is below it exactly when α < ℓ/L, so a
    row with α clearly below ℓ/L falls from its first entry (exit layers that seldom match the
    target's token have such rows).
    """
    if alpha >= 1.0:
        return row_max(tpl_row(alpha, layer, d_max, n_layers))
    if alpha * n_layers < layer * _FALLS:
        return 1.0 / n_layers, 0
    lost = 1.0 - alpha
    slack = _SLACK / lost
    d = min(max(guess, 0), d_max)
    x = tpl(alpha, lost, d, layer, n_layers)
    for step in (1, -1):
        climbed = False
        while 0 <= d + step <= d_max:
            y = tpl(alpha, lost, d + step, layer, n_layers)
            if y * _UP + slack < x * _DOWN:  # this side falls
                break
            if not x * _UP + slack < y * _DOWN:  # too close to call
                return row_max(tpl_row(alpha, layer, d_max, n_layers))
            d, x, climbed = d + step, y, True
        if climbed:  # the side it climbed from falls
            break
    return x, d


class Del(Policy):
    """DEL Algorithm 1 (Appendix A): each round drafts with exit layer E, up to d_max tokens,
    and stops at the first token whose confidence is below τ_E (that token is dropped, line
    9-10). After the prefill and each verification, DEL_UPDATE reads every layer's shadow
    tokens at the settled positions and sets, with decayed sums S(a) = Σ ω^(r−i−1) a[i]:

        α_ℓ = S(c^ℓ) / S(n)                                   (eq. 2)
        (E, γ) = argmax over ℓ, d ∈ [0, d_max] of TPL(ℓ, d)   (§4.3, eq. 1)
        τ_ℓ = ½ (S(tcs^ℓ)/S(c^ℓ) + S(fcs^ℓ)/S(n − c^ℓ))       (eq. 3)

    where per round c^ℓ counts layer ℓ's tokens that match the target's, tcs^ℓ / fcs^ℓ sum the
    confidences of its matching / mismatching tokens, and n counts the settled positions.
    With ``dynamic_exit`` off (the DEL-E ablation, §5.3) a round drafts exactly γ tokens.
    Reading the shadow tokens is target work of its own, an exit head per layer over the settled
    positions, which the executors run (live) or price (docs/policies/early-exit.md, Time).
    """

    name = "del"
    summary = "DEL: exit layer by max Token-per-Layer from decayed shadow-token acceptance, dynamic draft exit"
    paper = "Entezari Zarch et al. 2025, DEL, arXiv:2504.05598, §4.1-4.4 eqs. 1-3, Algorithm 1; defaults Appendix B.2"
    params = (
        Param("omega", 0.95, "ω, decay of past rounds in S(·)", PROBABILITY),
        Param("d_max", 18, "largest speculation length d", COUNT),
        Param("dynamic_exit", True, "stop drafting at confidence < τ_E (§4.4); false: draft γ (DEL-E)", BOOL),
    )
    choices = ("eq. 2 divides by S(u) although u+1 positions are compared (α could exceed 1): n = u+1 is used; "
               "the prefill warm-up (last 32 prompt tokens) is replaced by position 0's shadow tokens, as traces "
               "hold early-exit signals of generated positions only; statistics restart with each prompt; in eq. 3 "
               "a side with no tokens yet reads 1 (matched) or 0 (mismatched); TPL ties (every TPL(ℓ, 0) = 1/L, "
               "when no layer pays off) go to the shallowest layer, and Algorithm 1 still drafts with it")
    needs_shadows = True

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self.layers = exit_layers(self.name, context)
        self._layers = tuple(self.layers)  # ShadowTokens.layers
        self.n_layers = context.n_layers
        if self.n_layers <= self.layers[-1]:
            raise SimlabError(f"del needs the target's layer count L > exit layers {self.layers}; the trace says "
                              f"n_layers={self.n_layers}")
        # per exit layer, in the order of self.layers: TPL's maximum at α = 1 (that row never
        # moves, and deep layers may match every settled position); its argmax d at the last
        # update (tpl_argmax's guess: it makes the search shorter, never its answer different),
        # read as 0 where the layer was not searched then (tpl_argmax's first test answers 0);
        # ℓ·_FALLS, that first test's bound, for every layer at once
        self._at_one = [tpl_argmax(1.0, layer, self.d_max, self.n_layers) for layer in self.layers]
        self._guess, self._searched = [0] * len(self.layers), np.zeros(len(self.layers), dtype=bool)
        self._falls = np.array(self.layers) * _FALLS
        # ω and L as numpy scalars (the same products): an array times a Python number converts it on every call
        self._omega, self._scale = np.array(self.omega), np.array(float(self.n_layers))
        self.reset(None)

    def reset(self, prompt: PromptInfo | None) -> None:
        self.exit_layer, self.gamma = self.layers[-1], self.d_max
        # the decayed sums, in the columns of a ShadowTokens table: S(n), then S(c^ℓ), S(tcs^ℓ),
        # S(fcs^ℓ) per exit layer; and α per exit layer
        self._sums = np.zeros(1 + 3 * len(self.layers))
        self._alpha = np.zeros(len(self.layers))
        self._tau = 0.0  # τ_E: a round reads only the exit layer's threshold

    @property
    def alpha(self) -> dict[int, float]:
        """α_ℓ (eq. 2) per exit layer, as of the last update."""
        return dict(zip(self.layers, self._alpha.tolist()))

    @property
    def tau(self) -> dict[int, float]:
        """τ_ℓ (eq. 3) per exit layer, as of the last update (which computes only τ_E, the one
        a round reads)."""
        return {layer: self._threshold(i) for i, layer in enumerate(self.layers)}

    def _threshold(self, i: int) -> float:
        """τ (eq. 3) of the i-th exit layer."""
        sums, k = self._sums, len(self.layers)
        c, tcs, fcs = sums.item(1 + i), sums.item(1 + k + i), sums.item(1 + 2 * k + i)
        mismatched = sums.item(0) - c
        matched_conf = tcs / c if c > 0 else 1.0
        mismatched_conf = fcs / mismatched if mismatched > 1e-12 else 0.0
        return (matched_conf + mismatched_conf) / 2

    def observe_shadows(self, shadows: ShadowTokens) -> None:  # DEL_UPDATE, Alg. 1 lines 18-30
        """The update over numpy arrays of every exit layer at once: per layer and column, the
        same sums in the same order, and the same products and quotients, as a loop over layers
        would take (tests/test_policies.py pins it to the paper's update, bit for bit)."""
        if shadows.layers != self._layers:
            raise SimlabError(f"del's exit layers are {self.layers}; the shadow tokens are of layers "
                              f"{list(shadows.layers)}")
        rows, sums = shadows.table, self._sums
        # S ← ω·S + this round's sums, its rows added first to last as a loop would (not by
        # np.sum, whose order depends on the memory layout: pairwise along a contiguous axis)
        total = rows[0]
        for i in range(1, len(rows)):
            total = total + rows[i]
        sums *= self._omega
        sums += total
        layers, d_max, n_layers, guess, searched = self.layers, self.d_max, self.n_layers, self._guess, self._searched
        alpha = self._alpha = sums[1:1 + len(layers)] / sums[0:1]  # eq. 2
        # §4.3: (E, γ) = argmax TPL(ℓ, d), the first (ℓ, d) on ties. A layer with α·L clearly
        # below ℓ has the row max 1/L at d = 0 (tpl_argmax's first test); the first such layer
        # stands for them all, as the others tie with it and come after it.
        search = self._searched = alpha * self._scale >= self._falls
        search[search.argmin()] = True
        best, chosen = -1.0, 0
        for i in search.nonzero()[0].tolist():
            if not searched[i]:
                guess[i] = 0
            a = alpha.item(i)
            if a >= 1.0:
                value, d = self._at_one[i]
            else:
                value, d = tpl_argmax(a, layers[i], d_max, n_layers, guess[i])
                guess[i] = d
            if value > best:
                best, chosen, self.exit_layer, self.gamma = value, i, layers[i], d
        self._tau = self._threshold(chosen)  # eq. 3

    def plan(self, state: RoundState) -> Plan:
        if self.dynamic_exit:
            return Serial(self.d_max, layer=self.exit_layer)  # Alg. 1 line 7
        return Serial(self.gamma, fixed=True, layer=self.exit_layer)

    def on_draft(self, signal: TokenSignal) -> Decision:
        return Decision.DROP if signal.confidence < self._tau else Decision.DRAFT  # lines 9-10

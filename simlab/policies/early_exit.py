"""Self-speculative drafting with the target's own first layers: LayerSkip and DEL.

The draft of exit layer ℓ runs the target's first ℓ decoder layers and its LM head; the trace
must carry per-layer early-exit signals (``layers.parquet``, recorded with ``--exit-layers``).
"""

from __future__ import annotations

from itertools import compress
from operator import not_
from typing import Any

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


def tpl_row(alpha: float, layer: int, d_max: int, n_layers: int) -> list[float]:
    """Token-per-Layer (DEL eq. 1) for d = 0..d_max: expected tokens of a round,
    (1 − α^(d+1))/(1 − α), over the layers it loads, d·ℓ + L (one list per layer: DEL
    evaluates every layer and d after every verification)."""
    if alpha >= 1.0:
        return [(d + 1.0) / (d * layer + n_layers) for d in range(d_max + 1)]
    lost = 1.0 - alpha
    return [(1.0 - alpha ** (d + 1)) / lost / (d * layer + n_layers) for d in range(d_max + 1)]


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
        self.n_layers = context.n_layers
        if self.n_layers <= self.layers[-1]:
            raise SimlabError(f"del needs the target's layer count L > exit layers {self.layers}; the trace says "
                              f"n_layers={self.n_layers}")
        self.reset(None)

    def reset(self, prompt: PromptInfo | None) -> None:
        self.exit_layer, self.gamma = self.layers[-1], self.d_max
        self.tau = {layer: 0.0 for layer in self.layers}
        self.alpha = {layer: 0.0 for layer in self.layers}
        self._n = 0.0
        self._c = dict.fromkeys(self.layers, 0.0)
        self._tcs = dict.fromkeys(self.layers, 0.0)
        self._fcs = dict.fromkeys(self.layers, 0.0)

    def observe_shadows(self, shadows: ShadowTokens) -> None:  # DEL_UPDATE, Alg. 1 lines 18-30
        w = self.omega
        self._n = w * self._n + len(shadows.matches[self.layers[0]])
        for layer in self.layers:
            match, conf = shadows.matches[layer], shadows.confidence[layer]
            self._c[layer] = w * self._c[layer] + sum(match)
            self._tcs[layer] = w * self._tcs[layer] + sum(compress(conf, match))
            self._fcs[layer] = w * self._fcs[layer] + sum(compress(conf, map(not_, match)))
            c, mismatched = self._c[layer], self._n - self._c[layer]
            self.alpha[layer] = c / self._n  # eq. 2
            matched_conf = self._tcs[layer] / c if c > 0 else 1.0
            mismatched_conf = self._fcs[layer] / mismatched if mismatched > 1e-12 else 0.0
            self.tau[layer] = (matched_conf + mismatched_conf) / 2  # eq. 3
        best = -1.0
        for layer in self.layers:  # §4.3: (E, γ) = argmax TPL(ℓ, d), the first (ℓ, d) on ties
            row = tpl_row(self.alpha[layer], layer, self.d_max, self.n_layers)
            value = max(row)
            if value > best:
                best, self.exit_layer, self.gamma = value, layer, row.index(value)

    def plan(self, state: RoundState) -> Plan:
        if self.dynamic_exit:
            return Serial(self.d_max, layer=self.exit_layer)  # Alg. 1 line 7
        return Serial(self.gamma, fixed=True, layer=self.exit_layer)

    def on_draft(self, signal: TokenSignal) -> Decision:
        return Decision.DROP if signal.confidence < self.tau[self.exit_layer] else Decision.DRAFT  # lines 9-10

"""Self-speculative drafting with the target's own first layers: LayerSkip and DEL.

The draft of exit layer ℓ runs the target's first ℓ decoder layers and its LM head; the trace
must carry per-layer early-exit signals (``layers.parquet``, recorded with ``--exit-layers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from simlab.common.errors import SimlabError
from simlab.common.signals import ShadowTokens, TokenSignal
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
        import numpy as np  # here, not at the top: `simlab CMD --help` builds every policy's flags

        super().__init__(context, **values)
        self.layers = exit_layers(self.name, context)
        self._layers = tuple(self.layers)  # ShadowTokens.layers
        self.n_layers = context.n_layers
        if self.n_layers <= self.layers[-1]:
            raise SimlabError(f"del needs the target's layer count L > exit layers {self.layers}; the trace says "
                              f"n_layers={self.n_layers}")
        import simlab.policies.del_update as del_update  # numba: imported with the first DEL policy (its docstring)

        self._update, self._threshold = del_update.update, del_update.threshold
        layers = np.array(self.layers, dtype=np.int64)
        at_one = [del_update.tpl_argmax(1.0, layer, self.d_max, self.n_layers) for layer in self.layers]
        #: what :func:`~simlab.policies.del_update.update` reads besides its state: ω, L as a
        #: float, ℓ·FALLS per layer, the layers, d_max, L, and TPL's maximum and argmax at α = 1
        #: per layer (that row never moves, and deep layers may match every settled position)
        self.constants = (float(self.omega), float(self.n_layers), layers * del_update.FALLS, layers, self.d_max,
                          self.n_layers, np.array([v for v, _ in at_one]), np.array([d for _, d in at_one]))
        # each layer's argmax d at the last update, and whether it was searched then: where the
        # next search starts (it makes the search shorter, never its answer different)
        self._guess = np.zeros(len(self.layers), dtype=np.int64)
        self._searched = np.zeros(len(self.layers), dtype=np.bool_)
        self.reset(None)

    def reset(self, prompt: PromptInfo | None) -> None:
        import numpy as np  # here, not at the top: `simlab CMD --help` builds every policy's flags

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
        return {layer: self._threshold(self._sums, i, len(self.layers)) for i, layer in enumerate(self.layers)}

    def observe_shadows(self, shadows: ShadowTokens) -> None:  # DEL_UPDATE, Alg. 1 lines 18-30
        """:func:`~simlab.policies.del_update.update`, the compiled update the simulator's DEL
        replay runs too."""
        if shadows.layers != self._layers:
            raise SimlabError(f"del's exit layers are {self.layers}; the shadow tokens are of layers "
                              f"{list(shadows.layers)}")
        chosen, self.gamma, self._tau = self._update(self._sums, shadows.table, self._alpha, self._guess,
                                                     self._searched, self.constants)
        self.exit_layer = self.layers[chosen]

    def plan(self, state: RoundState) -> Plan:
        if self.dynamic_exit:
            return Serial(self.d_max, layer=self.exit_layer)  # Alg. 1 line 7
        return Serial(self.gamma, fixed=True, layer=self.exit_layer)

    def on_draft(self, signal: TokenSignal) -> Decision:
        return Decision.DROP if signal.confidence < self._tau else Decision.DRAFT  # lines 9-10

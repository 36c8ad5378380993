"""Closed forms of speculative decoding under i.i.d. acceptance (Leviathan et al. 2023, §3.1-3.4;
arXiv:2211.17192; docs/policies/fixed.md).

With per-token acceptance probability α, draft length γ and c = T_draft / T_target:

- expected tokens per round (accepted drafts + the target's token):
  E(α, γ) = (1 - α^(γ+1)) / (1 - α)                                   (Leviathan eq. 1)
- walltime improvement over autoregressive decoding:
  S(α, γ, c) = (1 - α^(γ+1)) / ((1 - α)(γc + 1))                      (Leviathan Thm 3.8)

Leviathan's S assumes a verify of γ+1 tokens costs one target step. When it costs
v(k) = 1 + slope·(k - 1) target steps instead (a CPU, or a large γ on a GPU), the same argument
gives S = E / (γc + v(γ + 1) + α^γ·c·slope): a real decoder's draft, after a round that
accepted all γ drafts (probability α^γ), first feeds two tokens (its last draft, never fed, and
the target's token; :mod:`simlab.sim.draft_cache`), a forward that costs its step times the
growth from 1 to 2 tokens, taken as the target's, v(2) = 1 + slope. With slope 0 this is
Leviathan's S. The optimal γ is the integer argmax (no closed form).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from simlab.common.errors import SimlabError

MAX_GAMMA = 64


def _check(alpha: float, c: float, gamma: int | None = None, verify_slope: float = 0.0) -> None:
    if not (0 <= alpha <= 1):
        raise SimlabError(f"alpha must be in [0, 1], got {alpha}")
    if not (c >= 0 and math.isfinite(c)):
        raise SimlabError(f"c must be >= 0, got {c}")
    if gamma is not None and gamma < 1:
        raise SimlabError(f"gamma must be >= 1, got {gamma}")
    if verify_slope < 0:
        raise SimlabError(f"verify slope must be >= 0, got {verify_slope}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(α, γ): tokens emitted per round, bonus/correction included."""
    if alpha == 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def verify_cost(k: int, verify_slope: float = 0.0) -> float:
    """Cost of a k-token target forward, in one-token target steps."""
    return 1.0 + verify_slope * (k - 1)


def speedup(alpha: float, c: float, gamma: int, verify_slope: float = 0.0) -> float:
    """S(α, γ, c): walltime speedup over autoregressive decoding (rounds cost γc + v(γ+1), plus
    the draft's two-token catch-up after a fully accepted round: see the module)."""
    _check(alpha, c, gamma, verify_slope)
    catch_up = alpha**gamma * c * verify_slope
    return expected_tokens(alpha, gamma) / (gamma * c + verify_cost(gamma + 1, verify_slope) + catch_up)


def optimal_gamma(alpha: float, c: float, verify_slope: float = 0.0, max_gamma: int = MAX_GAMMA) -> int:
    """The integer γ in 1..max_gamma with the largest speedup."""
    _check(alpha, c, None, verify_slope)
    return max(range(1, max_gamma + 1), key=lambda g: speedup(alpha, c, g, verify_slope))


@dataclass(frozen=True)
class AnalyticResult:
    alpha: float
    c: float
    gamma: int
    verify_slope: float
    expected_tokens: float
    speedup: float
    optimal_gamma: int
    optimal_speedup: float

    def to_dict(self) -> dict:
        return asdict(self)


def analyse(alpha: float, c: float, gamma: int, verify_slope: float = 0.0) -> AnalyticResult:
    g_opt = optimal_gamma(alpha, c, verify_slope)
    return AnalyticResult(
        alpha=alpha,
        c=c,
        gamma=gamma,
        verify_slope=verify_slope,
        expected_tokens=expected_tokens(alpha, gamma),
        speedup=speedup(alpha, c, gamma, verify_slope),
        optimal_gamma=g_opt,
        optimal_speedup=speedup(alpha, c, g_opt, verify_slope),
    )


# -- beyond i.i.d. and fixed c: the forms simlab's trace analysis puts beside the simulator --

def speedup_from_costs(tokens_per_round: float, gamma: int, draft_cost: float, verify_cost: float) -> float:
    """Walltime speedup of a round of γ drafts: tokens / (γ·c + v), with the draft step ``c``
    and the (γ+1)-token verify ``v`` in units of one autoregressive target step."""
    return tokens_per_round / (gamma * draft_cost + verify_cost)


def h_threshold(t_verify: float, t_draft_k: float, t_reject: float) -> float:
    """The h-rule's threshold on P_rej(k) (acceptance-guided adaptive SD, eq. 12):
    h = (T_v − T_d(k)) / T_r."""
    return (t_verify - t_draft_k) / t_reject


def parallel_window(t_draft: float, t_target: float) -> int:
    """SPIDE's window s = ⌊v_q / v_p⌋ (eq. 6) with speeds v = 1 / (seconds per forward): the
    drafts that fit into one target forward (PEARL's γ). A ratio within 1e-9 of an integer
    counts as that integer (durations summed from tables carry rounding)."""
    return max(1, math.floor(t_target / t_draft + 1e-9))


def tokens_per_layer(alpha: float, d: int, layer: int, n_layers: int) -> float:
    """DEL's TPL(ℓ, d) = (1 − α_ℓ^(d+1)) / ((1 − α_ℓ)(dℓ + L)) (DEL §4.1, eq. 1): expected tokens
    of a round with d drafts from exit layer ℓ per decoder layer loaded."""
    return expected_tokens(alpha, d) / (d * layer + n_layers)

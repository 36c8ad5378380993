"""Durations policies derive from the latency model: draft runs, and parallel windows.

Policies are built with any :class:`~simlab.latency.model.LatencyModel` (the simulator's
tabulated grid, or a profile in live decoding), so they price k draft steps through the
protocol and use the grid's cumulative sums only when it has them.

SPIDE eq. 6 sets the window s = ⌊v_q/v_p⌋ (draft speed over target speed) so that the draft
finishes its s new tokens when the target finishes verifying; PEARL sets its γ the same way
(SPIDE §1). On hardware whose verify cost depends on how many tokens are verified (CPUs; see
docs/architecture.md), "target speed" needs a size: in the steady state of a parallel round the target
verifies s tokens (s − 1 pending drafts and the first new one) while the draft drafts s. So
the window is the largest s with

    draft_time(s) ≤ target_forward(s)

which is ⌊t_p/t_q⌋ = ⌊v_q/v_p⌋ exactly when the verify cost is flat in k (GPUs at these
sizes). Both sides are priced at the typical context length, with the co-running figures when
both models share one device.
"""

from __future__ import annotations

from simlab.common.errors import SimlabError
from simlab.policies.base import PolicyContext
from simlab.trace.schema import NO_LAYER

MAX_WINDOW = 128


def latency_of(context: PolicyContext, policy: str):
    if context.latency is None:
        raise SimlabError(f"{policy} needs a latency model (a trace's samples or --latency)")
    return context.latency


def draft_time(latency, context_len: int, k: int, corun: bool = False) -> float:
    """Seconds of k draft steps from ``context_len`` (the draft's cache grows by one per step)."""
    if hasattr(latency, "draft_seconds"):  # the simulator's grid: one lookup
        return latency.draft_seconds(context_len, k, NO_LAYER, corun)
    return sum(latency.draft_step(context_len + i, NO_LAYER, corun) for i in range(k))


def balanced_window(context: PolicyContext, policy: str = "a parallel policy") -> int:
    """SPIDE eq. 6 on a latency model whose verify cost may vary with k (module docstring)."""
    lat, ctx, corun = latency_of(context, policy), context.context_len, context.corun
    best = 1
    for s in range(1, MAX_WINDOW + 1):
        # (1 + 1e-9: summed draft steps round up, and 10 steps of 0.1 s must fit a 1 s verify)
        if draft_time(lat, ctx, s, corun) <= lat.target_forward(s, ctx, corun) * (1 + 1e-9):
            best = s
    return best


def window_param(value: object, context: PolicyContext, policy: str) -> int:
    """A policy's ``window`` parameter (checked by its declaration), or :func:`balanced_window` for None."""
    return balanced_window(context, policy) if value is None else value

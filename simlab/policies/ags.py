"""Acceptance-guided adaptive SD (Sun et al.): stop when the predicted probability of a
rejection exceeds a threshold derived from a runtime cost model (§2.2-2.3, eqs. 6-7, 11-12)."""

from __future__ import annotations

from typing import Any

from simlab.common.signals import TokenSignal
from simlab.policies.base import COUNT, PROBABILITY, Param, RoundState
from simlab.policies.stop import PredictedStop
from simlab.policies.timing import draft_time, latency_of


class AcceptanceGuided(PredictedStop):
    """After drafting the k-th token of a round:

        P_rej(k) = 1 − Π_{i≤k} P̂_acc,i                          (eq. 6, one branch)
        continue only if  T_d(k) + P_rej(k)·T_r < T_v            (eq. 11)
        i.e. stop when    P_rej(k) ≥ h = (T_v − T_d(k)) / T_r    (eq. 12; K_eff ≤ K_max, eq. 7)

    with T_d(k) the time of the k drafts, T_v the time to verify them now (a (k+1)-token target
    forward) and T_r the extra cost of a rejection, all at the round's context length from the
    latency model; ``rejection_threshold`` fixes h instead (it was called ``h`` before; SVIP's
    entropy threshold was too). P̂_acc comes from the acceptance head
    (``context.predictor``) or, untrained, the draft's confidence.
    """

    name = "ags"
    summary = "acceptance-guided adaptive SD: stop when P_rej = 1 − ΠP̂_acc ≥ h = (T_v − T_d(k))/T_r"
    paper = "Sun et al., acceptance-guided adaptive SD, §2.2 eqs. 6-7, §2.3 eqs. 11-12"
    params = (
        Param("rejection_threshold", None, "h, a fixed threshold on P_rej (none: eq. 12 from the latency model)",
              PROBABILITY),
        Param("max_draft", 6, "K_max, the upper bound on the draft length (paper: 5, 6 or 7)", COUNT),
    )
    choices = ("T_r = T_v: a rejection costs one more verification of the same size (resampling is free in "
               "the simulator's time model), so h = 1 − T_d(k)/T_v(k+1); k counts the drafts so far; "
               "stop on P_rej ≥ h (eq. 11's strict continue condition)")

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        if self.rejection_threshold is None:
            self._latency = latency_of(context, self.name)
        self._context_len = context.context_len
        self._survive = 1.0
        # h by context length, then by k - 1: h depends on nothing else, and rounds at the same
        # context recur from prompt to prompt, so each h is priced once, not once per token
        self._thresholds: dict[int, list[float]] = {}
        self._h = self._thresholds.setdefault(self._context_len, [])

    def begin_round(self, state: RoundState) -> None:
        self._context_len = state.context_len
        self._survive = 1.0
        self._h = self._thresholds.setdefault(state.context_len, [])

    def threshold(self, k: int, context_len: int) -> float:
        """h of eq. 12 for a candidate set of k drafts (or the fixed ``rejection_threshold``)."""
        if self.rejection_threshold is not None:
            return self.rejection_threshold
        t_v = self._latency.target_forward(k + 1, context_len)
        t_d = draft_time(self._latency, context_len, k)
        t_r = t_v
        return (t_v - t_d) / t_r

    def stops(self, signal: TokenSignal) -> bool:
        self._survive *= self.p_accept(signal)
        h, k = self._h, signal.index
        while len(h) < k:
            h.append(self.threshold(len(h) + 1, self._context_len))
        return 1.0 - self._survive >= h[k - 1]

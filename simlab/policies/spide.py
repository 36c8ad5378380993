"""SPIDE: serial and parallel intertwined speculative decoding (Xu et al.; §3.2, Algorithm 1).

Two modules alternate (Figure 2):

- *serial dynamic drafting*: the draft drafts x_1, x_2, ... one by one; each token's confidence
  C (eq. 2, the draft's top-1 probability) is looked up in the confidence→acceptance mapping
  table, and the reliability Γ_i = Π_{k≤i} α_{b_k} (eq. 3, Γ_0 = π_0, eq. 5) decides (eq. 4):
  draft on while Γ_i > τ, else switch to parallel verification (Alg. 1 lines 4-15);
- *parallel draft verification*: the target verifies the k drafted tokens plus the first of
  s new ones while the draft drafts those s (lines 18-28); if all are accepted, the next round
  verifies the s − 1 others plus one more new token, and so on; at the first rejection the
  target's correction is emitted and drafting returns to serial (lines 30-40).

The table is updated after every verification (line 29) and is kept across prompts: the
paper's Figure 4 snapshot holds counts from a whole dataset. Ablations (§4.3, Table 5) are the
same class with a module switched off: ``spide-no-dyna-draft`` drafts a fixed γ (vanilla SD's
best) before each parallel phase, ``spide-no-para-verify`` verifies serially when Γ ≤ τ.
"""

from __future__ import annotations

from bisect import bisect_right
from functools import partial
from operator import attrgetter
from typing import Any, ClassVar, Iterable

from simlab.common.errors import SimlabError
from simlab.common.mapping import ONE, SPIDE_EDGES
from simlab.common.signals import TokenSignal
from simlab.policies.base import (
    COUNT,
    PROBABILITY,
    Decision,
    Outcome,
    Parallel,
    Param,
    Plan,
    Policy,
    PromptInfo,
    RoundState,
    Serial,
)
from simlab.policies.timing import window_param

N_BINS = len(SPIDE_EDGES)
# The upper edges of bins 0..18: the last is ONE, where bin "1.0" starts (the module docstring
# of simlab.common.mapping), so one bisection finds every bin, below 0 and NaN included.
UPPER_EDGES = (*SPIDE_EDGES[1:-1], ONE)
# Index 0..19 of the interval of §3.2 / Figure 4 that holds a confidence (the bins of
# simlab.common.mapping): a bisection as a C callable, with no Python frame, as the simulator bins
# every drafted token and again every checked one.
confidence_bin = partial(bisect_right, UPPER_EDGES)
CONFIDENCE = attrgetter("confidence")
DRAFT = Decision.DRAFT


def bin_bounds(b: int) -> tuple[float, float]:
    """The confidence range of bin ``b``; the last is the single value 1.0 (in bfloat16)."""
    return (SPIDE_EDGES[b], SPIDE_EDGES[b + 1]) if b + 1 < N_BINS else (1.0, 1.0)


TAU = Param("tau", 0.7, "reliability threshold τ of eq. 4 (Table 18: 0.5-0.9)", PROBABILITY)
WINDOW = Param("window", None, "s, new drafts per parallel round (none: eq. 6 from the latency model)", COUNT)
PRIOR = Param("prior", 1.0, "π_0 of eq. 5: the reliability Γ_0 a draft starts from", PROBABILITY)
TABLE_CHOICES = ("table: one per policy run, shared by all prompts, updated with every checked token (accepted ones "
                 "and the first rejected one; tokens after a rejection are unverified); an empty interval reads its "
                 "mid confidence")
WINDOW_CHOICES = "eq. 6 on a verify cost that varies with k: see simlab/policies/timing.py"


class MappingTable:
    """The confidence→acceptance mapping table (§3.2, Figure 4): per interval b, the draft
    tokens verified so far (N_T) and those accepted (N_A); α_b = N_A / N_T.

    Cold start (the paper only says it is negligible after ~500 tokens): an interval with no
    verified token yet reads the middle of its confidence range, i.e. confidence is taken as
    the acceptance probability until measured — the premise of §3.2.
    """

    def __init__(self) -> None:
        self.total = [0] * N_BINS
        self.accepted = [0] * N_BINS
        self.rate = [sum(bin_bounds(b)) / 2 for b in range(N_BINS)]

    def alpha(self, confidence: float) -> float:
        return self.rate[confidence_bin(confidence)]

    def record(self, confidence: float, accepted: bool) -> None:
        self.record_checked((confidence,), int(accepted))

    def record_checked(self, confidences: Iterable[float], accepted: int) -> None:
        """Record a verification's checked tokens: the first ``accepted`` were accepted, the
        others not (one call a verification: SPIDE records after every one, Alg. 1 line 29)."""
        total, hits, rate = self.total, self.accepted, self.rate
        for confidence in confidences:
            b = confidence_bin(confidence)
            t = total[b] = total[b] + 1
            if accepted:
                accepted -= 1
                h = hits[b] = hits[b] + 1
                rate[b] = h / t
            else:  # the rejected ones (at most one, the last)
                rate[b] = hits[b] / t


class Spide(Policy):
    name = "spide"
    summary = "SPIDE: mapping-table reliability Γ vs τ for serial drafting, parallel draft verification on Γ ≤ τ"
    paper = "Xu et al., SPIDE §3.2 eqs. 2-6, Algorithm 1, Figure 2; defaults Table 18 (DeepSeek 1.3B/33B)"
    params = (TAU, WINDOW, PRIOR)
    choices = f"{TABLE_CHOICES}; {WINDOW_CHOICES}"
    parallel = True
    dyna_draft: ClassVar[bool] = True
    para_verify: ClassVar[bool] = True

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        if not self.dyna_draft:
            self.gamma = self._gamma(context)
            self._serial_plan = Serial(self.gamma)
        if self.para_verify:
            self.window = window_param(self.window, context, self.name)
            self._parallel_plan = Parallel(self.window)
        self._stop = Decision.PARALLEL if self.para_verify else Decision.VERIFY
        self.table = MappingTable()
        self._rate = self.table.rate  # α_b per interval, updated in place
        self.reliability = 1.0
        self.parallel_mode = False

    def _gamma(self, context) -> int:
        if self.gamma is not None:
            return self.gamma
        if context.best_gamma is None:
            raise SimlabError(f"{self.name} needs --gamma (vanilla SD's best γ on this model pair, §4.3)")
        return context.best_gamma()

    def reset(self, prompt: PromptInfo) -> None:
        self.parallel_mode = False

    def plan(self, state: RoundState) -> Plan:
        if self.parallel_mode:
            return self._parallel_plan
        self.reliability = self.prior  # Γ_0 (Alg. 1 line 4)
        # line 5: for k = 1 to L - len(x) (a Serial built without its Python-level __new__:
        # a plan per serial round)
        return tuple.__new__(Serial, (state.remaining, False, None, 0))

    def on_draft(self, signal: TokenSignal) -> Decision:
        # eq. 3, lines 8-10 (the table's alpha() read inline: this runs per drafted token)
        self.reliability *= self._rate[confidence_bin(signal.confidence)]
        stop = self.reliability <= self.tau  # eq. 4; line 11
        if not stop:
            return DRAFT
        self.parallel_mode = self.para_verify  # line 12
        return self._stop

    def observe(self, outcome: Outcome) -> None:
        checked, accepted = outcome.checked, outcome.accepted
        self.table.record_checked(map(CONFIDENCE, checked), accepted)  # line 29
        self.parallel_mode = outcome.parallel and accepted == len(checked)  # lines 30-39: none rejected


class SpideNoDynaDraft(Spide):
    name = "spide-no-dyna-draft"
    summary = "SPIDE ablation w/o dyna-draft: a fixed γ serial draft, then parallel draft verification"
    paper = "Xu et al., SPIDE §4.3, Table 5"
    params = (Param("gamma", None, "serial draft length (none: vanilla SD's best γ on the trace, as in §4.3)", COUNT),
              WINDOW)
    choices = WINDOW_CHOICES
    dyna_draft = False

    def plan(self, state: RoundState) -> Plan:
        return self._parallel_plan if self.parallel_mode else self._serial_plan

    def on_draft(self, signal: TokenSignal) -> Decision:
        if signal.index != self.gamma:  # a fixed γ, then parallel verification
            return DRAFT
        self.parallel_mode = True
        return self._stop


class SpideNoParaVerify(Spide):
    name = "spide-no-para-verify"
    summary = "SPIDE ablation w/o para-verify: mapping-table reliability Γ vs τ, then a serial verification"
    paper = "Xu et al., SPIDE §4.3, Table 5, Appendix D.6"
    params = (TAU, PRIOR)
    choices = TABLE_CHOICES
    parallel = False
    para_verify = False

"""PEARL (Liu et al., ICLR 2025): parallel speculative decoding with pre-verify and post-verify
(arXiv:2408.11850, docs/policies/pearl.md; ``src/engine.py`` of smart-lty/ParallelSpeculativeDecoding;
SPIDE §1, Fig. 1b).

Every step runs both models at once: the draft drafts γ tokens while the target runs one forward.
The two modes are exactly the two cases of a parallel round of :mod:`simlab.policies.rounds`:

- PRE (no drafts pending, m = 0): the target checks the first of the γ new drafts. Rejected:
  the target's token is emitted, all drafts are dropped, stay PRE. Accepted: emit it, keep the
  other γ − 1 drafts pending, switch to POST. Either way one token is emitted.
- POST (m = γ − 1 pending): the target checks the pending drafts and the first new one. All
  accepted: emit the γ tokens, keep the γ − 1 other new drafts pending, stay POST. First
  rejection at n: emit n accepted tokens and the target's correction, drop the rest, go PRE.

So the policy only sets the window; the modes follow from what is pending. The adaptive draft
length of the paper's title is the run of POST steps.
"""

from __future__ import annotations

from typing import Any

from simlab.policies.base import COUNT, Parallel, Param, Plan, Policy, RoundState
from simlab.policies.timing import window_param


class Pearl(Policy):
    name = "pearl"
    summary = "PEARL: draft and target always in parallel, pre-verify / post-verify, window γ = draft/target speed"
    paper = "Liu et al. 2025, PEARL, arXiv:2408.11850 (docs/policies/pearl.md); SPIDE §1, Fig. 1b, §4.1 baseline (v)"
    params = (Param("window", None, "γ, drafts per step (none: target time / draft time from the latency "
                                    "model, SPIDE eq. 6's rule; PEARL's scripts use 3-5)", COUNT),)
    parallel = True

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self.window = window_param(self.window, context, self.name)
        self._plan = Parallel(self.window)

    def plan(self, state: RoundState) -> Plan:
        return self._plan

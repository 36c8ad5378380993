"""Hugging Face transformers' assisted generation: the heuristic schedule and the confidence
criterion (docs/policies/hf.md; ``AssistedCandidateGenerator`` in transformers' ``candidate_generator.py``)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from simlab.common.signals import TokenSignal
from simlab.policies.base import (
    BOOL,
    COUNT,
    PROBABILITY,
    Outcome,
    Param,
    Plan,
    Policy,
    PromptInfo,
    RoundState,
    Serial,
    choice,
)
from simlab.policies.stop import StopRule

SCHEDULES = ("constant", "heuristic", "heuristic_transient")
SCHEDULE_HELP = ("num_assistant_tokens_schedule: constant keeps N; heuristic: N += 2 after a round whose drafts "
                 "were all accepted, else N = max(1, N - 1), kept from prompt to prompt; heuristic_transient: the "
                 "same, N restarting with each prompt")


class AssistantTokens:
    """HF's ``num_assistant_tokens`` N under its ``num_assistant_tokens_schedule``
    (``AssistedCandidateGenerator.update_candidate_strategy``): "heuristic" adds 2 after a round
    in which every drafted token was accepted and takes 1 away otherwise (at least 1, no upper
    cap); "heuristic_transient" does the same but restarts from the initial N with each
    ``generate()`` call (each prompt); "constant" never moves N.

    "All accepted" compares with the tokens actually drafted, which the confidence criterion
    may have cut short, as transformers does (``num_matches == len(candidates)``).
    """

    def __init__(self, initial: int, schedule: str):
        self.initial, self.schedule, self.n = initial, schedule, initial

    def reset(self) -> None:
        if self.schedule == "heuristic_transient":
            self.n = self.initial

    def observe(self, outcome: Outcome) -> None:
        if self.schedule == "constant" or not outcome.drafted:
            return
        self.n = self.n + 2 if outcome.accepted == outcome.drafted else max(1, self.n - 1)


class HfHeuristic(Policy):
    """``num_assistant_tokens_schedule="heuristic"``: draft N tokens; after a round in which
    every drafted token was accepted N += 2, otherwise N = max(1, N − 1); no upper cap.

    N is written back to the assistant's generation config at the end of ``generate()``, so it
    persists from prompt to prompt; ``schedule="heuristic_transient"`` restarts it instead.
    """

    name = "hf-heuristic"
    stops_at_draft_end = True  # the assistant's generate() stops at its end token
    summary = "HF assisted generation's heuristic schedule: +2 after a fully accepted round, -1 otherwise"
    paper = "transformers AssistedCandidateGenerator, schedule 'heuristic' (docs/policies/hf.md)"
    params = (
        Param("gamma", 5, "initial num_assistant_tokens N (5: the default that came with 'heuristic')", COUNT,
              aliases=("num_assistant_tokens",)),
        Param("schedule", "heuristic", SCHEDULE_HELP, choice(*SCHEDULES[1:]),
              aliases=("num_assistant_tokens_schedule",)),
    )
    choices = "a round that drafts nothing (a prompt's last position) leaves N unchanged"

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self.n = AssistantTokens(self.gamma, self.schedule)

    def reset(self, prompt: PromptInfo) -> None:
        self.n.reset()

    def plan(self, state: RoundState) -> Plan:
        return Serial(self.n.n, fixed=True)

    def observe(self, outcome: Outcome) -> None:
        self.n.observe(outcome)


def roc_threshold(scores: Sequence[float], accepted: Sequence[bool]) -> float:
    """HF's re-tuned threshold: over the thresholds of scikit-learn's ``roc_curve`` (+inf, then
    every distinct score, descending; predict "accept" when score >= threshold), the first that
    minimises FPR + 3·FNR."""
    pairs = sorted(zip(scores, accepted), reverse=True)
    positives = sum(accepted)
    negatives = len(pairs) - positives
    best, best_cost = math.inf, 3.0  # at +inf nothing is predicted accepted: FPR 0, FNR 1
    tp = fp = 0
    for i, (score, label) in enumerate(pairs):
        tp += label
        fp += not label
        if i + 1 < len(pairs) and pairs[i + 1][0] == score:
            continue  # all samples with this score count at this threshold
        cost = fp / negatives + 3 * (1 - tp / positives)
        if cost < best_cost:
            best, best_cost = score, cost
    return best


class HfConfidence(StopRule):
    """``assistant_confidence_threshold``: stop drafting after a token whose probability is below
    the threshold (the token is kept), at most ``num_assistant_tokens`` N per round, N moving
    with ``num_assistant_tokens_schedule`` as in transformers ≥ 4.45, where the schedule and the
    confidence criterion apply together (``schedule="heuristic"`` is HF's combination).

    With ``retune``, the online ROC re-tuning ("an unsupervised DISCO", Mamou et al. 2024) runs
    as transformers does when scikit-learn is installed: after each verification every checked
    token is a sample (accepted = 1, the first rejected = 0); with more than 5 samples of both
    kinds the threshold becomes :func:`roc_threshold` of them. A threshold of 0 (the criterion
    off) is never re-tuned: transformers keeps samples and re-tunes only while
    ``assistant_confidence_threshold`` is truthy.
    """

    name = "hf-confidence"
    stops_at_draft_end = True  # the assistant's generate() stops at its end token
    summary = "HF assisted generation's confidence criterion: stop when the draft's probability < threshold"
    paper = ("transformers ConfidenceCriteria; ROC re-tuning of PR #33258 after DISCO, arXiv:2405.04304 "
             "(docs/policies/hf.md)")
    params = (
        Param("threshold", 0.4, "assistant_confidence_threshold", PROBABILITY,
              aliases=("assistant_confidence_threshold",)),
        Param("max_draft", 20, "num_assistant_tokens N, the most drafts a round (the initial N under a heuristic "
              "schedule)", COUNT, aliases=("num_assistant_tokens",)),
        Param("schedule", "constant", SCHEDULE_HELP, choice(*SCHEDULES), aliases=("num_assistant_tokens_schedule",)),
        Param("retune", False, "re-tune the threshold online from the ROC of past drafts", BOOL),
    )
    choices = ("retune: the new threshold applies from the next round; samples and threshold restart with "
               "each prompt (one generate() call), as in the newest transformers source")

    def __init__(self, context, **values: Any):
        super().__init__(context, **values)
        self.n = AssistantTokens(self.max_draft, self.schedule)
        self.reset(None)

    def reset(self, prompt: PromptInfo | None) -> None:
        self.level = self.threshold
        self._scores: list[float] = []
        self._labels: list[bool] = []
        self.n.reset()

    def plan(self, state: RoundState) -> Plan:
        return Serial(self.n.n)

    def stops(self, signal: TokenSignal) -> bool:
        return signal.confidence < self.level

    def observe(self, outcome: Outcome) -> None:
        self.n.observe(outcome)
        if not self.retune or not self.level:  # transformers re-tunes only a threshold that is on
            return
        for i, signal in enumerate(outcome.checked):
            self._scores.append(signal.confidence)
            self._labels.append(i < outcome.accepted)
        positives = sum(self._labels)
        if len(self._labels) > 5 and 0 < positives < len(self._labels):
            self.level = roc_threshold(self._scores, self._labels)


def assistant_settings(policy: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The assistant's generation-config fields with which transformers' assisted generation drafts
    as ``policy`` does with ``params`` (every parameter, defaults included), or None where
    transformers has no such rule. ``sd`` is the constant schedule with the confidence stop off
    (its default of 0.4 would cut drafts short); ``hf-heuristic`` drafts without the stop too.
    transformers reads these from the *assistant's* config (simlab/live/hf.py). Re-tuning
    (``hf-confidence``'s ``retune``) is no field: transformers re-tunes whenever scikit-learn is
    installed."""
    if policy == "sd":
        return {"num_assistant_tokens": params["gamma"], "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
    if policy == HfHeuristic.name:
        return {"num_assistant_tokens": params["gamma"], "num_assistant_tokens_schedule": params["schedule"],
                "assistant_confidence_threshold": 0.0}
    if policy == HfConfidence.name:
        return {"num_assistant_tokens": params["max_draft"], "num_assistant_tokens_schedule": params["schedule"],
                "assistant_confidence_threshold": params["threshold"]}
    return None

"""vLLM's adaptive verification as a batch-level policy: every request drafts K, the step verifies
only the draft slots most likely to survive, as many as pay for their verification.

What vLLM does (read in vllm-project/vllm's ``main``; the engine runs it on GPUs only, in its
"Model Runner V2" path, so on a CPU this is simulation only):

- PR #47808 ("[Spec Decode] DSpark confidence-scheduled verification", 2026-07),
  ``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``: ``_assign_draft_token_budget``
  scores every (request, draft position) slot by its **survival probability**, the running
  product of that request's per-position acceptance probabilities, and admits the globally best
  ``draft_budget`` slots (survival falls along a request, so each request verifies a prefix of
  its drafts); ``AdaptiveVerificationManager.get_num_tokens`` picks the budget b that maximises
  ``(requests sampling + sum of the b best survivals) / (draft cost[requests] + verify
  cost[non-draft tokens + b])``, from cost curves timed with dummy steps at start-up
  (``batches_to_profile``, ``build_cost_tables_from_curves``).
- PR #52228 ("[Model Runner V2] Acceptance estimation for adaptive verification", 2026-08),
  ``vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py``, ``OnlineAcceptanceEstimator``:
  for drafters without DSpark's trained confidence head the per-position probability is
  ``sigmoid(slope * feature + bias[k])`` with the feature ``logit(q)`` of the drafted token (its
  log-probability against the rest of the row), one slope shared by all positions and an
  intercept per position. After every step the previous step's graded drafts are folded into
  Newton-IRLS sufficient statistics: position k (0-based) of a request is an observation when the
  chain reached it and it was verified (``k <= accepted`` and ``k < admitted``), labelled accepted
  when ``k < accepted``. Every ``REFIT_INTERVAL`` = 100 steps one Newton step is taken from that
  round's statistics alone (the intercepts profiled out of the arrowhead information matrix, so
  the slope's step is a scalar equation), each step damped by ``n / (n + 50)`` for the ``n``
  observations behind it (``DAMPING_OBSERVATIONS``), a ridge of 1e-3 (``L2``), a step that
  would make the slope negative or NaN dropped; the statistics are then cleared. Initialisation:
  slope 0 and every intercept 1.5 (sigmoid 0.82: "a bias matching a plausible acceptance rate
  makes the initial estimate uniform, which still lets the cost model size the budget"). For the
  first ``NUM_WARMUP_REFITS`` = 3 refits whole draft blocks are verified, so the labels the fit
  learns from are not censored by its own trimming.

There is no learning rate: the damped Newton step is the whole update, with the constants above
(vLLM's; :class:`AcceptanceFit` holds them, and only tests change them).

What simlab chose where its engine differs or the sources are silent:

- **The cost curve** is the engine's own price of the step (:class:`~simlab.latency.batch.BatchLatency`):
  the draft phase just priced plus the batched verification of each request's admitted drafts
  and its bonus token, evaluated for every candidate budget — the stand-in for vLLM's start-up
  profile, which times steps by token count only. Under a padded (measured-batch) latency model
  the price depends on how the b tokens spread over requests, so each candidate is priced as
  the admission it would make. Ties go to the smaller budget (numpy's ``argmax``, as vLLM).
- **Drafting**: every running request drafts its own policy's K (at most the option's N), as
  vLLM's drafter proposes K for every request before verification is trimmed: a slot's survival
  needs that slot's own draft probability, which exists only once it is drafted. The draft
  forwards of slots not admitted are paid for and their tokens discarded unverified.
- **No staleness**: vLLM sizes the budget on the CPU from the previous step's confidences (an
  asynchronous copy) and admits slots on the GPU from this step's; the simulator has no such
  race and uses this step's for both. vLLM #47808's EMA of a request's DSpark confidence
  (``adaptive_verification_ema_alpha``) belongs to the confidence head and is not modelled.
- **The feature** is ``logit(confidence)``, the trace's draft top-1 probability: drafting is
  greedy in the traces, so the drafted token is the mode and its q is that probability; clamped
  to ±40 as vLLM clamps it (``_MAX_MARGIN``).
- An acceptance cut by the prompt's end counts as the simulator counts it (the end token is the
  target's), so a draft at a prompt's last position is labelled rejected.
- The request's own policy must not adapt to outcomes or draft trees (``sd`` and ``vllm`` qualify):
  its round protocol would otherwise see drafts the step never verified as checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from simlab.common.errors import SimlabError
from simlab.latency.batch import BatchLatency

# vLLM's constants (acceptance_estimator.py, OnlineAcceptanceEstimator; see the module docstring)
PRIOR_BIAS = 1.5
REFIT_STEPS = 100
WARMUP_REFITS = 3
DAMPING_OBSERVATIONS = 50.0
RIDGE = 1e-3
MAX_FEATURE = 40.0


def feature(confidence: float) -> float:
    """``logit(q)`` of a drafted token whose draft probability is ``confidence``, clamped to ±40."""
    if confidence >= 1.0:
        return MAX_FEATURE
    if confidence <= 0.0:
        return -MAX_FEATURE
    return max(-MAX_FEATURE, min(MAX_FEATURE, math.log(confidence) - math.log1p(-confidence)))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


@dataclass
class AcceptanceFit:
    """vLLM's online acceptance estimate: ``p_k = sigmoid(slope * feature + bias[k])``, refit by
    one damped Newton-IRLS step per ``refit_steps`` engine steps from what was verified since."""

    positions: int
    refit_steps: int = REFIT_STEPS
    warmup_refits: int = WARMUP_REFITS
    damping: float = DAMPING_OBSERVATIONS
    ridge: float = RIDGE
    slope: float = 0.0
    bias: list[float] = field(default_factory=list)
    refits: int = 0
    steps: int = 0
    # the round's sufficient statistics: the slope's own information and score (shared), and per
    # position the slope/intercept coupling, the intercept's information, its score and count
    info_ss: float = 0.0
    score_s: float = 0.0
    info_sb: list[float] = field(default_factory=list)
    info_bb: list[float] = field(default_factory=list)
    score_b: list[float] = field(default_factory=list)
    counts: list[float] = field(default_factory=list)
    # every round's observations and acceptances per position, never cleared (what the fit has seen)
    seen: list[int] = field(default_factory=list)
    seen_accepted: list[int] = field(default_factory=list)
    seen_predicted: list[float] = field(default_factory=list)  # the probabilities predicted for them, summed

    def __post_init__(self) -> None:
        n = self.positions
        self.bias = self.bias or [PRIOR_BIAS] * n
        self.seen, self.seen_accepted, self.seen_predicted = [0] * n, [0] * n, [0.0] * n
        self._clear()

    def _clear(self) -> None:
        n = self.positions
        self.info_ss = self.score_s = 0.0
        self.info_sb, self.info_bb, self.score_b, self.counts = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n

    @property
    def warming_up(self) -> bool:
        """True while whole drafts are verified (the first ``warmup_refits`` refits)."""
        return self.refits < self.warmup_refits

    def probabilities(self, features: Sequence[float]) -> list[float]:
        """The acceptance probability of each drafted position (feature ``features[k]`` at 0-based k)."""
        slope, bias = self.slope, self.bias
        return [_sigmoid(slope * x + bias[k]) for k, x in enumerate(features)]

    def observe(self, features: Sequence[float], probs: Sequence[float], admitted: int, accepted: int) -> None:
        """Fold one request's verified outcome in: its drafts' features and the probabilities
        predicted for them when they were drafted, how many were verified and accepted. Only
        positions the target judged are read (k <= accepted, k < admitted)."""
        for k in range(min(accepted + 1, admitted)):
            x, p = features[k], probs[k]
            w, r = p * (1.0 - p), (1.0 if k < accepted else 0.0) - p
            self.info_ss += w * x * x
            self.score_s += r * x
            self.info_sb[k] += w * x
            self.info_bb[k] += w
            self.score_b[k] += r
            self.counts[k] += 1.0
            self.seen[k] += 1
            self.seen_accepted[k] += k < accepted
            self.seen_predicted[k] += p

    def step(self) -> None:
        """An engine step ended: every ``refit_steps`` steps, refit and start a new round."""
        self.steps += 1
        if self.steps % self.refit_steps:
            return
        self._refit()

    def _refit(self) -> None:
        """One Newton step, the intercepts profiled out: the slope's step is
        (g_s - Σ b_k g_k / c_k) / (a - Σ b_k² / c_k), each intercept's (g_k - b_k step_s) / c_k,
        each damped by n / (n + damping) for the observations behind it."""
        ridge, damping = self.ridge, self.damping
        cs = [c + ridge for c in self.info_bb]
        den = self.info_ss + ridge - sum(b * b / c for b, c in zip(self.info_sb, cs))
        step_s = (self.score_s - sum(b * g / c for b, g, c in zip(self.info_sb, self.score_b, cs))) / den
        total = sum(self.counts)
        step_s *= total / (total + damping)
        if math.isnan(step_s) or self.slope + step_s < 0.0:
            step_s = 0.0
        self.slope += step_s
        for k, (b, c, g, n) in enumerate(zip(self.info_sb, cs, self.score_b, self.counts)):
            step_b = (g - b * step_s) / c * n / (n + damping)
            if not math.isnan(step_b):
                self.bias[k] += step_b
        self.refits += 1
        self._clear()


def survival(probs: Sequence[float]) -> list[float]:
    """The running product: slot j survives when positions 1..j are all accepted."""
    out, s = [], 1.0
    for p in probs:
        s *= p
        out.append(s)
    return out


def admit(survivals: Sequence[Sequence[float]], budget: int) -> list[int]:
    """Each request's admitted drafts when the ``budget`` slots of highest survival are admitted
    (ties: the earlier request, then the earlier position, so a request's slots stay a prefix)."""
    slots = sorted(((-s, i, j) for i, row in enumerate(survivals) for j, s in enumerate(row)))[:budget]
    counts = [0] * len(survivals)
    for _, i, _ in slots:
        counts[i] += 1
    return counts


def choose_budget(survivals: Sequence[Sequence[float]], seconds: Callable[[list[int]], float],
                  sampling: int) -> tuple[int, list[int]]:
    """The budget b (and its admission) that maximises expected tokens per second of the step:
    ``(sampling + the b best survivals summed) / seconds(admission of b)`` for b = 0..all slots."""
    order = sorted((-s, i, j) for i, row in enumerate(survivals) for j, s in enumerate(row))
    counts = [0] * len(survivals)
    tokens = float(sampling)
    best = (tokens / seconds(counts), 0, list(counts))
    for b, (neg, i, _) in enumerate(order, start=1):
        counts[i] += 1
        tokens -= neg
        rate = tokens / seconds(counts)
        if rate > best[0]:
            best = (rate, b, list(counts))
    return best[1], best[2]


@dataclass
class AdaptiveVerify:
    """Every request drafts at most ``max_draft``; the step verifies the slots of highest
    survival under the budget with the most expected tokens per second of step time."""

    latency: BatchLatency
    max_draft: int
    fit: AcceptanceFit | None = None  # vLLM's constants unless given
    name: str = "adaptive-verify"
    # the step's drafts, kept until their verification is observed: (features, probabilities) per request
    _pending: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.fit is None:
            self.fit = AcceptanceFit(self.max_draft)

    def cap(self, requests, ctxs) -> int | None:
        return self.max_draft

    def verified(self, confidences: Sequence[Sequence[float]], ctxs: Sequence[int], draft_seconds: float) -> list[int]:
        """How many of its drafts each request verifies this step, given their draft confidences
        (what the engine knows once the draft phase ends), the requests' contexts and what the
        draft phase cost."""
        fit = self.fit
        features = [[feature(c) for c in row] for row in confidences]
        probs = [fit.probabilities(row) for row in features]
        self._pending = list(zip(features, probs))
        drafted = [len(row) for row in confidences]
        if fit.warming_up or not any(drafted):
            return drafted
        latency = self.latency

        def seconds(counts: list[int]) -> float:
            return draft_seconds + latency.target([k + 1 for k in counts], ctxs)

        _, counts = choose_budget([survival(p) for p in probs], seconds, len(confidences))
        return counts

    def observe(self, admitted: Sequence[int], accepted: Sequence[int]) -> None:
        """The step's verification is settled: each request verified ``admitted[i]`` drafts and
        accepted ``accepted[i]``; fold them into the fit (the only acceptance bits it ever sees)."""
        for (features, probs), a, acc in zip(self._pending, admitted, accepted):
            self.fit.observe(features, probs, a, acc)
        self._pending = []
        self.fit.step()


def check_inner(policy) -> None:
    """The request's own policy must be one whose rounds may be trimmed after drafting."""
    if policy.drafts_trees or policy.looks_up or policy.observes():
        raise SimlabError(f"--adaptive-verify trims a round after it is drafted, which {policy.name} cannot take "
                          "(it drafts trees, looks tokens up or adapts to what was verified); use --policy sd or vllm")

"""Batch-level drafting policies: a cap on every request's draft length, chosen per engine step.

A per-request policy (vanilla SD, an adaptive stop rule...) decides how far *its* request
drafts; under load the right length also depends on how many requests share the step. A
batch-level policy looks at the step — its batch size and, for SmartSpec, the acceptance seen
so far — and caps every running request's draft length for that step. The request's own
policy still plans and stops as it would; it only drafts no more than the cap (a cap of 0
makes the round a plain target step; a tree round drafts at most the cap's number of levels).
Four of them:

- ``table``: a draft length per batch size, as vLLM's dynamic speculation configures it
  (``--gamma-by-batch 1:6,4:4,16:2,32:0``: batches of 1–3 draft ≤ 6, 4–15 ≤ 4, ...), or the
  JSON file ``simlab serve tune`` writes (:mod:`simlab.serve.tune`).
- ``off-above``: speculation off above a batch size (what SGLang users ask for).
- ``smartspec``: the length that maximises the step's goodput — expected tokens the batch
  commits per second — from each request's acceptance history; Liu et al., "Optimizing
  Speculative Decoding for Serving Large Language Models Using Goodput" (SmartSpec), 2024,
  arXiv 2406.14066. See docs/serving.md for the estimate.
- ``adaptive-verify``: vLLM's adaptive verification (vLLM PRs #47808, #52228): every request
  drafts up to the cap, and the step verifies only the draft slots of highest survival
  probability, as many as pay for their verification (:mod:`simlab.serve.adaptive_verify`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, Sequence

from simlab.common.errors import SimlabError
from simlab.common.jsonfile import read_json, read_versioned
from simlab.latency.batch import BatchLatency
from simlab.policies.base import Outcome, Policy, PromptInfo, RoundState, Serial, TreePlan
from simlab.serve.adaptive_verify import AdaptiveVerify

# SmartSpec's acceptance estimate: an exponential moving average over verified draft tokens,
# starting from this prior before a request has any history.
ACCEPTANCE_PRIOR = 0.7
ACCEPTANCE_SMOOTHING = 0.1

# The JSON file of a draft length per batch size (written by ``simlab serve tune``).
TABLE_FORMAT = "simlab-gamma-by-batch"
TABLE_VERSION = 1


class CappedPolicy(Policy):
    """A request's own policy, its serial draft lengths capped by the engine before each step,
    and its acceptance history kept for batch-level policies."""

    name = "capped"
    summary = "a request's policy under a batch-level draft-length cap"
    paper = ""

    def __init__(self, inner: Policy):  # noqa: D107 - wraps a built policy, takes no parameters
        self.inner = inner
        self.cap: int | None = None
        self.acceptance = ACCEPTANCE_PRIOR

    @property
    def needs_shadows(self) -> bool:  # type: ignore[override]
        return self.inner.needs_shadows

    @property
    def needs_future(self) -> bool:  # type: ignore[override]
        return self.inner.needs_future

    @property
    def drafts(self) -> bool:  # type: ignore[override]
        return self.inner.drafts

    def reset(self, prompt: PromptInfo) -> None:
        self.inner.reset(prompt)

    def plan(self, state: RoundState):
        plan = self.inner.plan(state)
        cap = self.cap
        if cap is None:
            return plan
        kind = type(plan)
        if kind is Serial and plan.max_draft > cap:
            return Serial(cap, plan.fixed, plan.layer, plan.min_draft)
        if kind is TreePlan:  # a tree drafts at most ``cap`` levels; none: a plain target step
            if cap == 0:
                return Serial(0, True)
            if plan.tree is not None and plan.tree.depth > cap:
                return TreePlan(plan.tree.cut(cap))
            if plan.tree is None and plan.max_depth > cap:
                return TreePlan(None, plan.topk, cap)
        return plan

    def on_draft(self, signal):
        return self.inner.on_draft(signal)

    def grow(self, candidates):
        return self.inner.grow(candidates)

    def select(self, candidates):
        return self.inner.select(candidates)

    def observe(self, outcome: Outcome) -> None:
        checked = len(outcome.checked)
        if checked:
            rate = outcome.accepted / checked
            self.acceptance += ACCEPTANCE_SMOOTHING * (rate - self.acceptance)
        self.inner.observe(outcome)

    def observe_shadows(self, shadows) -> None:
        self.inner.observe_shadows(shadows)

    def describe(self) -> dict:
        return self.inner.describe()


class BatchPolicy(Protocol):
    """Chooses the draft-length cap of one engine step (None: no cap)."""

    name: str

    def cap(self, requests: Sequence[CappedPolicy], ctxs: Sequence[int]) -> int | None: ...


class NoCap:
    name = "none"

    def cap(self, requests, ctxs) -> int | None:
        return None


@dataclass(frozen=True)
class GammaByBatch:
    """Draft length by batch size: the entry with the largest batch size ≤ B applies."""

    table: tuple[tuple[int, int], ...]  # (min batch size, draft length), sorted by batch size
    name: str = "table"

    def cap(self, requests, ctxs) -> int | None:
        return self.gamma(len(requests))

    def gamma(self, batch: int) -> int | None:
        """The draft length at batch size ``batch`` (None below the smallest entry: no cap)."""
        out = None
        for size, gamma in self.table:
            if size <= batch:
                out = gamma
        return out

    @classmethod
    def parse(cls, text: str) -> "GammaByBatch":
        """``"1:6,4:4,16:0"`` -> batches of 1-3 draft ≤ 6 tokens, 4-15 ≤ 4, 16 and more none."""
        pairs = []
        for item in (p.strip() for p in text.split(",") if p.strip()):
            size, sep, gamma = item.partition(":")
            try:
                pair = (int(size), int(gamma))
            except ValueError:
                pair = None
            if not sep or pair is None or pair[0] < 1 or pair[1] < 0:
                raise SimlabError(f"--gamma-by-batch takes BATCH:GAMMA pairs (BATCH >= 1, GAMMA >= 0), got {item!r}")
            pairs.append(pair)
        sizes = [s for s, _ in pairs]
        if not pairs or sizes != sorted(set(sizes)):
            raise SimlabError(f"--gamma-by-batch needs increasing batch sizes, got {text!r}")
        return cls(tuple(pairs))


def gamma_by_batch_pairs(value: str) -> str:
    """``--gamma-by-batch``'s value as BATCH:GAMMA pairs: the pairs themselves; the
    ``gamma_by_batch`` object of a JSON file written by ``simlab serve tune``
    (``{"1": 6, "4": 3}`` -> ``"1:6,4:3"``; the pairs are checked by :meth:`GammaByBatch.parse`); or a
    vLLM ``--speculative-config`` (its JSON, or a file of it) with ``num_speculative_tokens_per_batch_size``,
    refused in vLLM's words where vLLM would refuse it (:func:`simlab.policies.vllm.schedule_pairs`)."""
    from simlab.policies.vllm import SCHEDULE_KEY, schedule_pairs

    if value.lstrip().startswith("{"):
        try:
            config = json.loads(value)
        except ValueError as exc:
            raise SimlabError(f"--gamma-by-batch: not a --speculative-config JSON object ({exc})") from None
        return _pairs_text(schedule_pairs(config))
    if not (value.endswith(".json") or Path(value).is_file()):
        return value
    what = "--gamma-by-batch file"
    data = read_json(value, what)
    if SCHEDULE_KEY in data:
        return _pairs_text(schedule_pairs(data))
    table = read_versioned(value, what, TABLE_FORMAT, TABLE_VERSION).get("gamma_by_batch")
    if not isinstance(table, dict) or not table:
        raise SimlabError(f"{what} {value} needs a non-empty \"gamma_by_batch\" object of batch size -> draft length")
    pairs = []
    for size, gamma in table.items():
        if not (size.isdigit() and type(gamma) is int):
            raise SimlabError(f"{what} {value}: \"gamma_by_batch\" maps batch sizes to draft lengths, got {size!r}: {gamma!r}")
        pairs.append((int(size), gamma))
    return _pairs_text(sorted(pairs))


def _pairs_text(pairs) -> str:
    return ",".join(f"{size}:{gamma}" for size, gamma in pairs)


@dataclass(frozen=True)
class OffAbove:
    """No speculation in steps whose batch is larger than ``batch``."""

    batch: int
    name: str = "off-above"

    def cap(self, requests, ctxs) -> int | None:
        return 0 if len(requests) > self.batch else None


@dataclass
class SmartSpec:
    """The uniform draft length k ∈ 0..``max_gamma`` with the highest goodput for this step:
    Σ_i E[tokens_i(k)] / (k batched draft steps + one verification of k+1 tokens per request),
    where a request with acceptance estimate a commits E = (1 − a^(k+1)) / (1 − a) tokens
    (i.i.d. acceptance, SmartSpec §4)."""

    latency: BatchLatency
    max_gamma: int
    name: str = "smartspec"

    def cap(self, requests, ctxs) -> int | None:
        b = len(requests)
        best_k, best = 0, -1.0
        for k in range(self.max_gamma + 1):
            tokens = sum(_expected_tokens(r.acceptance, k) for r in requests)
            draft_s, _ = self.latency.draft_phase([k] * b, ctxs) if k else (0.0, 0)
            seconds = draft_s + self.latency.target([k + 1] * b, ctxs)
            if tokens / seconds > best:
                best_k, best = k, tokens / seconds
        return best_k


def _expected_tokens(a: float, k: int) -> float:
    """Tokens one verification commits with k drafts accepted i.i.d. with probability a."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class BatchSpec:
    """The batch-level policy a run asks for (at most one of the four)."""

    gamma_by_batch: str | None = None
    off_above: int | None = None
    smartspec: int | None = None  # the longest draft SmartSpec may choose
    adaptive_verify: int | None = None  # the drafts every request makes under adaptive verification

    def __post_init__(self) -> None:
        """Every check, before anything runs."""
        asked = [name for name, v in (("--gamma-by-batch", self.gamma_by_batch), ("--sd-off-above", self.off_above),
                                      ("--smartspec", self.smartspec), ("--adaptive-verify", self.adaptive_verify))
                 if v is not None]
        if len(asked) > 1:
            raise SimlabError(f"choose one batch-level policy, got {' and '.join(asked)}")
        if self.gamma_by_batch is not None:
            GammaByBatch.parse(self.gamma_by_batch)
        if self.off_above is not None and self.off_above < 1:
            raise SimlabError(f"--sd-off-above must be a batch size >= 1, got {self.off_above}")
        if self.smartspec is not None and self.smartspec < 1:
            raise SimlabError(f"--smartspec must be a longest draft length >= 1, got {self.smartspec}")
        if self.adaptive_verify is not None and self.adaptive_verify < 1:
            raise SimlabError(f"--adaptive-verify must be a draft length >= 1, got {self.adaptive_verify}")

    def describe(self) -> dict:
        """The spec as a cache key's part; without ``adaptive_verify`` when it is not asked for, so
        the keys of serving sweeps cached before it existed stay what they were."""
        out = asdict(self)
        if self.adaptive_verify is None:
            del out["adaptive_verify"]
        return out

    def build(self, latency: BatchLatency, longest: int | None = None) -> BatchPolicy:
        """The batch-level policy; ``longest``: the longest draft any round can make (a trace's
        longest budget less two), past which SmartSpec has no length to weigh (a cap above every
        request's own limit drafts what that limit allows)."""
        if self.gamma_by_batch is not None:
            return GammaByBatch.parse(self.gamma_by_batch)
        if self.off_above is not None:
            return OffAbove(self.off_above)
        if self.smartspec is not None:
            return SmartSpec(latency, self.smartspec if longest is None else max(1, min(self.smartspec, longest)))
        if self.adaptive_verify is not None:
            return AdaptiveVerify(latency, self.adaptive_verify)
        return NoCap()

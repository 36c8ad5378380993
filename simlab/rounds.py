"""The round protocol between a policy and an executor, written once for both executors.

:func:`decode` is a generator that walks one prompt: it asks the policy for a plan, yields
*requests* for the executor to carry out (draft a token, verify, run a parallel round), and
feeds the answers back to the policy. The SimPy simulator answers requests from a trace and a
latency model; the live decoder answers them by running real models. Because both drive the
same generator, the live decoder makes exactly the decisions the simulator replayed, given
the same signals and acceptances.

Bookkeeping rules, defined here only:

- Position 0 comes from the target's prefill; rounds decide positions 1..end-1, where
  ``end`` (``PromptInfo.n_tokens``) is one past the end token or the budget.
- A serial round drafts at most ``budget - committed - 1`` tokens (the decoder knows its
  budget, not where the text will end); when that cap is 0 the round is a plain target step.
- A parallel round (PEARL's pre-/post-verify, SPIDE's parallel draft verification) verifies
  the ``m`` pending drafts plus the first of ``s`` tokens drafted meanwhile. Every rejected
  check emits the target's correction; if all pending drafts and the first new one are
  accepted, the round emits them and the remaining ``s - 1`` new drafts stay pending. The
  window is capped at ``budget - committed - m - 1`` (but at least 1), so that drafts left
  pending never reach the budget's last position: the next round always has a position for
  its first new draft.
- A serial round may end with ``Decision.DROP``: the token just drafted is discarded unverified
  (DEL's dynamic draft exit); it was drafted, so its draft step is still paid for.
- Policies with ``needs_shadows`` are shown every exit layer's token at the positions each
  target forward settled: position 0 after the prefill, and ``start..start+accepted`` after
  each serial verification (:class:`Shadow`).
- A policy with ``stops_at_draft_end`` stops a serial round's drafting after a token whose
  signal says it is an end token (that token is verified); others draft on past it.
- A policy that overrides ``Policy.done`` may end a prompt before its end (an engine's own
  stopping rule); :func:`decode` returns the tokens committed, which executors count.
- Nothing past the end is accepted, and the end token itself always counts as the target's:
  executors accept at most ``end - committed - 1`` drafts per verification, so decoding stops
  exactly at ``end`` whether the draft predicted the end token or not.
"""

from __future__ import annotations

from typing import Generator, NamedTuple, Sequence

from simlab.policies.base import (
    Decision,
    Outcome,
    Parallel,
    Policy,
    PromptInfo,
    RoundState,
    Serial,
)
from simlab.signals import TokenSignal


class DraftToken(NamedTuple):
    """Draft one token: the ``index``-th (1-based) of a run that started at ``start``.
    Answer: its :class:`TokenSignal`."""

    start: int
    index: int
    layer: int | None


class DraftRun(NamedTuple):
    """Draft ``count`` tokens without consulting the policy (a fixed-length plan).
    Answer: their signals, as a sequence (which may build each signal only when read)."""

    start: int
    count: int
    layer: int | None


class Verify(NamedTuple):
    """One target forward over the last committed token and the ``drafts`` tokens drafted from
    ``start``. Answer: how many drafts were accepted (0..drafts)."""

    start: int
    drafts: int
    layer: int | None


class ParallelRound(NamedTuple):
    """The target verifies ``pending`` drafts (from ``start``) and the first new one while the
    draft drafts ``window`` new tokens after them. Answer: a :class:`ParallelResult`."""

    start: int
    pending: int
    window: int


class Shadow(NamedTuple):
    """Every exit layer's token at positions ``start..start+count-1``, from the hidden states of
    the target forward that settled them. Answer: a :class:`ShadowTokens`."""

    start: int
    count: int


class ParallelResult(NamedTuple):
    accepted_pending: int  # 0..pending
    first_new_accepted: bool
    new_signals: Sequence[TokenSignal]


Request = DraftToken | DraftRun | Verify | ParallelRound | Shadow


DRAFT, VERIFY, PARALLEL, DROP = Decision.DRAFT, Decision.VERIFY, Decision.PARALLEL, Decision.DROP


class PolicyError(RuntimeError):
    """A policy broke the protocol (a bug in the policy, not bad user input)."""


def decode(policy: Policy, prompt: PromptInfo) -> Generator[Request, object, int]:
    """Drive ``policy`` through one prompt until ``prompt.n_tokens`` tokens are committed
    (re-read every round: the live decoder lowers it when it meets an end token), or until
    the policy is done; return the tokens committed."""
    budget = prompt.budget
    committed = 1
    pending: tuple[TokenSignal, ...] = ()
    policy.reset(prompt)
    # Policies that keep the base class's no-op observe() are not sent outcomes of serial rounds.
    observes = type(policy).observe is not Policy.observe
    ends_early = type(policy).done is not Policy.done
    plan_round, prompt_len = policy.plan, prompt.prompt_len
    stop_at_end = policy.stops_at_draft_end
    shadows = policy.needs_shadows
    if shadows:  # the prefill settled position 0
        policy.observe_shadows((yield Shadow(0, 1)))
    while committed < prompt.n_tokens:
        if ends_early and policy.done(committed):
            break
        plan = plan_round(RoundState(committed, budget - committed, len(pending), prompt_len + committed))
        if type(plan) is Parallel:
            m = len(pending)
            if plan.window < 1:
                raise PolicyError(f"{policy.name}: parallel window must be >= 1, got {plan.window}")
            window = min(plan.window, max(1, budget - committed - m - 1))
            res: ParallelResult = yield ParallelRound(committed, m, window)
            new = res.new_signals  # read only as far as needed: most rounds drop their new drafts
            if res.accepted_pending < m:
                checked = pending[: res.accepted_pending + 1]
                accepted = res.accepted_pending
                pending = ()
            else:
                checked = (*pending, new[0])
                accepted = m + res.first_new_accepted
                pending = tuple(new[1:]) if res.first_new_accepted else ()
            emitted = res.accepted_pending + 1
            committed += emitted
            policy.observe(Outcome(True, window, checked, accepted, emitted, res.first_new_accepted))
            continue
        if type(plan) is not Serial:
            raise PolicyError(f"{policy.name}: plan() must return Serial or Parallel, got {plan!r}")
        if pending:
            raise PolicyError(f"{policy.name}: planned a serial round with {len(pending)} drafts pending")
        cap = budget - committed - 1
        if plan.max_draft < cap:
            cap = plan.max_draft
        if (plan.fixed and not stop_at_end) or cap <= 0:
            signals = (yield DraftRun(committed, cap, plan.layer)) if cap > 0 else ()
            decision = VERIFY
        else:  # token by token: the policy decides, or (fixed plans) only the end token stops
            drafted: list[TokenSignal] = []
            decision = DRAFT
            while decision is DRAFT and len(drafted) < cap:
                signal = yield DraftToken(committed, len(drafted) + 1, plan.layer)
                drafted.append(signal)
                if stop_at_end and signal.end:
                    decision = VERIFY
                elif not plan.fixed:
                    decision = policy.on_draft(signal)
            signals = tuple(drafted[:-1] if decision is DROP else drafted)
        if decision is PARALLEL:
            if not policy.parallel:
                raise PolicyError(f"{policy.name}: returned PARALLEL but is not a parallel policy")
            pending = tuple(signals)
            continue
        k = len(signals)
        start = committed
        accepted = yield Verify(start, k, plan.layer)
        committed += accepted + 1
        if observes:
            policy.observe(Outcome(False, k, signals[: accepted + 1], accepted, accepted + 1))
        if shadows:
            policy.observe_shadows((yield Shadow(start, accepted + 1)))
    return committed

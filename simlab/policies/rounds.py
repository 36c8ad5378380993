"""The round protocol between a policy and an executor, written once for both executors.

:func:`decode` is a generator that walks one prompt: it asks the policy for a plan, yields
*requests* for the executor to carry out (draft a token, verify, run a parallel round), and
feeds the answers back to the policy. The SimPy simulator answers requests from a trace and a
latency model; the live decoder answers them by running real models. Because both drive the
same generator, the live decoder makes exactly the decisions the simulator replayed, given
the same signals and acceptances.

A serial round that the policy decides token by token is one :class:`DraftLoop` request: the
executor runs :meth:`DraftLoop.run` with its own way of drafting one token, so the loop (cap,
end-token stop, the policy's decisions) is written here once and a round costs one generator
round trip, not one per drafted token.

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
- A serial plan's ``min_draft`` discards a draft that ends shorter than it (after any DROP)
  the same way, whole: the round verifies no draft (a plain target step) and its draft steps
  are still paid for (llama.cpp's ``--draft-min``).
- Policies with ``needs_shadows`` are shown every exit layer's token at the positions each
  target forward settled: position 0 after the prefill, and ``start..start+accepted`` after
  each serial verification (:class:`Shadow`).
- A policy with ``stops_at_draft_end`` stops a serial round's drafting after a token whose
  signal says it is an end token (that token is verified); others draft on past it.
- A tree round (:class:`~simlab.policies.base.TreePlan`) drafts at most ``budget - committed - 1``
  levels (a fixed tree is cut to that depth) and verifies every node in one target forward;
  greedy verification accepts the longest path of nodes whose tokens are the target's, and the
  round emits it plus the target's token (live at temperature > 0 the path is sampled instead:
  SpecInfer's multi-step speculative sampling, :mod:`simlab.live.executor`). It is priced as a target forward of ``nodes + 1``
  tokens and one draft forward per level over the nodes expanded there (the root, then the
  nodes with children); a width-one tree is a serial round of the same drafts, number for
  number. Tree rounds are not passed to ``observe`` (no tree policy adapts across rounds).
- A lookup round (:class:`~simlab.policies.base.Lookup`: prompt lookup, suffix decoding, REST)
  proposes at most ``budget - committed - 1`` tokens from what the decoder holds — the prompt and
  the tokens committed, never a later one: the executor hands :meth:`Policy.propose` exactly
  those (:class:`Propose`) and prices the lookup (:meth:`Policy.lookup_seconds`) — and the target
  verifies them in one forward (:class:`VerifyTokens`), accepting the longest prefix that is its
  own greedy continuation; it emits those plus the target's token. A lookup that proposes
  nothing makes the round a plain target step (with the plan's ``fallback``, a serial round of
  the draft model instead), and with a cap of 0 no lookup runs. Lookup rounds are passed to
  ``observe`` with no signals (``checked`` empty). After a prompt's last round a policy that
  overrides ``Policy.settle`` sees the whole context once more (:class:`Propose` with cap 0,
  not priced), as vLLM's suffix cache takes a finished request's response.
- A policy that overrides ``Policy.done`` may end a prompt before its end (an engine's own
  stopping rule); :func:`decode` returns the tokens committed (those the policy's ``kept``
  keeps: an engine may cut what it accepted past its stop), which executors count.
- Nothing past the end is accepted, and the end token itself always counts as the target's:
  executors accept at most ``end - committed - 1`` drafts per verification, so decoding stops
  exactly at ``end`` whether the draft predicted the end token or not.
"""

from __future__ import annotations

from itertools import islice
from typing import Callable, Generator, Iterator, NamedTuple, Sequence

from simlab.common.signals import TokenSignal
from simlab.policies.base import (
    Decision,
    Lookup,
    Outcome,
    Parallel,
    Policy,
    PromptInfo,
    RoundState,
    Serial,
    TreePlan,
)
from simlab.trees.candidates import Candidates
from simlab.trees.draft_tree import ROOT, DraftTree


class DraftLoop(NamedTuple):
    """Draft token by token from ``start``, at most ``cap`` tokens, showing each token's signal
    to ``on_draft`` (the policy's; None for a fixed plan, which only an end token stops when
    ``stop_at_end``). ``stops``: the policy's :meth:`~simlab.policies.base.Policy.stop_rule`,
    the test its ``on_draft`` answers VERIFY on, called in its place. Answer: what :meth:`run`
    returns — the executor calls it with its own drafted tokens, so the loop and its stopping
    rules are written here once and a round costs one request, not one per token."""

    start: int
    cap: int
    layer: int | None
    on_draft: Callable[[TokenSignal], Decision] | None
    stop_at_end: bool
    stops: Callable[[TokenSignal], bool] | None = None

    def run(self, signals: Iterator[TokenSignal]) -> tuple[list[TokenSignal], Decision]:
        """Draft from ``signals`` (the run's tokens in order, each drafted when read: the loop
        reads no further than it drafts) until the policy decides or ``cap`` tokens are drafted.
        Returns the drafted signals and the last decision (DRAFT when the cap ended the run).

        It applies the rule of :meth:`decide` inline rather than calling it (a call per token is
        a large share of a replayed round); tests/test_draft_end.py pins the two to the same
        decisions. The simulator drafts a round that has a stop rule or ``on_draft`` without
        this loop, by ``PromptReplay.draft_until`` (the same loop fused with the replay's
        signals; tests/test_replay.py pins the two together)."""
        drafted: list[TokenSignal] = []
        if self.cap <= 0:
            return drafted, DRAFT
        cap, append, on_draft, stop_at_end, stops = self.cap, drafted.append, self.on_draft, self.stop_at_end, self.stops
        for signal in islice(signals, cap):  # islice reads no token past the cap
            append(signal)
            if stop_at_end and signal.end:
                return drafted, VERIFY
            if stops is not None:
                if stops(signal):
                    return drafted, VERIFY
            elif on_draft is not None:
                decision = on_draft(signal)
                if decision is not DRAFT:
                    return drafted, decision
        if len(drafted) < cap:
            raise PolicyError("the executor's drafted tokens ran out before the round ended")
        return drafted, DRAFT

    def decide(self, signal: TokenSignal) -> Decision:
        """The decision after a drafted token's ``signal`` (DRAFT: go on, if the cap allows). An
        executor that cannot hand :meth:`run` its tokens one by one (the batched decoder drafts
        every row in one forward) calls this after each token instead, then answers
        ``(drafted, decision)``."""
        if self.stop_at_end and signal.end:
            return VERIFY
        if self.stops is not None:
            return VERIFY if self.stops(signal) else DRAFT
        return self.on_draft(signal) if self.on_draft is not None else DRAFT


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


class ExpandTree(NamedTuple):
    """One draft forward of a growing tree from ``start``: the top-``topk`` children of each node
    of ``expand`` (candidate numbers of the round, ``ROOT`` at depth 1), which are at ``depth - 1``.
    Answer: (parent, rank, probability) per child, in the order of ``expand``, then rank."""

    start: int
    depth: int
    expand: tuple[int, ...]
    topk: int


class VerifyTree(NamedTuple):
    """One target forward over the last committed token and ``tree``'s nodes, drafted from
    ``start`` by draft forwards over ``widths`` nodes per level. ``grown``: the nodes are
    candidates of :class:`ExpandTree` answers (else ranks among the draft's candidates on the
    true prefix). Answer: how many nodes the accepted path holds."""

    start: int
    tree: DraftTree
    widths: tuple[int, ...]
    grown: bool


class Propose(NamedTuple):
    """A lookup from ``start``: the executor calls ``propose(context, cap)`` with the tokens it
    holds there — the prompt's and the ``start`` tokens committed, nothing later — and prices it
    by ``seconds(len(context))`` (the live executor times it too), unless ``cap`` is 0 (a policy's
    ``settle`` at a prompt's end). Answer: the proposal, at most ``cap`` tokens, as a tuple."""

    start: int
    cap: int
    propose: Callable[[Sequence[int], int], Sequence[int]]
    seconds: Callable[[int], float]


class VerifyTokens(NamedTuple):
    """One target forward over the last committed token and ``tokens``, looked up from ``start``.
    Answer: how many of them the target accepted (the longest prefix that is its own greedy
    continuation; 0..len(tokens))."""

    start: int
    tokens: tuple[int, ...]


class ParallelResult(NamedTuple):
    accepted_pending: int  # 0..pending
    first_new_accepted: bool
    new_signals: Sequence[TokenSignal]


Request = DraftLoop | DraftRun | Verify | ParallelRound | Shadow | ExpandTree | VerifyTree | Propose | VerifyTokens


DRAFT, VERIFY, PARALLEL, DROP = Decision.DRAFT, Decision.VERIFY, Decision.PARALLEL, Decision.DROP


class PolicyError(RuntimeError):
    """A policy broke the protocol (a bug in the policy, not bad user input)."""


def decode(policy: Policy, prompt: PromptInfo) -> Generator[Request, object, int]:
    """Drive ``policy`` through one prompt until ``prompt.n_tokens`` tokens are committed
    (re-read every round: the live decoder lowers it when it meets an end token), or until
    the policy is done; return the tokens committed that the policy keeps (``Policy.kept``)."""
    budget = prompt.budget
    committed = 1
    pending: tuple[TokenSignal, ...] = ()
    policy.reset(prompt)
    observes = policy.observes()  # no outcomes are built for a policy that does not use them
    ends_early = type(policy).done is not Policy.done
    plan_round, prompt_len = policy.plan, prompt.prompt_len
    stop_at_end = policy.stops_at_draft_end
    stops, on_draft = policy.stop_rule(), policy.on_draft
    shadows = policy.needs_shadows
    settles = type(policy).settle is not Policy.settle
    # tuple.__new__ builds the named tuples of a round (requests, states, outcomes) without the
    # Python-level __new__ each named tuple has: several per simulated round, a large share of
    # a round's cost for policies that draft a token or two (every field is given, in order)
    build = tuple.__new__
    if shadows:  # the prefill settled position 0
        policy.observe_shadows((yield Shadow(0, 1)))
    while committed < prompt.n_tokens:
        if ends_early and policy.done(committed):
            break
        plan = plan_round(build(RoundState, (committed, budget - committed, len(pending), prompt_len + committed)))
        kind = type(plan)
        if kind is Parallel:
            m = len(pending)
            window = plan.window
            if window < 1:
                raise PolicyError(f"{policy.name}: parallel window must be >= 1, got {window}")
            room = budget - committed - m - 1  # min(window, max(1, room)), without two calls a round
            if room < window:
                window = room if room > 1 else 1
            # the result's fields unpacked at once: accepted pending drafts, whether the first new
            # one was accepted, the new drafts (read only as far as needed: most rounds drop them)
            accepted, first_new, new = yield build(ParallelRound, (committed, m, window))
            emitted = accepted + 1
            # all pending drafts and the first new one accepted: the other new drafts stay pending
            # (read in one pass, the accepted first one included)
            fresh = tuple(new) if first_new and accepted == m else ()
            if observes:  # the checked drafts are read for an Outcome only (PEARL observes none)
                if accepted < m:
                    checked = pending[:emitted]
                else:
                    checked, accepted = (*pending, fresh[0] if fresh else new[0]), m + first_new
                policy.observe(build(Outcome, (True, window, checked, accepted, emitted, first_new)))
            pending = fresh[1:]
            committed += emitted
            continue
        if kind is TreePlan:
            if pending:
                raise PolicyError(f"{policy.name}: planned a tree round with {len(pending)} drafts pending")
            committed += yield from _tree_round(policy, plan, committed, budget - committed - 1)
            continue
        if kind is Lookup:
            if pending:
                raise PolicyError(f"{policy.name}: planned a lookup round with {len(pending)} drafts pending")
            cap = budget - committed - 1
            if plan.max_draft < cap:
                cap = plan.max_draft
            proposed = (yield build(Propose, (committed, cap, policy.propose, policy.lookup_seconds))) if cap > 0 else ()
            if proposed or plan.fallback is None:
                accepted = yield build(VerifyTokens, (committed, proposed))
                if observes:
                    policy.observe(build(Outcome, (False, len(proposed), (), accepted, accepted + 1, False)))
                committed += accepted + 1
                continue
            plan, kind = plan.fallback, Serial  # nothing looked up: the draft model drafts this round
        if kind is not Serial:
            raise PolicyError(f"{policy.name}: plan() must return Serial, Parallel, TreePlan or Lookup, got {plan!r}")
        if pending:
            raise PolicyError(f"{policy.name}: planned a serial round with {len(pending)} drafts pending")
        max_draft, fixed, layer, min_draft = plan
        cap = budget - committed - 1
        if max_draft < cap:
            cap = max_draft
        if (fixed and not stop_at_end) or cap <= 0:
            signals = (yield build(DraftRun, (committed, cap, layer))) if cap > 0 else ()
            decision = VERIFY
        else:  # token by token: the policy decides, or (fixed plans) only the end token stops
            drafted, decision = yield build(DraftLoop, (committed, cap, layer, None if fixed else on_draft,
                                                      stop_at_end, None if fixed else stops))
            # the executor's list itself, not a copy: only read here (sliced for the outcome, copied
            # into a tuple when it is left pending)
            signals = drafted[:-1] if decision is DROP else drafted
        if decision is PARALLEL:
            if not policy.parallel:
                raise PolicyError(f"{policy.name}: returned PARALLEL but is not a parallel policy")
            pending = tuple(signals)
            continue
        k = len(signals)
        if k < min_draft:  # too short to verify: discarded whole (its draft steps were taken: paid)
            signals, k = (), 0
        start = committed
        accepted = yield build(Verify, (start, k, layer))
        committed += accepted + 1
        if observes:
            policy.observe(build(Outcome, (False, k, signals[: accepted + 1], accepted, accepted + 1, False)))
        if shadows:
            policy.observe_shadows((yield Shadow(start, accepted + 1)))
    if settles:
        yield build(Propose, (committed, 0, policy.settle, policy.lookup_seconds))
    return policy.kept(committed)


def _tree_round(policy: Policy, plan: TreePlan, start: int, cap: int) -> Generator[Request, object, int]:
    """One tree round from ``start`` drafting at most ``cap`` levels; returns the tokens emitted."""
    if plan.tree is not None:
        tree, problem = plan.tree, plan.tree.fault
        if problem is None and tree.depth > cap:
            tree = tree.cut(max(cap, 0))
        widths, grown = (tree.widths if problem is None else ()), False
    else:
        if plan.topk < 1 or plan.max_depth < 1:
            raise PolicyError(f"{policy.name}: a growing tree needs topk and max_depth >= 1, got {plan}")
        candidates = Candidates()
        expand: tuple[int, ...] = (ROOT,)
        sizes: list[int] = []
        while expand and len(sizes) < min(cap, plan.max_depth):
            sizes.append(len(expand))
            candidates.add_level((yield ExpandTree(start, len(sizes), expand, plan.topk)))
            expand = tuple(policy.grow(candidates))
            newest = candidates.levels[-1]
            if any(e not in newest for e in expand):
                raise PolicyError(f"{policy.name}: grow() must name candidates of the newest level "
                                  f"({newest.start}..{newest.stop - 1}), got {expand}")
        chosen = policy.select(candidates) if sizes else ()
        tree = candidates.tree(chosen)
        problem = tree if isinstance(tree, str) else None
        widths, grown = tuple(sizes), True
    if problem is not None:
        raise PolicyError(f"{policy.name}: malformed draft tree: {problem}")
    accepted = yield VerifyTree(start, tree, widths, grown)
    return accepted + 1

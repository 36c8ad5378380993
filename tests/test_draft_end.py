"""Stopping at the draft's own end token: a declared choice per policy (Policy.stops_at_draft_end).

Hugging Face's assistant stops drafting when it proposes an end token, so the hf-* policies do;
the papers' policies draft on past it. The replay reads the end token from the recorded draft
tokens and the manifest's eos_token_ids.
"""

import random
from itertools import islice

import pytest

from simlab.common.signals import TokenSignal
from simlab.policies import REGISTRY, make_policy
from simlab.policies.base import Decision, RoundState
from simlab.policies.rounds import DraftLoop
from simlab.policies.stop import StopRule
from simlab.sim.run import Simulator
from simlab.trace.replay import TraceReplay
from tests.helpers import hand_trace

EOS = 7
# positions 0..9; the draft is wrong at 3 only, where (in the marked trace) it proposes EOS
PATTERN = "1110111111"


def trace_with_draft_end(marked: bool):
    trace = hand_trace([PATTERN])
    trace.manifest.eos_token_ids = [EOS]
    if marked:
        trace.positions.loc[trace.positions["pos"] == 3, "draft_token"] = EOS
    return trace


def test_the_replay_marks_the_drafts_end_token():
    rp = TraceReplay(trace_with_draft_end(True)).prompts[0]
    assert [s.end for s in islice(rp.signals(1), 3)] == [False, False, True]
    assert not any(s.end for s in islice(TraceReplay(trace_with_draft_end(False)).prompts[0].signals(1), 3))


def test_hf_policies_stop_drafting_at_the_drafts_end_token():
    # round 1 from position 1 with N = 5: without the stop the draft drafts positions 1..5; with
    # it, 1..3 (the end token at 3 is verified and rejected). Both accept 2 drafts, so N and every
    # later round are the same: two draft steps fewer, the same target calls and tokens.
    runs = {m: Simulator(trace_with_draft_end(m)).run("hf-heuristic", {"gamma": 5}, with_cost=False, keep_tokens=True)
            for m in (False, True)}
    assert runs[False].summary.draft_calls - runs[True].summary.draft_calls == 2
    assert runs[True].summary.target_calls == runs[False].summary.target_calls
    assert runs[True].tokens == runs[False].tokens


@pytest.mark.parametrize("policy", ["sd", "dv"])
def test_other_policies_draft_past_the_drafts_end_token(policy):
    calls = [Simulator(trace_with_draft_end(m)).run(policy, with_cost=False).summary.draft_calls for m in (False, True)]
    assert calls[0] == calls[1]


def test_every_policy_declares_its_choice():
    stopping = {name for name, cls in REGISTRY.items() if cls.stops_at_draft_end}
    assert stopping == {"hf-heuristic", "hf-confidence"}
    for cls in REGISTRY.values():
        assert "end token" in cls.draft_end_choice()


def test_the_choice_reads_as_simlab_policies_prints_it():
    on = "the draft drafts on past its own end token (its algorithm does not treat end tokens)"
    assert REGISTRY["sd"].draft_end_choice() == on
    assert REGISTRY["pearl"].draft_end_choice() == on + "; a parallel window runs to its length, fixed when the round starts"
    assert REGISTRY["hf-heuristic"].draft_end_choice() == (
        "serial drafts stop after the draft's own end token (as Hugging Face's assistant does)")


def loop_by_decide(loop, signals):
    """DraftLoop.run written with DraftLoop.decide, as the batched decoder drives it."""
    drafted = []
    for signal in signals:
        drafted.append(signal)
        decision = loop.decide(signal)
        if decision is not Decision.DRAFT or len(drafted) >= loop.cap:
            return drafted, decision
    raise AssertionError("ran out of signals")


@pytest.mark.parametrize("stop_at_end", [False, True])
@pytest.mark.parametrize("rule", ["none", "confidence", "parallel", "drop", "stop rule"])
def test_the_draft_loop_decides_as_decide_does(stop_at_end, rule):
    # DraftLoop.run inlines decide() for speed; both must give the same drafts and decision,
    # and run must read no signal past the one it stops at (reading drafts a token). A stop
    # rule stands in for an on_draft that would always say DRAFT.
    answers = {"confidence": lambda s: Decision.VERIFY if s.confidence < 0.3 else Decision.DRAFT,
               "parallel": lambda s: Decision.PARALLEL if s.index == 4 else Decision.DRAFT,
               "drop": lambda s: Decision.DROP if s.confidence < 0.2 else Decision.DRAFT,
               "stop rule": lambda s: Decision.DRAFT}
    stops = (lambda s: s.confidence < 0.3) if rule == "stop rule" else None
    rng = random.Random(1)
    for _ in range(300):
        signals = [TokenSignal(i, rng.random(), 0.0, end=rng.random() < 0.1) for i in range(1, 13)]
        loop = DraftLoop(1, rng.randint(1, 12), None, answers.get(rule), stop_at_end, stops)
        read = []
        got = loop.run(s for s in signals if not read.append(s))
        assert got == loop_by_decide(loop, signals)
        assert read == got[0]


@pytest.mark.parametrize("name", sorted(n for n, cls in REGISTRY.items() if issubclass(cls, StopRule)))
def test_a_stop_rule_is_what_on_draft_decides_by(name):
    # the draft loop calls a policy's stop_rule() in place of on_draft: the two must agree,
    # token by token through a round (pacer and ags carry state from token to token)
    context = Simulator(trace_with_draft_end(False)).context()
    policy, twin = make_policy(name, context), make_policy(name, context)
    stops = policy.stop_rule()
    assert stops is not None
    for p in (policy, twin):
        p.plan(RoundState(1, 50, 0, 10))
    rng = random.Random(2)
    for i in range(1, 40):
        signal = TokenSignal(i, rng.random(), rng.random(), rng.random())
        assert (Decision.VERIFY if stops(signal) else Decision.DRAFT) is twin.on_draft(signal)


def test_a_draft_past_its_first_rejection_stops_at_an_end_token_it_proposes():
    # the draft is wrong at 2 and proposes EOS at 4; the hand trace holds no rollouts, so past
    # the rejection at 2 the replay reads the recorded (teacher-forced) signals of 3 and 4. From
    # 1 with a rule that never stops, cap 8: tokens 1..4, the 4th the end token, which ends the run
    trace = hand_trace(["1101111111"])
    trace.manifest.eos_token_ids = [EOS]
    trace.positions.loc[trace.positions["pos"] == 4, "draft_token"] = EOS
    rp = TraceReplay(trace).prompts[0]
    drafted, said = rp.draft_until(1, None, 8, lambda s: False, stop_at_end=True)
    assert ([s.index for s in drafted], drafted[-1].end, said) == ([1, 2, 3, 4], True, None)
    drafted, said = rp.draft_until(1, None, 8, lambda s: False)  # not told to stop there: to the cap
    assert (len(drafted), said) == (8, False)

"""Properties every policy must have, on random traces and latencies (hypothesis):

- lossless: the emitted tokens are exactly the target's;
- a round never accepts more than it drafted, nor the run;
- no device does two things at once (also checked on every booking by the executor);
- the oracle (perfect knowledge) is at least as fast as every serial policy that drafts with
  the same draft model.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simlab.common.signals import TokenSignal
from simlab.policies import REGISTRY, make_policy
from simlab.policies.base import Decision, Parallel, Policy, PromptInfo, Serial
from simlab.policies.rounds import DraftLoop, DraftRun, PolicyError, Shadow, Verify, decode
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.replay import TraceReplay
from tests.helpers import hand_trace, latency_table

EXIT_LAYERS = (2, 5)
SELF_SPECULATIVE = {"layerskip", "del"}  # draft with early-exit layers, not the draft model
# Tree policies need tree data these random traces lack (tests/test_tree_policies.py), and a tree
# is no serial schedule the oracle bounds.
TREES = {name for name, cls in REGISTRY.items() if cls.drafts_trees}
# rest needs a datastore, which these traces lack (tests/test_lookup.py runs it)
CHAINS = [name for name in REGISTRY if name not in TREES and name != "rest"]
# (lookup policies draft by other means than the draft model, and a policy whose rounds run past the budget,
# vllm's, drafts outside the serial schedules the oracle searches: the oracle bounds none of them)
SERIAL_SAME_DRAFT = [name for name, cls in REGISTRY.items() if not cls.parallel and not cls.needs_future
                     and not cls.looks_up and not cls.past_end and name not in SELF_SPECULATIVE | TREES]
ORACLE = {"max_draft": 64}  # more than any prompt's length: the true optimum over serial schedules


def bits(n):
    return st.lists(st.booleans(), min_size=n, max_size=n).map(lambda b: "".join("1" if x else "0" for x in b))


def confs(n):
    return st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n)


@st.composite
def cases(draw):
    lengths = draw(st.lists(st.integers(2, 30), min_size=1, max_size=2))
    patterns = [draw(bits(n)) for n in lengths]
    conf = [draw(confs(n)) for n in lengths]
    layers = {layer: [draw(bits(n)) for n in lengths] for layer in EXIT_LAYERS}
    layer_conf = {layer: [draw(confs(n)) for n in lengths] for layer in EXIT_LAYERS}
    # verify cost per k, not necessarily monotone (as measured on CPUs); co-running slowdowns
    verify = dict(enumerate(draw(st.lists(st.floats(0.2, 2.0), min_size=8, max_size=8)), start=1))
    latency = latency_table(draft=draw(st.floats(0.01, 0.6)), verify=verify,
                            layers={layer: draw(st.floats(0.005, 0.3)) for layer in EXIT_LAYERS},
                            corun=(draw(st.floats(1.0, 2.0)), draw(st.floats(1.0, 2.0))))
    # prompts that end at their end token may have a budget past it (drafts are capped by the budget)
    stop = draw(st.sampled_from(["length", "eos"]))
    budget = max(lengths) + draw(st.integers(0, 6)) if stop == "eos" else 0
    trace = hand_trace(patterns, conf=conf, latency=latency, layers=layers, layer_conf=layer_conf, n_layers=8,
                       stop=stop, max_new_tokens=budget)
    return trace, draw(st.sampled_from(["two-devices", "one-device"]))


def check_devices(result):
    for device in ("draft", "target"):
        spans = sorted((s.start, s.end) for s in result.timeline if s.device == device)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-9, f"{device} does two things at once"


def check_rounds(result):
    for s in result.timeline:
        if s.device == "target":
            parallel = "parallel" in s.name  # a parallel round checks m pending + 1 new draft
            assert s.args["accepted"] <= s.args["tokens"] - (0 if parallel else 1)
    assert result.summary.accepted <= result.summary.drafted


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_policy_is_lossless_and_keeps_devices_and_rounds_consistent(case):
    trace, topology = case
    sim = Simulator(trace, topology=topology)
    target = {pid: g.sort_values("pos").target_token.tolist()[1:] for pid, g in trace.positions.groupby("prompt_id")}
    for name in CHAINS:
        res = sim.run(name, ORACLE if name == "oracle" else {}, keep_tokens=True, timeline_prompt=0, with_cost=False)
        assert res.tokens == target, name
        check_rounds(res)
        check_devices(res)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_oracle_is_at_least_as_fast_as_every_serial_policy(case):
    """The oracle's programme prices each round as the executor does, the draft's catch-up
    forwards included (docs/policies/oracle.md): the time it plans is the time its schedule
    runs in, and no serial policy drafting with the same draft model is faster."""
    trace, topology = case
    sim = Simulator(trace, topology=topology)
    oracle = make_policy("oracle", sim.context(), **ORACLE)
    planned = 0.0
    for p in sim.replay.prompts:
        oracle.reset(PromptInfo(p.prompt_id, p.prompt_len, p.n_tokens, p.budget, replay=p))
        planned += oracle.expected_seconds
    assert planned == pytest.approx(sim.run("oracle", ORACLE, with_cost=False).summary.wall_time_s, rel=1e-9)
    for name in SERIAL_SAME_DRAFT:
        assert planned <= sim.run(name, with_cost=False).summary.wall_time_s + 1e-9, name


# -- a policy that breaks the round protocol is stopped, and named -------------------------------

class Planned(Policy):
    """A test policy that plays back ``plans`` (one per round, the last repeated), answers every
    drafted token with ``decision``, and records what the protocol showed it."""

    name, summary, paper, parallel = "test-planned", "", "", True

    def __init__(self, context, plans, decision=Decision.DRAFT, parallel=True):
        super().__init__(context)
        self.plans, self.decision, self.parallel = list(plans), decision, parallel
        self.states, self.outcomes, self.asked = [], [], 0

    def plan(self, state):
        self.states.append(tuple(state))
        return self.plans.pop(0) if len(self.plans) > 1 else self.plans[0]

    def on_draft(self, signal):
        self.asked += 1
        return self.decision

    def observe(self, outcome):
        self.outcomes.append((outcome.parallel, outcome.drafted, len(outcome.checked), outcome.accepted,
                              outcome.emitted))


def decode_with(policy, pattern="1" * 8):
    trace = hand_trace([pattern])
    sim = Simulator(trace)
    return SimExecutor(sim.latency, keep_tokens=True).run(TraceReplay(trace), policy(sim.context()))


def test_serial_rounds_show_the_policy_its_state_and_what_the_target_checked():
    # prompt of 10 tokens, positions 0..7, the draft wrong at 1 only. Serial(2): drafts 1, 2;
    # 1 is rejected (1 checked, 0 accepted, the target's token emitted). Serial(2) from 2: both
    # accepted, 3 emitted. Serial(1) from 5: accepted, 2 emitted. From 7, the budget's last
    # position, nothing may be drafted: a plain target step (the policy is not asked).
    played = []
    decode_with(lambda ctx: played.append(Planned(ctx, [Serial(2), Serial(2), Serial(1)])) or played[-1],
                pattern="10111111")
    policy = played[0]
    # (committed, remaining, pending, context length = prompt 10 + committed)
    assert policy.states == [(1, 7, 0, 11), (2, 6, 0, 12), (5, 3, 0, 15), (7, 1, 0, 17)]
    # (parallel, drafted, checked, accepted, emitted)
    assert policy.outcomes == [(False, 2, 1, 0, 1), (False, 2, 2, 2, 3), (False, 1, 1, 1, 2), (False, 0, 0, 0, 1)]
    assert policy.asked == 2 + 2 + 1  # after every drafted token of a plan that is not fixed


def test_parallel_rounds_show_the_policy_what_they_emitted():
    # Parallel(2), all accepted, positions 1..7. From 1 (nothing pending): the target settles 1
    # (its check of the first new draft passes), the second new draft (2) stays pending: 1
    # emitted. Then each round checks its pending draft and the first new one, emits both, and
    # keeps one pending: from 2 and from 4. From 6 the window is capped at 1 (the budget's end
    # is 8, one pending): 6 and the new 7 are checked; 7, the budget's last position, is the
    # target's: 1 accepted, 2 emitted, nothing left pending.
    played = []
    decode_with(lambda ctx: played.append(Planned(ctx, [Parallel(2)])) or played[-1])
    assert played[0].outcomes == [(True, 2, 1, 1, 1), (True, 2, 2, 2, 2), (True, 2, 2, 2, 2), (True, 1, 2, 1, 2)]


@pytest.mark.parametrize("plans, decision, parallel, message", [
    ([Parallel(0)], Decision.DRAFT, True, "parallel window must be >= 1, got 0"),
    (["two tokens"], Decision.DRAFT, True, "plan() must return Serial, Parallel, TreePlan or Lookup, got 'two tokens'"),
    # on_draft hands the first drafted token to a parallel round, but the next plan is serial again
    ([Serial(2)], Decision.PARALLEL, True, "planned a serial round with 1 drafts pending"),
    ([Serial(2)], Decision.PARALLEL, False, "returned PARALLEL but is not a parallel policy"),
])
def test_a_policy_breaking_the_protocol_is_stopped_and_named(plans, decision, parallel, message):
    policy = lambda ctx: Planned(ctx, plans, decision, parallel)  # noqa: E731
    with pytest.raises(PolicyError) as err:
        decode_with(policy)
    assert str(err.value).startswith("test-planned: ") and message in str(err.value)


def test_a_parallel_window_of_one_is_allowed():
    # Parallel(1) with nothing pending: the target checks the one new draft (position c) while
    # the draft drafts it; nothing is left pending, so each round emits exactly one token.
    # Positions 1..7 of an all-accepted prompt: 7 rounds, 7 draft steps, 6 drafts accepted (the
    # last position, the budget's end, is always the target's).
    run = decode_with(lambda ctx: Planned(ctx, [Parallel(1)]))
    prompt = run.prompts[0]
    assert prompt.tokens == [101, 102, 103, 104, 105, 106, 107]
    c = prompt.counts
    assert (c.parallel_rounds, c.target_calls, c.drafted, c.accepted) == (7, 7, 7, 6)


class Shadowed(Planned):
    """Planned, reading shadow tokens (DEL's): keeps each answer it was shown."""

    needs_shadows = True

    def __init__(self, context, plans):
        super().__init__(context, plans)
        self.shadows = []

    def observe_shadows(self, shadows):
        self.shadows.append(shadows)


def test_a_shadow_reading_policy_is_shown_position_0_then_what_each_verification_settled():
    # driven by hand (the answers are placeholders): the prefill settles position 0 alone; a
    # serial round from 1 drafting 2 with 1 accepted settles 1..2 (the accepted draft and the
    # target's token); the next, from 3, accepts both of its 2 and settles 3..5
    policy = Shadowed(Simulator(hand_trace(["1" * 8])).context(), [Serial(2, fixed=True)])
    rounds = decode(policy, PromptInfo(0, 10, 8, 8))
    assert next(rounds) == Shadow(0, 1)
    assert rounds.send("after the prefill") == DraftRun(1, 2, None)
    assert rounds.send(("d1", "d2")) == Verify(1, 2, None)
    assert rounds.send(1) == Shadow(1, 2)
    assert rounds.send("after round 1") == DraftRun(3, 2, None)
    rounds.send(("d3", "d4"))
    assert rounds.send(2) == Shadow(3, 3)
    rounds.send("after round 2")
    assert policy.shadows == ["after the prefill", "after round 1", "after round 2"]


def test_a_draft_loop_whose_executor_runs_out_of_tokens_is_stopped():
    # the executor hands the loop fewer tokens than the cap while the policy drafts on
    loop = DraftLoop(start=1, cap=3, layer=None, on_draft=lambda signal: Decision.DRAFT, stop_at_end=False)
    with pytest.raises(PolicyError) as err:
        loop.run(iter([TokenSignal(1, 0.9, 0.1), TokenSignal(2, 0.9, 0.1)]))
    assert str(err.value) == "the executor's drafted tokens ran out before the round ended"

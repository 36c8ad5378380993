"""SPIDE (Xu et al.) on hand-built traces: Figure 2 round by round, the mapping table, eq. 6 and
the two ablations of Table 5."""

import math
import random

import pytest

from simlab.common.mapping import ONE, SPIDE_EDGES, spide_bin
from simlab.common.signals import TokenSignal
from simlab.policies import PolicyContext
from simlab.policies.base import Decision, RoundState
from simlab.policies.spide import MappingTable, Spide, SpideNoDynaDraft, SpideNoParaVerify, confidence_bin
from simlab.policies.timing import MAX_WINDOW, balanced_window
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.io import Trace
from tests.helpers import hand_trace, latency_table

# Figure 2. Position 0 is the prefill's token; x_i sits at position i. x1..x10 are accepted,
# x11 is rejected; x12..x20 are accepted. x1..x6 have confidence 0.955 (interval [0.95, 0.96)),
# x7 has 0.35 (interval [0.3, 0.4)), so that with the table below Γ_6 > τ ≥ Γ_7.
FIG2_PATTERN = "1" + "1" * 10 + "0" + "1" * 9
FIG2_CONF = [0.955] * 7 + [0.35] + [0.955] * 13
HIGH, LOW = confidence_bin(0.955), confidence_bin(0.35)
# draft step 0.25 s, verify 1 s whatever k: eq. 6 gives s = ⌊v_q / v_p⌋ = ⌊1 / 0.25⌋ = 4 (Figure 2's s)
FIG2_LATENCY = latency_table(draft=0.25)


def fig2_trace() -> Trace:
    return hand_trace([FIG2_PATTERN], conf=[FIG2_CONF], latency=FIG2_LATENCY)


def warmed_table(policy: Spide) -> None:
    """The table before Figure 2 starts: α = 19/20 for x1..x6's interval, 1/4 for x7's."""
    for accepted in [True] * 19 + [False]:
        policy.table.record(0.955, accepted)
    for accepted in (True, False, False, False):
        policy.table.record(0.35, accepted)


def run_policy(trace: Trace, policy, topology="two-devices"):
    sim = Simulator(trace, topology=topology)
    run = SimExecutor(sim.latency, topology, keep_tokens=True, timeline_prompt=0).run(sim.replay, policy)
    return run.prompts[0]


def slices(prompt_run, device):
    return [(s.name, s.args["position"], s.args["tokens"], s.args.get("accepted"), round(s.start, 9), round(s.end, 9))
            for s in prompt_run.slices if s.device == device]


def test_confidence_intervals_are_the_twenty_of_figure_4():
    # the last, "1.0", holds what bfloat16 (the paper's precision) rounds to 1.0: from 1 - 2^-9 up
    cases = {0.0: 0, 0.05: 0, 0.1: 1, 0.35: 3, 0.8999: 8, 0.9: 9, 0.905: 9, 0.91: 10, 0.97: 16, 0.99: 18,
             0.998: 18, 1 - 2**-9: 19, 0.9999: 19, 1.0: 19}
    assert {c: confidence_bin(c) for c in cases} == cases


def test_confidence_bin_is_the_mappings_bin_at_every_edge():
    # the scalar bisection the policy runs per token and simlab.common.mapping's array binning agree on
    # each edge, the floats either side of it, and random confidences
    edges = [*SPIDE_EDGES, ONE]
    cases = [x for e in edges for x in (math.nextafter(e, -1.0), e, math.nextafter(e, 2.0))]
    cases += [random.Random(0).random() for _ in range(1000)] + [math.nextafter(1.0, 2.0), 0.0]
    assert [confidence_bin(c) for c in cases] == spide_bin(cases).tolist()


def test_mapping_table_counts_per_interval_and_reads_mid_confidence_when_empty():
    table = MappingTable()
    assert table.alpha(0.955) == pytest.approx(0.955)  # cold start: [0.95, 0.96) reads 0.955
    assert table.alpha(0.05) == pytest.approx(0.05) and table.alpha(1.0) == 1.0
    for accepted in (True, True, False):
        table.record(0.951, accepted)
    assert table.alpha(0.959) == pytest.approx(2 / 3)
    assert (table.total[HIGH], table.accepted[HIGH]) == (3, 2)


def test_a_verifications_checked_tokens_count_in_their_intervals():
    # observe() records a verification's tokens in one call, the first `accepted` accepted: per
    # interval N_T and N_A count them, and α_b = N_A / N_T where N_T > 0 (else the mid confidence)
    rng = random.Random(4)
    table, total, hits = MappingTable(), [0] * len(SPIDE_EDGES), [0] * len(SPIDE_EDGES)
    for _ in range(300):
        confidences = [rng.choice([rng.random(), 0.955, 1.0]) for _ in range(rng.randint(0, 6))]
        accepted = rng.randint(0, len(confidences))
        table.record_checked(iter(confidences), accepted)
        for i, confidence in enumerate(confidences):
            total[confidence_bin(confidence)] += 1
            hits[confidence_bin(confidence)] += i < accepted
        assert (table.total, table.accepted) == (total, hits)
        assert table.rate == [a / t if t else MappingTable().rate[b] for b, (a, t) in enumerate(zip(hits, total))]


def test_spide_reproduces_figure_2():
    """Serial x1..x7 (Γ_7 ≤ τ); the target verifies x1..x8 while x8..x11 are drafted; then
    x9..x12 while x12..x15 are drafted; x11 is rejected and y11 emitted; back to serial."""
    trace = fig2_trace()
    policy = Spide(Simulator(trace).context(), tau=0.7)
    warmed_table(policy)
    assert policy.window == 4  # eq. 6
    run = run_policy(trace, policy)
    # After Figure 2 the table holds x1..x10 accepted, x11 rejected: α = 28/30 for 0.955, so serial
    # drafting from position 12 stops at Γ_6 = (28/30)^6 ≤ 0.7 < Γ_5; the parallel rounds that
    # follow are cut by the end of the prompt (n = 21): windows 2, then 1.
    assert slices(run, "draft") == [
        ("draft x7", 1, 7, None, 0.0, 1.75),  # I: serial x1..x7
        ("draft (parallel) x4", 8, 4, None, 1.75, 2.75),  # II: x8..x11
        ("draft (parallel) x4", 12, 4, None, 2.75, 3.75),  # III: x12..x15
        ("draft x6", 12, 6, None, 3.75, 5.25),  # IV: back to serial from y11
        ("draft (parallel) x2", 18, 2, None, 5.25, 5.75),  # the draft then idles until the verify ends
        ("draft (parallel) x1", 20, 1, None, 6.25, 6.5),
    ]
    assert slices(run, "target") == [
        ("verify (parallel) x8", 1, 8, 8, 1.75, 2.75),  # II: x1..x8, all accepted
        ("verify (parallel) x4", 9, 4, 2, 2.75, 3.75),  # III: x9..x12, x11 rejected
        ("verify (parallel) x7", 12, 7, 7, 5.25, 6.25),
        ("verify (parallel) x2", 19, 2, 1, 6.25, 7.25),  # the last position is always the target's
    ]
    assert run.counts.parallel_rounds == 4 and run.counts.wall_time_s == pytest.approx(7.25)
    # the table was updated after every verification with the checked tokens only (line 29)
    assert (policy.table.total[HIGH], policy.table.accepted[HIGH]) == (20 + 7 + 3 + 7 + 2, 19 + 7 + 2 + 7 + 1)
    assert (policy.table.total[LOW], policy.table.accepted[LOW]) == (5, 2)
    assert run.tokens == list(trace.positions.target_token[1:])


def test_spide_keeps_drafting_serially_while_reliability_exceeds_tau():
    trace = fig2_trace()
    policy = Spide(Simulator(trace).context(), tau=0.1)
    warmed_table(policy)
    run = run_policy(trace, policy)
    # Γ_7 = 0.95^6 · 0.25 = 0.18 > 0.1: x8 (0.955) gives 0.175, ... Γ stays > 0.1 until
    # 0.95^k · 0.25 ≤ 0.1, i.e. k = 18 high-confidence tokens: x1..x19, then parallel, with a
    # window of 1 (one position left after the 19 pending): x1..x20 verified, x11 rejected.
    assert slices(run, "draft")[0][:3] == ("draft x19", 1, 19)
    assert slices(run, "target")[0][:4] == ("verify (parallel) x20", 1, 20, 10)


def test_table_is_kept_across_prompts():
    trace = hand_trace([FIG2_PATTERN, FIG2_PATTERN], conf=[FIG2_CONF, FIG2_CONF], latency=FIG2_LATENCY)
    policy = Spide(Simulator(trace).context())
    sim = Simulator(trace)
    SimExecutor(sim.latency).run(sim.replay, policy)
    # every position but the prefill's is checked once per prompt: 20 per prompt
    assert sum(policy.table.total) == 2 * 20


def test_without_para_verify_spide_verifies_serially_when_reliability_drops():
    trace = fig2_trace()
    policy = SpideNoParaVerify(Simulator(trace).context(), tau=0.7)
    warmed_table(policy)
    run = run_policy(trace, policy)
    target = slices(run, "target")
    assert target[0][:4] == ("verify x8", 1, 8, 7)  # x1..x7 verified alone, all accepted + bonus
    assert run.counts.parallel_rounds == 0


def test_without_dyna_draft_spide_drafts_a_fixed_gamma_before_each_parallel_phase():
    trace = fig2_trace()
    run = run_policy(trace, SpideNoDynaDraft(Simulator(trace).context(), gamma=3))
    assert slices(run, "draft")[:2] == [("draft x3", 1, 3, None, 0.0, 0.75),
                                        ("draft (parallel) x4", 4, 4, None, 0.75, 1.75)]
    assert slices(run, "target")[0][:4] == ("verify (parallel) x4", 1, 4, 4)


def test_without_dyna_draft_gamma_defaults_to_vanilla_sd_best():
    trace = fig2_trace()
    sim = Simulator(trace)
    assert sim.run("spide-no-dyna-draft", with_cost=False).params["gamma"] == sim.reference().gamma


def test_window_of_eq_6_on_a_verify_cost_that_varies_with_k():
    """An early 2-core CPU probe of the Qwen pair: draft 0.129 s; verify 0.317 (k=1), 0.660, 0.935, 0.575 (k=4),
    0.687 (k=6), 0.638 (k=8). The largest s whose s draft steps fit in an s-token verify is 4."""
    verify = {1: 0.317, 2: 0.660, 3: 0.935, 4: 0.575, 6: 0.687, 8: 0.638, 16: 0.837}
    sim = Simulator(hand_trace(["1" * 8], latency=latency_table(draft=0.129, verify=verify)))
    assert balanced_window(sim.context()) == 4


def test_window_uses_co_running_latencies_on_one_device():
    lat = latency_table(draft=0.1, corun=(2.0, 1.0))  # the draft runs twice as slow beside the target
    trace = hand_trace(["1" * 8], latency=lat)
    assert Spide(Simulator(trace).context()).window == 10
    assert Spide(Simulator(trace, topology="one-device").context()).window == 5


def test_bad_parameters_are_rejected_in_the_constructor():
    from simlab.common.errors import SimlabError

    ctx = Simulator(fig2_trace()).context()
    for bad in ({"tau": 1.5}, {"window": 0}, {"prior": -0.1}, {"gamma": 2}):
        with pytest.raises(SimlabError):
            Spide(ctx, **bad)
    with pytest.raises(SimlabError, match="--gamma"):
        SpideNoDynaDraft(PolicyContext(latency=ctx.latency))


def test_prior_gamma_0_of_eq_5_starts_the_reliability_product():
    # cold table: x1 (0.955) reads α = 0.955. With π_0 = 0.5, Γ_1 = 0.5 · 0.955 = 0.4775 ≤ 0.7:
    # the first token already hands over to parallel verification. With π_0 = 1, Γ_1 = 0.955 > 0.7.
    trace = fig2_trace()
    ctx = Simulator(trace).context()
    assert slices(run_policy(trace, Spide(ctx, tau=0.7, prior=0.5)), "draft")[0][:3] == ("draft x1", 1, 1)
    assert slices(run_policy(trace, Spide(ctx, tau=0.7, prior=1.0)), "draft")[0][:3] != ("draft x1", 1, 1)


@pytest.mark.parametrize("cls,decision", [(Spide, Decision.PARALLEL), (SpideNoParaVerify, Decision.VERIFY)])
def test_reliability_exactly_at_tau_stops_drafting(cls, decision):
    # eq. 4 drafts on while Γ > τ: with π_0 = τ = 0.7 and a token of confidence 1.0 (its cold
    # interval reads α = 1.0), Γ_1 = 0.7 · 1.0 = 0.7 = τ exactly, so drafting stops.
    policy = cls(Simulator(fig2_trace()).context(), tau=0.7, prior=0.7)
    policy.plan(RoundState(committed=1, remaining=20, pending=0, context_len=11))
    assert policy.on_draft(TokenSignal(1, 1.0, 0.0)) is decision
    # just above τ it drafts on: π_0 = 0.71 gives Γ_1 = 0.71 > 0.7
    policy = cls(Simulator(fig2_trace()).context(), tau=0.7, prior=0.71)
    policy.plan(RoundState(committed=1, remaining=20, pending=0, context_len=11))
    assert policy.on_draft(TokenSignal(1, 1.0, 0.0)) is Decision.DRAFT


def test_the_balanced_window_is_one_when_a_draft_step_outlasts_a_verification():
    # eq. 6 takes the largest s whose s draft steps fit in one verification of s tokens; with a
    # 2 s draft step and a 1 s verification none fits, and the window falls back to 1
    sim = Simulator(hand_trace(["1" * 8], latency=latency_table(draft=2.0)))
    assert balanced_window(sim.context()) == 1


def test_the_balanced_window_stops_at_max_window():
    # a 1 ms draft step and a 1 s verification whatever k: s steps fit while s * 0.001 <= 1,
    # s <= 1000, so every s the search tries fits, up to MAX_WINDOW = 128 inclusive
    sim = Simulator(hand_trace(["1" * 8], latency=latency_table(draft=0.001)))
    assert MAX_WINDOW == 128
    assert balanced_window(sim.context()) == 128


@pytest.mark.parametrize("cls", [Spide, SpideNoParaVerify, SpideNoDynaDraft])
def test_every_verification_records_its_checked_tokens_by_their_confidence(cls):
    # Alg. 1 line 29, for serial and parallel rounds alike: after each observe() the table holds
    # what record_checked() of every verification's checked confidences so far gives (a serial
    # round's intervals are the ones on_draft found while drafting)
    rng = random.Random(7)
    patterns = ["1" + "".join(rng.choice("1110") for _ in range(80)) for _ in range(3)]
    conf = [[rng.choice([rng.random(), 0.955, 0.35, 1.0]) for _ in p] for p in patterns]
    trace = hand_trace(patterns, conf=conf, latency=FIG2_LATENCY)
    reference, rounds = MappingTable(), []

    class Checked(cls):
        def observe(self, outcome):
            reference.record_checked([s.confidence for s in outcome.checked], outcome.accepted)
            super().observe(outcome)
            rounds.append(outcome.parallel)
            assert (self.table.total, self.table.accepted) == (reference.total, reference.accepted)

    params = {"gamma": 3} if cls is SpideNoDynaDraft else {}
    sim = Simulator(trace, topology="two-devices")
    SimExecutor(sim.latency, sim.topology).run(sim.replay, Checked(sim.context(), **params))
    assert False in rounds and (cls is SpideNoParaVerify) is (True not in rounds)

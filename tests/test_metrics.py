"""Every metric of simlab.common.metrics, derived by hand on one seven-position prompt.

The trace: prompt length 10, pattern ``1101110`` (position 0 is the prefill's token; the draft
matches the target at 1, 3, 4, 5 and misses at 2 and 6). The latency table varies with context
c (the context a forward reads: prompt length + tokens committed before it)::

    draft step      d(c)   = 0.1 + 0.01 c
    k-token verify  T_k(c) = 0.9 + 0.1 k + 0.01 c

so pricing a verify at the wrong context (c + k instead of c) or with the wrong k moves the
wall time. Autoregressive decoding of positions 1..6 runs T_1 at contexts 11..16:
AD = 6 * 1.0 + 0.01 * (11 + 12 + 13 + 14 + 15 + 16) = 6.81 s, the same for every policy.
"""

import dataclasses
import math

import pandas as pd
import pytest

from simlab.common.metrics import Counts, PositionStats, Summary, total, upgrade_columns
from simlab.policies import make_policy
from simlab.policies.base import Decision, Policy, Serial
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator, simulate
from tests.helpers import EveryRoundParallel, hand_trace, latency_table

PATTERN = "1101110"
AD_SECONDS = 6.81
CORUN = (2.0, 1.5)  # one device: a co-running draft step takes 2x, a co-running verify 1.5x


def context_latency(corun=None) -> pd.DataFrame:
    return latency_table(draft=0.1, verify={k: 0.9 + 0.1 * k for k in range(1, 9)}, slope=0.01, corun=corun)


def trace(corun=None):
    return hand_trace([PATTERN], latency=context_latency(corun))


def run_policy(policy, topology="two-devices", corun=None):
    """Summary and per-position statistics of ``policy`` (a Policy object) on the trace."""
    sim = Simulator(trace(corun), topology=topology)
    run = SimExecutor(sim.latency, topology).run(sim.replay, policy)
    return Summary.from_counts(total(r.counts for r in run.prompts)), run.positions


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-12)


# -- vanilla SD, γ = 2 -----------------------------------------------------------------------------
# round 1: committed 1, drafts positions 1, 2 (steps at c = 11, 12: 0.21 + 0.22 = 0.43 s);
#          verify 3 tokens at c = 11: T_3(11) = 1.2 + 0.11 = 1.31 s; 1 accepted (2 is wrong), 2 emitted
# round 2: committed 3, drafts 3, 4 (c = 13, 14: 0.23 + 0.24 = 0.47 s); T_3(13) = 1.33 s; 2 accepted,
#          3 emitted (3, 4 and the bonus 5)
# round 3: committed 6 = the last position: nothing may be drafted; T_1(16) = 1.16 s; 1 emitted
# wall 0.43 + 1.31 + 0.47 + 1.33 + 1.16 = 4.70 s; draft busy 0.90 s; target busy 3.80 s
SD_EXPECTED = {
    "tokens": 6, "target_calls": 3, "draft_calls": 4, "drafted": 4, "accepted": 3, "parallel_rounds": 0,
    "wall_time_s": 4.70, "ad_wall_time_s": AD_SECONDS,
    "speedup": AD_SECONDS / 4.70,  # 1.449
    "mat": 3 / 3,  # accepted drafts per target call, bonus excluded
    "tokens_per_target_call": 6 / 3,  # tokens per target call, bonus included
    "acceptance_rate": 3 / 4,  # accepted / drafted
    "tokens_per_s": 6 / 4.70,  # tokens per second of the policy's own wall time
    "wasted_draft_tokens": 4 - 3,
    "draft_busy": 0.90 / 4.70,
    "target_busy": 3.80 / 4.70,
    "rollout_overruns": 0,
}


@pytest.mark.parametrize("topology", ["two-devices", "one-device"])
def test_sd_metrics_by_hand_with_context_dependent_latency(topology):
    # serial rounds never overlap, so the one-device topology prices them with solo figures too
    summary = simulate(trace(CORUN), "sd", {"gamma": 2}, topology=topology, with_cost=False).summary
    assert {k: getattr(summary, k) for k in SD_EXPECTED} == {k: approx(v) for k, v in SD_EXPECTED.items()}


def test_sd_per_position_acceptance_by_hand():
    # round 1 checked positions 1, 2 and accepted 1; round 2 checked 1, 2 and accepted both;
    # round 3 checked nothing. First draft token: checked 2x, accepted 2x; second: checked 2x, accepted 1x.
    _, positions = run_policy(make_policy("sd", Simulator(trace()).context(), gamma=2))
    assert positions.checked == [2, 2]
    assert positions.accepted == [2, 1]
    assert positions.rates() == [1.0, 0.5]


# -- a parallel policy: every round Parallel(3) ----------------------------------------------------
# (window = min(3, max(1, budget - committed - pending - 1)); the draft's s steps start at c + m)
# round 1: committed 1, m = 0, s = 3: draft at c = 11, 12, 13 (0.66 s) || verify T_1(11) = 1.11 s.
#          Position 1 accepted; 2, 3 stay pending. 1 emitted.
# round 2: committed 2, m = 2, s = min(3, 7-2-2-1) = 2: draft at 14, 15 (0.49 s) || T_3(12) = 1.32 s.
#          Position 2 rejected: the correction is emitted, nothing pending.
# round 3: committed 3, m = 0, s = 3: draft at 13, 14, 15 (0.72 s) || T_1(13) = 1.13 s. 3 accepted.
# round 4: committed 4, m = 2 (positions 4, 5), s = max(1, 7-4-2-1) = 1: draft at 16 (0.26 s)
#          || T_3(14) = 1.34 s. 4, 5 accepted; position 6 (the end) is the target's: 3 emitted.
# two devices: each round lasts its verify: 1.11 + 1.32 + 1.13 + 1.34 = 4.90 s;
#          draft busy 0.66 + 0.49 + 0.72 + 0.26 = 2.13 s.
# one device (co-running): draft x2, verify x1.5: rounds 1.665 + 1.98 + 1.695 + 2.01 = 7.35 s,
#          draft busy 2 x 2.13 = 4.26 s; target busy = wall time in both.
PARALLEL_COUNTS = {"tokens": 6, "target_calls": 4, "draft_calls": 9, "drafted": 9, "accepted": 4,
                   "parallel_rounds": 4, "ad_wall_time_s": AD_SECONDS, "mat": 4 / 4, "tokens_per_target_call": 6 / 4,
                   "acceptance_rate": 4 / 9, "wasted_draft_tokens": 5, "rollout_overruns": 0}


@pytest.mark.parametrize("topology,wall,draft_busy", [("two-devices", 4.90, 2.13), ("one-device", 7.35, 4.26)])
def test_parallel_metrics_by_hand_in_both_topologies(topology, wall, draft_busy):
    summary, _ = run_policy(EveryRoundParallel(None), topology, corun=CORUN)
    expected = {**PARALLEL_COUNTS, "wall_time_s": wall, "speedup": AD_SECONDS / wall, "tokens_per_s": 6 / wall,
                "draft_busy": draft_busy / wall, "target_busy": 1.0}
    assert {k: getattr(summary, k) for k in expected} == {k: approx(v) for k, v in expected.items()}


def test_parallel_per_position_acceptance_by_hand():
    # rounds checked (positions, accepted): (1, 1), (1, 0), (1, 1), (3, 2)
    # first checked token: 4 rounds, 3 accepted; second and third: only round 4, accepted, rejected
    _, positions = run_policy(EveryRoundParallel(None))
    assert positions.checked == [4, 1, 1]
    assert positions.accepted == [3, 1, 0]
    assert positions.rates() == [0.75, 1.0, 0.0]


# -- rollout overruns --------------------------------------------------------------------------------

class DraftFour(Policy):
    """Reads every drafted token's signal (not a fixed run): draft 4, then verify."""

    name, summary, paper = "test-draft-four", "", ""

    def plan(self, state):
        return Serial(4)

    def on_draft(self, signal):
        return Decision.DRAFT


def test_rollout_overruns_count_tokens_drafted_past_the_recorded_rollout():
    # pattern 1101111: the first round drafts positions 1..4 from committed 1; the draft leaves
    # the true path at 2, and the rollout recorded at 2 has one step (position 3's signal), so
    # the 4th token reads past it: one overrun. Round 2 drafts 3, 4, 5 on the true path.
    t = hand_trace(["1101111"], latency=context_latency())
    rollout = pd.DataFrame({"prompt_id": [0], "pos": [2], "step": [1], "token": [7], "draft_conf": [0.5],
                            "draft_entropy": [0.5]})
    sim = Simulator(dataclasses.replace(t, rollouts=rollout))
    run = SimExecutor(sim.latency).run(sim.replay, DraftFour(None))
    summary = Summary.from_counts(total(r.counts for r in run.prompts))
    assert (summary.rollout_overruns, summary.drafted, summary.accepted, summary.target_calls) == (1, 7, 4, 2)


# -- from counts ---------------------------------------------------------------------------------------

def test_cost_is_target_calls_over_the_reference_and_nan_without_one():
    c = Counts(tokens=6, target_calls=3, drafted=4, accepted=3, wall_time_s=4.7, ad_wall_time_s=6.81)
    assert Summary.from_counts(c, reference_target_calls=4).cost == 3 / 4
    assert math.isnan(Summary.from_counts(c).cost)


def test_verified_counts_the_drafts_the_target_checked_not_those_dropped():
    # 7 drafted, 2 of them dropped unverified (a dynamic exit's or a p-min stop's last token)
    c = Counts(tokens=6, target_calls=3, num_drafts=3, drafted=7, verified=5, accepted=3)
    s = Summary.from_counts(c)
    assert (s.drafted, s.verified, s.accepted, s.wasted_draft_tokens) == (7, 5, 3, 4)
    assert s.to_dict()["verified"] == 5


def test_cost_of_sd_at_the_reference_gamma_is_one():
    sim = Simulator(trace())
    ref = sim.reference()
    assert sim.run("sd", {"gamma": ref.gamma}).summary.cost == 1.0
    # AD makes one target call per token: 6 calls against the reference's
    assert sim.run("ad").summary.cost == approx(6 / ref.target_calls)
    assert sim.run("ad").summary.extra["reference_gamma"] == ref.gamma


def test_ratios_of_an_empty_run_are_nan_not_an_error():
    s = Summary.from_counts(Counts())
    assert all(math.isnan(getattr(s, k)) for k in ("speedup", "mat", "tokens_per_target_call", "acceptance_rate",
                                                    "tokens_per_s", "draft_busy", "target_busy"))


def test_counts_add_field_by_field():
    a = Counts(1, 2, 3, 4, 5, 6, 7.0, 8.0, 9.0, 10.0, 11)
    b = Counts(10, 20, 30, 40, 50, 60, 70.0, 80.0, 90.0, 100.0, 110)
    assert total([a, b]) == Counts(11, 22, 33, 44, 55, 66, 77.0, 88.0, 99.0, 110.0, 121)


def test_to_dict_flattens_extra_next_to_the_metrics():
    s = Summary.from_counts(Counts(tokens=2, target_calls=1, wall_time_s=1.0, ad_wall_time_s=2.0))
    s.extra["reference_gamma"] = 3
    d = s.to_dict()
    assert d["reference_gamma"] == 3 and "extra" not in d and d["speedup"] == 2.0


def test_position_stats_expand_round_histograms():
    # rounds (checked, accepted): (3, 3), (3, 1), (1, 0), (2, 2)
    stats = PositionStats()
    for checked, accepted in [(3, 3), (3, 1), (1, 0), (2, 2)]:
        stats.add(checked, accepted)
    # position 0: checked by all 4 rounds, accepted by 3 of them (all but (1, 0));
    # position 1: checked by 3 (all but (1, 0)), accepted by 2; position 2: checked 2, accepted 1
    assert stats.checked == [4, 3, 2]
    assert stats.accepted == [3, 2, 1]
    assert stats.rates() == [0.75, 2 / 3, 0.5]
    assert PositionStats().checked == [] and PositionStats().rates() == []


def test_position_stats_of_two_runs_add_up():
    # the rounds above, split between two runs (as the live report sums its prompts' runs);
    # each run has a round that checked 3 tokens, so their counts of such rounds must add
    first, second = PositionStats(), PositionStats()
    first.add(3, 3)
    first.add(1, 0)
    second.add(3, 1)
    second.add(2, 2)
    first += second
    assert (first.checked, first.accepted) == ([4, 3, 2], [3, 2, 1])


def test_only_a_legacy_column_whose_new_name_is_absent_is_renamed():
    assert upgrade_columns(["policy", "mean_accept_len"]) == {"mean_accept_len": "tokens_per_target_call"}
    assert upgrade_columns(["policy"]) == {}
    assert upgrade_columns(["mean_accept_len", "tokens_per_target_call"]) == {}  # today's column wins

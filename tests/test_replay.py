"""Greedy replay is exact: rounds counted by hand on small traces."""

import dataclasses
import math
import random
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.common.signals import TokenSignal
from simlab.latency.grid import LatencyGrid, suffix_least
from simlab.policies import REGISTRY
from simlab.policies.base import Decision, PromptInfo, RoundState
from simlab.policies.oracle import schedule
from simlab.policies.rounds import DraftLoop
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace
from simlab.trace.replay import SignalRun, TraceReplay, runs_of
from simlab.trace.tables import Columns
from tests.helpers import (
    EveryRoundParallel,
    SerialThenParallel,
    hand_trace,
    latency_table,
)

# position:  0 | 1 2 3 4 5 6 7 8 9 10 11   (position 0 comes from the prefill)
PATTERN = "1" + "11011110010"
ROOT = Path(__file__).resolve().parents[1]


def test_runs_count_consecutive_accepts():
    assert runs_of([True, True, False, True, True, True, True, False]) == [2, 1, 0, 4, 3, 2, 1, 0]
    assert runs_of([]) == []  # no positions, no runs


def rounds(result):
    return [(s.args["position"], s.args["tokens"], s.args["accepted"]) for s in result.timeline if s.device == "target"]


def test_sd_gamma3_rounds_by_hand():
    sim = Simulator(hand_trace([PATTERN]))
    res = sim.run("sd", {"gamma": 3}, timeline_prompt=0, with_cost=False)
    # (start, verified positions, accepted): 1..3 -> 2 accepted + correction at 3; 4..6 all
    # accepted + bonus 7; 8 and 9 rejected; a round may draft at most n-c-1 tokens, so 2 at
    # position 9 and 1 at position 10.
    assert rounds(res) == [(1, 4, 2), (4, 4, 3), (8, 4, 0), (9, 3, 0), (10, 2, 1)]
    s = res.summary
    assert (s.target_calls, s.accepted, s.drafted, s.tokens) == (5, 6, 12, 11)
    assert s.mat == pytest.approx(6 / 5)
    assert s.tokens_per_target_call == pytest.approx(11 / 5)
    assert s.wall_time_s == pytest.approx(12 * 0.1 + 5 * 1.0)
    assert s.ad_wall_time_s == pytest.approx(11 * 1.0)


def test_sd_gamma3_vllm_counters_by_hand():
    """The rounds above drafted 3, 3, 3, 2, 1 tokens and had 2, 3, 0, 0, 1 accepted: five drafts;
    token 0 accepted in three of them, token 1 in two, token 2 in one (vLLM's unconditional rates)."""
    s = Simulator(hand_trace([PATTERN])).run("sd", {"gamma": 3}, with_cost=False).summary
    assert s.num_drafts == 5
    assert s.mean_acceptance_length == pytest.approx(1 + 6 / 5)
    assert s.acceptance_per_position == pytest.approx([3 / 5, 2 / 5, 1 / 5])


def test_autoregressive_has_no_drafts():
    s = Simulator(hand_trace([PATTERN])).run("ad", with_cost=False).summary
    assert s.num_drafts == 0 and s.acceptance_per_position == []
    assert math.isnan(s.mean_acceptance_length)


def test_sd_gamma1_rounds_by_hand():
    res = Simulator(hand_trace([PATTERN])).run("sd", {"gamma": 1}, timeline_prompt=0, with_cost=False)
    assert [(p, a) for p, _, a in rounds(res)] == [(1, 1), (3, 0), (4, 1), (6, 1), (8, 0), (9, 0), (10, 1)]
    assert (res.summary.target_calls, res.summary.accepted, res.summary.drafted) == (7, 4, 7)


def test_decoding_stops_at_the_end_token_even_when_drafts_run_past_it():
    """The decoder caps drafts by its budget (20), not by where the text ends (10 tokens)."""
    trace = hand_trace(["1" * 10], stop="eos", max_new_tokens=20)
    res = Simulator(trace).run("sd", {"gamma": 5}, timeline_prompt=0, keep_tokens=True, with_cost=False)
    # 1..5 accepted + bonus at 6; then 5 drafts from 7 of which only 8 and 9 exist: the end
    # token (position 9) is always the target's, so 2 accepted and decoding ends at 10.
    assert rounds(res) == [(1, 6, 5), (7, 6, 2)]
    assert res.tokens[0] == trace.positions.target_token.tolist()[1:]
    assert (res.summary.tokens, res.summary.drafted, res.summary.accepted) == (9, 10, 7)


def test_ad_is_one_target_call_per_token():
    res = Simulator(hand_trace([PATTERN])).run("ad", with_cost=False)
    assert (res.summary.target_calls, res.summary.draft_calls, res.summary.speedup) == (11, 0, pytest.approx(1.0))


def test_oracle_drafts_exactly_the_accepted_runs_when_verify_is_flat():
    res = Simulator(hand_trace([PATTERN])).run("oracle", timeline_prompt=0, with_cost=False)
    assert [(p, k, a) for p, k, a in rounds(res)] == [(1, 3, 2), (4, 5, 4), (9, 1, 0), (10, 2, 1)]
    assert res.summary.wall_time_s == pytest.approx(0.2 + 1 + 0.4 + 1 + 1 + 0.1 + 1)


def brute_force_best(pattern: str, draft: float, verify: dict[int, float]) -> float:
    """Try every sequence of draft lengths (tiny traces only), paying the draft's catch-up: a
    round's first draft forward feeds f tokens (two after a round that accepted all its drafts,
    one more for each round before it that drafted nothing) and costs draft x (verify[f] /
    verify[1] - 1) more than a step when that is positive (LatencyGrid.catch_up_seconds)."""
    bits = [ch == "1" for ch in pattern]
    n = len(bits)

    def best(c: int, feed: int) -> float:
        if c >= n:
            return 0.0
        options = [verify[1] + best(c + 1, feed + 1)]
        for k in range(1, n - c):
            accepted = 0
            while accepted < k and bits[c + accepted]:
                accepted += 1
            catch_up = draft * max(verify[feed] / verify[1] - 1.0, 0.0)
            options.append(catch_up + k * draft + verify[k + 1] + best(c + accepted + 1, 2 if accepted == k else 1))
        return min(options)

    return best(1, 1)


def test_oracle_is_the_fastest_serial_schedule_even_when_verify_is_not_monotone():
    """With a 4-token verify cheaper than a 3-token one (as measured on a 2-core CPU), drafting
    past the first mismatch can pay: the oracle must find that, not just draft the run."""
    verify = {1: 1.0, 2: 2.0, 3: 3.0, 4: 1.5, 5: 5.0, 6: 6.0, 7: 7.0, 8: 8.0}
    pattern = "1" + "110" + "110"
    sim = Simulator(hand_trace([pattern], latency=latency_table(draft=0.01, verify=verify)))
    res = sim.run("oracle", timeline_prompt=0, with_cost=False)
    assert res.summary.wall_time_s == pytest.approx(brute_force_best(pattern, 0.01, verify))
    assert rounds(res)[0] == (1, 4, 2)  # drafts 3 although only 2 will be accepted
    for gamma in range(1, 8):
        assert res.summary.wall_time_s <= sim.run("sd", {"gamma": gamma}, with_cost=False).summary.wall_time_s + 1e-12


def test_oracle_plans_the_drafts_catch_up():
    """A round after one that accepted every draft first feeds the draft two tokens, which costs
    0.1 x (verify[2] / verify[1] - 1) = 0.2 s on top of its first step. On "1" + "110" + "110"
    (draft steps 0.1 s, verify 1 s for 1 and for 3 or more tokens, 3 s for 2): drafting 2 and
    accepting both from position 1, then 2 from position 4, is 1.2 + (0.2 + 1.2) = 2.6 s (what
    sd at gamma 2 runs); drafting 3 from position 1 emits the same 3 tokens but rejects one, so
    the next round feeds one token: 1.3 + 1.2 = 2.5 s. A programme blind to the catch-up
    planned the first (2.4 s planned, 2.6 s run)."""
    verify = {1: 1.0, 2: 3.0, **{k: 1.0 for k in range(3, 9)}}
    pattern = "1" + "110" + "110"
    sim = Simulator(hand_trace([pattern], latency=latency_table(draft=0.1, verify=verify)))
    res = sim.run("oracle", timeline_prompt=0, with_cost=False)
    assert rounds(res) == [(1, 4, 2), (4, 3, 2)]
    assert res.summary.wall_time_s == pytest.approx(2.5) == brute_force_best(pattern, 0.1, verify)
    assert sim.run("sd", {"gamma": 2}, with_cost=False).summary.wall_time_s == pytest.approx(2.6)


def reference_programme(rounds, run, n, budget, top_k, catch_up):
    """The oracle's programme as its module docstring's first lines write it, over every state
    (c, f) (no unrolling, no early stop): a plain step adds a token to feed, a drafting round
    pays u(c, f) and leaves f = 2 if it accepted every draft, else f = 1."""
    v = [[0.0] * (n + 2) for _ in range(n + 1)]
    for c in range(n - 1, 0, -1):
        r = min(run[c], n - c - 1)
        for f in range(1, c + 1):  # a prompt's first round feeds one token: f <= c
            best = rounds[c - 1][0] + v[c + 1][f + 1]
            for k in range(1, min(top_k, budget - c - 1) + 1):
                after = v[c + k + 1][2] if k <= r else v[c + r + 1][1]
                best = min(best, rounds[c - 1][k] + (catch_up(c, f) if f > 1 else 0.0) + after)
            v[c][f] = best
    return v[1][1]


def seconds_of(choice, rounds, run, n, catch_up):
    """What the rounds ``choice`` names cost, walked as the executor runs them."""
    c, feed, total = 1, 1, 0.0
    while c < n:
        k, r = choice[c], min(run[c], n - c - 1)
        total += rounds[c - 1][k] + (catch_up(c, feed) if k and feed > 1 else 0.0)
        c, feed = (c + 1, feed + 1) if k == 0 else (c + k + 1, 2) if k <= r else (c + r + 1, 1)
    return total


@pytest.mark.parametrize("seed", range(6))
def test_the_oracles_programme_is_the_search_over_every_state(seed):
    # random round prices (not monotone in k), catch-ups not monotone in the tokens fed, and
    # stretches of rejections and cheap plain steps, where plain steps before a drafting round pay
    rng = random.Random(seed)
    n, top_k = 70, rng.choice([3, 16])
    budget = n + rng.choice([0, 5])
    run = [0 if rng.random() < 0.4 else min(int(rng.expovariate(0.3)), 20) for _ in range(n)]
    rounds = [[rng.uniform(0.2, 1.0)] + [rng.uniform(0.5, 1.5) for _ in range(top_k)] for _ in range(n - 1)]
    table = {(c, f): rng.uniform(0.0, 0.8) for c in range(n) for f in range(2, n + 2)}
    asked = []  # schedule() asks for each catch-up row once

    def catch_up(f):
        asked.append(f)
        return [table[c, f] for c in range(n)]

    seconds, choice = schedule(rounds, suffix_least(rounds), run, n, budget, top_k, catch_up)
    assert len(asked) == len(set(asked))
    assert seconds == pytest.approx(reference_programme(rounds, run, n, budget, top_k, lambda c, f: table[c, f]), abs=1e-9)
    assert seconds_of(choice, rounds, run, n, lambda c, f: table[c, f]) == pytest.approx(seconds, abs=1e-9)


def test_on_a_tie_the_oracle_drafts_the_least_k():
    # n = 4, budget 4, top_k 2; run[1] = 1 (position 1 accepted, 2 rejected); every round costs
    # 5 s with no draft, 1 s with 1 or 2 drafts. From 1: k = 1 accepts it (positions 1, 2), then
    # a plain step at 3: 1 + 5 = 6 s; k = 2 rejects at 2 and emits the same two tokens: 1 + 5 =
    # 6 s too. A tie: the least k, 1, wins.
    rounds = [[5.0, 1.0, 1.0]] * 3
    seconds, choice = schedule(rounds, suffix_least(rounds), [2, 1, 0, 0], 4, 4, 2, lambda f: [0.0] * 4)
    assert seconds == 6.0
    assert choice == [0, 1, 0, 0, 0]


def test_on_a_tie_the_oracle_drafts_rather_than_step():
    # n = 3, budget 3, top_k 1; run[1] = 1. From 1, drafting 1 token (accepted) emits positions 1
    # and 2 in one 2 s round; two plain steps cost 1 + 1 = 2 s too. A tie: the drafting round wins.
    rounds = [[1.0, 2.0]] * 2
    seconds, choice = schedule(rounds, suffix_least(rounds), [2, 1, 0], 3, 3, 1, lambda f: [0.0] * 3)
    assert seconds == 2.0
    assert choice == [0, 1, 0, 0]


def test_the_oracle_plans_past_its_latency_grid_as_within_it():
    # test_oracle_plans_the_drafts_catch_up's trace (prompt length 10, 7 positions) with a grid
    # tabulated only to context 4: every price comes from the latency model instead, the same
    # figures, so the same plan of 2.5 s: 3 drafts from 1, then 2 from 4
    verify = {1: 1.0, 2: 3.0, **{k: 1.0 for k in range(3, 9)}}
    sim = Simulator(hand_trace(["1" + "110" + "110"], latency=latency_table(draft=0.1, verify=verify)))
    context = sim.context()
    short = dataclasses.replace(context, latency=LatencyGrid(context.latency.model, 4))
    p = sim.replay.prompts[0]
    for ctx in (context, short):
        oracle = REGISTRY["oracle"](ctx)
        oracle.reset(PromptInfo(p.prompt_id, p.prompt_len, p.n_tokens, p.budget, replay=p))
        assert oracle.expected_seconds == pytest.approx(2.5)
        assert [oracle.plan(RoundState(c, 7 - c, 0, 10 + c)).max_draft for c in (1, 4)] == [3, 2]


def test_cost_is_relative_to_sd_at_its_best_gamma():
    sim = Simulator(hand_trace([PATTERN, "1" + "1111111110" + "11"]))
    ref = sim.reference()
    best = max(range(1, 25), key=lambda g: sim.run("sd", {"gamma": g}, with_cost=False).summary.speedup)
    assert ref.gamma == best
    res = sim.run("sd", {"gamma": 1})
    assert res.summary.cost == pytest.approx(res.summary.target_calls / ref.target_calls)
    assert sim.run("sd", {"gamma": best}).summary.cost == pytest.approx(1.0)


# (tree policies need tree data: their tokens are checked in tests/test_tree_policies.py)
# (rest needs a datastore: its tokens are checked in tests/test_lookup.py)
@pytest.mark.parametrize("policy", sorted(name for name, cls in REGISTRY.items()
                                          if not cls.drafts_trees and name != "rest"))
def test_every_policy_emits_exactly_the_target_tokens(policy):
    patterns = [PATTERN, "1" + "0" * 7, "1" * 30, "1" + "10" * 12]
    early_exit = {2: ["1" + "01" * (len(p) // 2) for p in patterns], 5: patterns}  # for layerskip, del
    trace = hand_trace(patterns, layers={layer: [p[: len(q)] for p, q in zip(ps, patterns)]
                                         for layer, ps in early_exit.items()},
                       latency=latency_table(layers={2: 0.02, 5: 0.05}), n_layers=8)
    res = Simulator(trace).run(policy, keep_tokens=True, with_cost=False)
    for pid, tokens in res.tokens.items():
        expect = trace.positions[trace.positions.prompt_id == pid].sort_values("pos").target_token.tolist()[1:]
        assert tokens == expect
    assert res.summary.accepted <= res.summary.drafted


def test_seed_makes_stochastic_replay_reproducible():
    conf = [[0.1 + 0.8 * ((t * 7) % 10) / 10 for t in range(200)]]
    trace = hand_trace(["1" * 200], conf=conf, temperature=1.0)  # accept with prob q(y)/p(y) = conf
    runs = {seed: Simulator(trace, seed=seed).run("sd", {"gamma": 4}, with_cost=False).summary for seed in (1, 1, 2)}
    a = Simulator(trace, seed=1).run("sd", {"gamma": 4}, with_cost=False).summary
    assert a.to_dict() == runs[1].to_dict()
    assert runs[2].target_calls != a.target_calls or runs[2].accepted != a.accepted


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stochastic_replay_accepts_with_probability_q_over_p(seed):
    # 2,000 positions whose draft probability of the target's token is q = 0.5 c and whose target
    # probability is p = 0.5, so min(1, q/p) = c, cycling through c = 0.1, 0.18, ..., 0.82 (each
    # 200 times): the expected acceptance rate is their mean, 0.1 + 0.8 * 4.5 / 10 = 0.46, with a
    # binomial standard deviation sqrt(200 * 1.956) / 2000 = 0.0099 (sum of c(1 - c) over one
    # cycle: 0.09 + 0.1476 + ... + 0.1476 = 1.956). Four deviations (0.040)
    # separate it from rules that read q alone (0.23) or 1 - q/p (0.54).
    n = 2000
    conf = np.array([0.1 + 0.8 * ((t * 7) % 10) / 10 for t in range(n)])
    trace = hand_trace(["1" * n], conf=[conf.tolist()], temperature=1.0)
    trace.positions["q_target"] *= 0.5
    trace.positions["p_target"] = 0.5
    accept = np.array(TraceReplay(trace, seed).prompts[0].draft.accept)
    sd = math.sqrt((conf * (1 - conf)).sum()) / n
    assert sd == pytest.approx(0.0099, abs=1e-4)
    assert abs(accept.mean() - 0.46) < 4 * sd
    # and acceptance follows c position by position: the 0.82 positions beat the 0.1 ones
    assert accept[conf > 0.8].mean() > 0.7 and accept[conf < 0.15].mean() < 0.2


@pytest.mark.parametrize("policy", [EveryRoundParallel, SerialThenParallel])
@pytest.mark.parametrize("stop", ["length", "eos"])
def test_parallel_rounds_are_lossless_up_to_the_budget(policy, stop):
    """Pending drafts that reach the budget are verified alone; nothing passes the end."""
    patterns = [PATTERN, "1" * 13, "1" + "110" * 6, "1" + "0" * 9]
    trace = hand_trace(patterns, stop=stop, max_new_tokens=16 if stop == "eos" else 0)
    sim = Simulator(trace)
    run = SimExecutor(sim.latency, keep_tokens=True).run(TraceReplay(trace), policy(sim.context()))
    for prompt, pattern in zip(run.prompts, patterns):
        target = trace.positions[trace.positions.prompt_id == prompt.prompt_id].target_token.tolist()
        assert prompt.tokens == target[1:]
        assert prompt.counts.accepted <= prompt.counts.drafted
    assert sum(p.counts.parallel_rounds for p in run.prompts) > 0


def test_drafting_past_a_rejection_reads_the_rollout_step_by_step():
    # positions 1..6 of "1101111": a run from 1 accepts 1, is rejected at d = 2, and its 3rd,
    # 4th, 5th tokens are steps 1, 2, 3 of the rollout recorded at 2 (t - d = 1, 2, 3); the 6th
    # runs past the rollout's end, repeats step 3 and is counted as an overrun
    trace = hand_trace(["1101111"])
    trace.rollouts = pd.DataFrame({"prompt_id": 0, "pos": 2, "step": [1, 2, 3], "token": [5, 6, 7],
                                   "draft_conf": [0.5, 0.25, 0.125], "draft_entropy": [1.5, 2.0, 2.5]})
    rp = TraceReplay(trace).prompts[0]
    signals = list(islice(rp.signals(1, first=3), 4))  # the run's tokens 3..6
    assert [(s.confidence, s.entropy) for s in signals] == [(0.5, 1.5), (0.25, 2.0), (0.125, 2.5), (0.125, 2.5)]
    assert rp.rollout_overruns == 1


def tail_trace(tail_conf: list[float]):
    """Positions 0..3 all accepted, ending at the end token (8 is the draft's end token too),
    and the draft's tail past position 3: steps 0, 1, 2 at positions 4, 5, 6."""
    trace = hand_trace(["1111"], stop="eos", max_new_tokens=12)
    trace.manifest.eos_token_ids = [8]
    trace.rollouts = pd.DataFrame({"prompt_id": 0, "pos": 4, "step": [0, 1, 2], "token": [7, 8, 9],
                                   "draft_conf": tail_conf, "draft_entropy": [1.5, 2.0, 2.5], "layer": -1})
    return trace


def test_a_run_accepted_to_the_end_drafts_on_into_the_tail():
    # a run from 1 accepts 1..3 (d = n = 4); its 4th..6th tokens are the tail's steps 0..2 (the
    # 5th an end token), the 7th repeats step 2 and is the one overrun; without a tail the 4th
    # is already an overrun, position 3's signal again (as are the next, teacher-forced stand-ins)
    rp = TraceReplay(tail_trace([0.5, 0.25, 0.125])).prompts[0]
    signals = list(islice(rp.signals(1), 7))
    assert [(s.confidence, s.end) for s in signals[3:]] == [(0.5, False), (0.25, True), (0.125, False), (0.125, False)]
    assert rp.rollout_overruns == 1
    drafted, said = rp.draft_until(1, None, 7, lambda s: False)
    assert repr(drafted) == repr(signals) and said is False and rp.rollout_overruns == 2
    bare = hand_trace(["1111"], stop="eos", max_new_tokens=12)
    rp = TraceReplay(bare).prompts[0]
    assert [s.confidence for s in islice(rp.signals(1), 5)][3:] == [0.9, 0.9] and rp.rollout_overruns == 1


def test_a_confidence_stopped_draft_stops_past_the_end_where_the_tail_is_unsure():
    # hf-confidence (threshold 0.4, at most 8) from position 1 drafts 1..3 on the path (0.9);
    # past the end a sure tail lets it draft on to the tail's end token (step 1, position 5),
    # an unsure one stops it at the tail's first token
    calls = [Simulator(tail_trace([c, c, c])).run("hf-confidence", {"max_draft": 8, "threshold": 0.4},
                                                  with_cost=False).summary.draft_calls for c in (0.95, 0.1)]
    assert calls == [5, 4]


def test_an_exit_layer_past_a_rejection_reads_its_own_rollout_else_its_teacher_forced_signals():
    # the draft and exit layers 2 and 5 all diverge at d = 2; a run from 1 reads its 3rd and 4th
    # tokens past d: layer 2 its own rollout, the draft its own, layer 5 (no rollouts of its own)
    # its teacher-forced confidences at positions 3 and 4 (0.9: matches) -- unless 5 is the draft
    # layer of a self-speculative trace, whose rollouts are the draft's
    trace = hand_trace(["1101111"], layers={2: ["1101111"], 5: ["1101111"]})
    rows = {"prompt_id": 0, "pos": 2, "step": [1, 2], "token": [5, 6], "draft_entropy": [1.5, 2.0]}
    trace.rollouts = pd.concat([pd.DataFrame({**rows, "draft_conf": [0.7, 0.6], "layer": -1}),
                                pd.DataFrame({**rows, "draft_conf": [0.5, 0.25], "layer": 2})], ignore_index=True)

    def conf(replay, layer):
        return [s.confidence for s in islice(replay.prompts[0].signals(1, layer, first=3), 2)]

    replay = TraceReplay(trace)
    assert (conf(replay, None), conf(replay, 2), conf(replay, 5)) == ([0.7, 0.6], [0.5, 0.25], [0.9, 0.9])
    trace.manifest.draft_layer = 5
    assert conf(TraceReplay(trace), 5) == [0.7, 0.6]


def test_an_unrecorded_exit_layer_is_refused_with_the_layers_there_are():
    with pytest.raises(SimlabError, match=r"no early-exit signals for layer 3 \(layers: none\)$"):
        TraceReplay(hand_trace(["1101"])).prompts[0].path(3)
    with pytest.raises(SimlabError, match=r"no early-exit signals for layer 3 \(layers: \[2, 5\]\)$"):
        TraceReplay(hand_trace(["1101"], layers={2: ["1001"], 5: ["1101"]})).prompts[0].path(3)


def signal_by_definition(rp, start: int, i: int, layer=None):
    """The i-th signal of a run from ``start`` as the module docstring defines it, and whether
    reading it is a rollout overrun: what PromptReplay.signals (built for speed) must produce."""
    path, n = rp.path(layer), rp.n_tokens
    r, t = path.run[start], start + i - 1
    score = (lambda u: math.nan) if path.score is None else path.score.__getitem__
    if i <= r + 1:  # on the true path, or just past its end: the tail's step 0 where there is one
        head = path.rollouts.head(t) if t == n else None
        if head is not None:
            return (i, *head), False
        u = min(t, n - 1)
        return (i, path.confidence[u], path.entropy[u], score(u), path.end[u]), t >= n
    d = start + r
    rollout = path.rollouts.get(d)
    if rollout is None:
        u = min(t, n - 1)
        return (i, path.confidence[u], path.entropy[u], score(u), path.end[u]), False
    rconf, rent, rends = rollout
    j = min(t - d, len(rconf))
    return (i, rconf[j - 1], rent[j - 1], math.nan, rends[j - 1]), t - d > len(rconf)


@pytest.mark.parametrize("trace, seed, layer", [
    ("traces/synthetic-iid", 0, None),
    ("traces/smollm2-selfspec", 0, "some"),
    ("results/live/smollm2-t07/traces/seed0", 3, None),  # stochastic: some rejections have no rollout
])
def test_replayed_signals_follow_their_definition(trace, seed, layer):
    rng = np.random.default_rng(0)
    prompts = TraceReplay(read_trace(ROOT / trace), seed=seed).prompts
    for rp in prompts[:: max(1, len(prompts) // 8)]:
        at = None if layer is None else sorted(rp.layers)[len(rp.layers) // 2]
        for start in rng.integers(0, rp.n_tokens, 20).tolist() + [rp.n_tokens - 1]:
            first = int(rng.integers(1, 12))
            before = rp.rollout_overruns
            got = list(islice(rp.signals(start, at, first), 40))
            want = [signal_by_definition(rp, start, first + k, at) for k in range(40)]
            assert repr(got) == repr([TokenSignal(*s) for s, _ in want])
            assert rp.rollout_overruns - before == sum(over for _, over in want)


def test_replayed_shadow_tokens_follow_their_definition():
    # a round's rows of the prompt's shadow table: per settled position 1, then per exit layer
    # (ascending) 1 where its token matches, its confidence where it matches, where it does not
    rng = random.Random(0)
    for rp in TraceReplay(read_trace(ROOT / "traces/smollm2-selfspec")).prompts[::4]:
        layers = sorted(rp.layers)
        paths, n = [rp.layers[layer] for layer in layers], len(rp.layers[layers[0]].accept)
        for start in [rng.randrange(n) for _ in range(20)] + [n - 1]:
            count = rng.choice([1, 2, 5, 19])
            want = [[1.0] + [float(p.accept[t]) for p in paths] + [p.confidence[t] if p.accept[t] else 0.0 for p in paths]
                    + [0.0 if p.accept[t] else p.confidence[t] for p in paths] for t in range(start, min(start + count, n))]
            got = rp.shadows(start, count)
            assert (got.start, got.layers, got.table.tolist()) == (start, tuple(layers), want)


@pytest.mark.parametrize("trace, seed, layers", [
    ("traces/synthetic-iid", 0, False),
    ("traces/smollm2-selfspec", 0, True),  # exit layers with and without their own rollouts
    ("results/live/smollm2-t07/traces/seed0", 3, False),  # stochastic: some rejections have no rollout
])
def test_draft_until_reads_what_a_draft_loop_over_the_signals_reads(trace, seed, layers):
    # the simulator drafts a stop rule's round with draft_until, in one frame; DraftLoop.run over
    # signals() is the definition: the same signals, the same ending, the same rollout overruns
    rng = random.Random(seed)
    prompts = TraceReplay(read_trace(ROOT / trace), seed=seed).prompts
    for rp in prompts[:: max(1, len(prompts) // 6)]:
        for start in [rng.randrange(rp.n_tokens) for _ in range(25)] + [rp.n_tokens - 1, rp.n_tokens - 2]:
            layer = rng.choice([None, *rp.layers]) if layers else None
            cap, level, at_end = rng.choice([1, 2, 5, 17, 40]), rng.choice([0.0, 0.3, 0.6, 0.9, 2.0]), rng.random() < 0.5
            if rng.random() < 0.5:  # a stop rule, and how the simulator reads draft_until's answer
                loop = DraftLoop(start, cap, layer, None, at_end, lambda s, level=level: s.confidence < level)
                rule, go = loop.stops, False
                decided = lambda said: Decision.DRAFT if said is False else Decision.VERIFY  # noqa: E731
            else:  # on_draft, with every decision
                loop = DraftLoop(start, cap, layer, lambda s, level=level: Decision.DROP if s.confidence < level / 2
                                 else Decision.PARALLEL if s.index == 7 else Decision.VERIFY if s.confidence < level
                                 else Decision.DRAFT, at_end)
                rule, go = loop.on_draft, Decision.DRAFT
                decided = lambda said: Decision.VERIFY if said is None else said  # noqa: E731
            before = rp.rollout_overruns
            drafted, decision = loop.run(rp.signals(start, layer))
            by_loop = rp.rollout_overruns - before
            got, said = rp.draft_until(start, layer, cap, rule, at_end, go)
            assert repr(got) == repr(drafted) and decided(said) is decision
            assert rp.rollout_overruns - before == 2 * by_loop


def test_a_signal_run_slices_like_the_tuple_of_its_signals():
    # the run of 5 drafts from position 1 of PATTERN: a slice with a step, or without, holds the
    # signals the tuple's slice holds
    rp = TraceReplay(hand_trace([PATTERN])).prompts[0]
    run = SignalRun(rp, 1, 5, None)
    signals = tuple(run)
    assert len(signals) == 5
    for part in (slice(1, 4), slice(None, None, 2), slice(4, 0, -2), slice(-2, None)):
        assert tuple(run[part]) == signals[part], part
    assert isinstance(run[1:4], SignalRun)  # a plain slice stays lazy
    assert (run[-1], run[-5]) == (signals[4], signals[0])  # indices from the end, as a tuple's


def test_recorded_predictor_scores_reach_the_drafts_signals():
    # positions carry a trained predictor's score 0.05 t: the run from 1 reads 0.05, 0.10 and,
    # at its first rejection (3), 0.15; a trace without the column reads NaN
    trace = hand_trace([PATTERN])
    trace.positions["predictor_score"] = 0.05 * trace.positions["pos"]
    rp = TraceReplay(trace).prompts[0]
    assert [s.score for s in islice(rp.signals(1), 3)] == pytest.approx([0.05, 0.10, 0.15])
    assert [s.score for s in rp.draft_until(1, None, 3, lambda s: False)[0]] == pytest.approx([0.05, 0.10, 0.15])
    assert all(math.isnan(s.score) for s in islice(TraceReplay(hand_trace([PATTERN])).prompts[0].signals(1), 3))


def test_a_table_is_sorted_by_all_its_keys_in_order():
    # sorted by (prompt_id, pos, step) the second row comes first: prompt 0 before prompt 1,
    # although pos ties and step rises between them
    df = pd.DataFrame({"prompt_id": [1, 0], "pos": [5, 5], "step": [0, 1]})
    assert Columns("rollouts", df).sorted_by(["prompt_id", "pos", "step"])["prompt_id"].tolist() == [0, 1]
    ordered = Columns("rollouts", df.iloc[::-1])
    assert ordered.sorted_by(["prompt_id", "pos", "step"]) is ordered  # already sorted: returned as is


@pytest.mark.parametrize("policy", ["sd", "pearl"])
def test_at_temperature_an_accepted_draft_token_is_emitted_as_drafted(policy):
    # T = 0.7: a draft token is accepted with probability accept_prob, 1.0 here at every
    # position, so the draft's 7777 at position 3 (the target sampled 103) is accepted and
    # emitted, in serial and parallel rounds alike
    trace = hand_trace(["1" * 12], temperature=0.7, latency=latency_table(draft=0.25))
    trace.positions.loc[trace.positions["pos"] == 3, "draft_token"] = 7777
    tokens = Simulator(trace).run(policy, keep_tokens=True, with_cost=False).tokens[0]
    assert tokens == [101, 102, 7777, *range(104, 112)]

"""The serving simulator: a request alone is `simulate`'s prompt, batching conserves requests and
tokens, batch-level policies cap the draft length, and bad input fails in one line."""

import json
import subprocess
import sys
from collections import deque

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simlab.cli import main
from simlab.common.errors import SimlabError
from simlab.common.locations import ROOT
from simlab.policies import REGISTRY, PolicyContext
from simlab.policies.base import RoundState, Serial
from simlab.serve.batch_policy import BatchSpec, CappedPolicy, GammaByBatch, OffAbove, SmartSpec
from simlab.serve.metrics import Slo, summarize
from simlab.serve.request import ServedRequest
from simlab.serve.run import ServeConfig, serve, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.serve.workload import check_requests, poisson_arrivals, read_arrivals
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace
from tests.helpers import hand_trace, latency_table

SHIPPED = ROOT / "traces" / "qwen-coder-humaneval"
FAR_APART = 1e4  # seconds between arrivals: every request is served alone
CLOCK_ROUNDING = 1e-6  # seconds: sums of forwards on absolute clocks differ in the last bits


@pytest.fixture(scope="module")
def shipped_sim():
    return Simulator(read_trace(SHIPPED))


def alone(n: int) -> list[float]:
    return [i * FAR_APART for i in range(n)]


@pytest.mark.parametrize("max_batch", [1, 8])
@pytest.mark.parametrize("policy,params,stateful", [("sd", {"gamma": 4}, False), ("svip", {}, False), ("ad", {}, False),
                                                    ("adaedl", {}, True), ("oracle", {}, False)])
def test_a_request_served_alone_decodes_exactly_like_simulate(shipped_sim, policy, params, stateful, max_batch):
    sim = shipped_sim
    expected = sim.run(policy, params, with_cost=False).per_prompt.set_index("prompt_id")
    # every request gets a fresh policy object; simulate carries a stateful policy's state
    # (AdaEDL's threshold) from prompt to prompt, so only its first prompt starts alike
    n = 1 if stateful else len(sim.replay.prompts)
    run = serve_once(sim, alone(n), ServeConfig(policy, params, Scheduler(max_batch)), policy, params)
    assert len(run.requests) == n
    for r in run.requests:
        want = expected.loc[r.replay.prompt_id]
        c = r.counts
        assert (c.tokens, c.target_calls, c.drafted, c.accepted) == (
            want.tokens, want.target_calls, want.draft_calls, round(want.mat * want.target_calls))
        assert c.wall_time_s == r.finish - r.first_token == pytest.approx(want.wall_time_s, rel=0, abs=CLOCK_ROUNDING)


TREE_TRACE = ROOT / "traces" / "smollm2-tree"  # top-4 candidates, EAGLE-2 trees of top-k 4, depth 4


@pytest.fixture(scope="module")
def tree_sim():
    return Simulator(read_trace(TREE_TRACE))


@pytest.mark.parametrize("policy,params", [("tree-static", {}), ("tree-static", {"shape": "3x2x1"}), ("eagle2", {}),
                                           ("eagle2", {"nodes": 4}), ("ags-tree", {})])
def test_a_tree_request_served_alone_decodes_exactly_like_simulate(tree_sim, policy, params):
    sim = tree_sim
    expected = sim.run(policy, params, with_cost=False).per_prompt.set_index("prompt_id")
    run = serve_once(sim, alone(len(sim.replay.prompts)), ServeConfig(policy, params), policy, params)
    for r in run.requests:
        want = expected.loc[r.replay.prompt_id]
        c = r.counts
        assert (c.tokens, c.target_calls, c.draft_calls, c.accepted) == (
            want.tokens, want.target_calls, want.draft_calls, round(want.mat * want.target_calls))
        assert c.wall_time_s == pytest.approx(want.wall_time_s, rel=0, abs=CLOCK_ROUNDING)
    # served alone, per-position acceptance is simulate's too (a tree's draft length: its depth)
    single = sim.run(policy, params, with_cost=False).positions
    assert (run.positions.checked, run.positions.accepted) == (single.checked, single.accepted)


@settings(derandomize=True, max_examples=12, deadline=None)
@given(times=st.lists(st.floats(0, 20, allow_nan=False), min_size=1, max_size=10).map(sorted),
       max_batch=st.integers(1, 4), policy=st.sampled_from(["tree-static", "eagle2", "ags-tree"]),
       mixed=st.booleans())
def test_batched_trees_conserve_requests_and_tokens_and_never_overlap_forwards(tree_sim, times, max_batch, policy,
                                                                             mixed):
    run = serve_once(tree_sim, times, ServeConfig(scheduler=Scheduler(max_batch, 2048, mixed)), policy, {}, record=True)
    single = tree_sim.run(policy, {}, with_cost=False).per_prompt.set_index("prompt_id")
    assert sorted(r.request_id for r in run.requests) == list(range(len(times)))
    assert all(r.finished_steps == 1 for r in run.requests)
    for r in run.requests:
        assert r.arrival <= r.admitted <= r.first_token <= r.finish
        assert r.committed == r.replay.n_tokens
        assert r.counts.accepted + r.counts.target_calls == r.replay.n_tokens - 1 == r.counts.tokens
        # no tree policy adapts across rounds: batching changes when a request decodes, not what
        want = single.loc[r.replay.prompt_id]
        assert (r.counts.target_calls, r.counts.draft_calls) == (want.target_calls, want.draft_calls)
    slices = sorted(run.slices, key=lambda s: s.start)
    assert all(a.end <= b.start + 1e-12 for a, b in zip(slices, slices[1:]))
    assert all(s.args["batch"] <= max_batch for s in slices)
    assert sum(s.args.get("accepted", 0) for s in slices) == sum(r.counts.accepted for r in run.requests)


def test_a_cap_cuts_a_tree_to_its_depth_and_a_cap_of_zero_makes_a_plain_step(tree_sim):
    context = tree_sim.context()
    state = RoundState(1, 20, 0, 10)
    fixed = CappedPolicy(REGISTRY["tree-static"](context, shape="3x2x1"))
    grown = CappedPolicy(REGISTRY["eagle2"](context))
    fixed.cap = grown.cap = 2
    assert fixed.plan(state).tree.depth == 2 and fixed.plan(state).tree.size == 3 + 3 * 2
    assert (grown.plan(state).tree, grown.plan(state).topk, grown.plan(state).max_depth) == (None, 4, 2)
    fixed.cap = grown.cap = 0
    assert fixed.plan(state) == grown.plan(state) == Serial(0, True)
    fixed.cap = grown.cap = 9  # deeper than the trees: no cut
    assert fixed.plan(state).tree.depth == 3 and grown.plan(state).max_depth == 4
    # served under --sd-off-above 1, a batch of two trees verifies one token each
    run = serve_once(tree_sim, [0.0] * 4, ServeConfig(batch=BatchSpec(off_above=1), scheduler=Scheduler(2)), "eagle2",
                     {}, record=True)
    big = [s for s in verify_slices(run) if s.args["batch"] == 2]
    assert big and all(s.args["tokens"] == 2 for s in big)
    assert all(r.committed == r.replay.n_tokens for r in run.requests)


def test_a_request_served_alone_counts_per_position_acceptance_by_hand():
    # pattern 1101110 under sd, γ = 2 (as tests/test_metrics.py): round 1 checks positions 1, 2
    # and rejects 2; round 2 checks and accepts 3, 4; round 3 drafts nothing
    run = serve_once(Simulator(hand_trace(["1101110"])), [0.0], ServeConfig(), "sd", {"gamma": 2})
    assert (run.positions.checked, run.positions.accepted) == ([2, 2], [2, 1])


@pytest.mark.parametrize("policy,params", [("sd", {"gamma": 4}), ("ad", {})])
def test_a_request_alone_waits_only_for_its_prefill(shipped_sim, policy, params):
    # the target's prefill, then the draft's over the same prompt; plain decoding runs no draft
    run = serve_once(shipped_sim, alone(3), ServeConfig(), policy, params)
    lat = shipped_sim.latency.model
    for r in run.requests:
        assert r.admitted == r.arrival
        draft = lat.draft_step(0) / lat.target_forward(1, 0) if policy != "ad" else 0.0
        prefill = lat.target_forward(r.prompt_len, 0) * (1 + draft)
        assert r.first_token - r.arrival == pytest.approx(prefill, rel=1e-12)


patterns = st.lists(st.text("01", min_size=0, max_size=25), min_size=1, max_size=4)  # "1" + "": a one-token answer
arrivals = st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=12).map(sorted)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(patterns=patterns, times=arrivals, max_batch=st.integers(1, 4), gamma=st.integers(1, 6),
       budget=st.integers(0, 40), eos=st.booleans(), mixed=st.booleans())
def test_batching_conserves_requests_and_tokens_and_never_overlaps_forwards(patterns, times, max_batch, gamma, budget,
                                                                           eos, mixed):
    # with eos, the last position is the end token and drafts may run past it (budget 40)
    trace = hand_trace(["1" + p for p in patterns], stop="eos" if eos else "length", max_new_tokens=40,
                       latency=latency_table(draft=0.1, verify={k: 1 + 0.1 * k for k in range(1, 41)}))
    sim = Simulator(trace)
    scheduler = Scheduler(max_batch, 10 + max_batch + budget, mixed)
    run = serve_once(sim, times, ServeConfig(scheduler=scheduler), "sd", {"gamma": gamma}, record=True)
    single = sim.run("sd", {"gamma": gamma}, with_cost=False).per_prompt.set_index("prompt_id")
    # every request finishes exactly once, after it arrived, first token before its last
    assert sorted(r.request_id for r in run.requests) == list(range(len(times)))
    assert all(r.finished_steps == 1 for r in run.requests)
    assert len(run.frame) == len(times)
    for r in run.requests:
        assert r.arrival <= r.admitted <= r.first_token <= r.finish
        assert r.committed == r.replay.n_tokens
        # each verification emits its accepted drafts plus one token: nothing counted twice
        assert r.counts.accepted + r.counts.target_calls == r.replay.n_tokens - 1 == r.counts.tokens
        # without a batch-level cap, batching changes when a request decodes, not what it decodes
        assert r.counts.target_calls == single.loc[r.replay.prompt_id].target_calls
    # the engine runs one forward at a time, and never more than max_batch requests
    slices = sorted(run.slices, key=lambda s: s.start)
    assert all(a.end <= b.start + 1e-12 for a, b in zip(slices, slices[1:]))
    assert all(s.args["batch"] <= max_batch for s in slices)
    assert sum(s.args.get("accepted", 0) for s in slices) == sum(r.counts.accepted for r in run.requests)
    # mixed, a prompt rides in a verification whenever one runs in its step: a prefill of its own
    # only where nobody decoded (its step starts no draft or verification)
    decoding = {s.args["step"] for s in slices if s.name.startswith(("draft", "verify"))}
    prefills = {s.args["step"] for s in slices if s.name == "prefill"}
    assert not mixed or not prefills & decoding
    assert mixed or not any(s.name == "verify+prefill" for s in slices)


def test_mixed_prefill_puts_an_arriving_prompt_in_the_running_requests_verification_by_hand():
    # as test_one_request_under_a_cap_by_hand: 10-token prompts, all accepted, draft step 0.25 s,
    # a k-token forward 1.0 + 0.5 (k - 1) s, a prefill of P tokens that forward at k = P times
    # 1.25 (the draft's forward over the prompt). Request 0 arrives at 0 and is prefilled alone:
    # first token at 5.5 * 1.25 = 6.875 s. Request 1 arrives at 1 s and joins the next step,
    # where request 0 drafts 2 tokens (0.5 s) and verifies 3 (2.0 s). Mixed, request 1's prompt
    # rides in that verification: it adds prefill(10 + 3) - prefill(3) = (7.0 - 2.0) * 1.25 =
    # 6.25 s, and request 1's first token comes when it ends, at 6.875 + 0.5 + 2.0 + 6.25 =
    # 15.625 s. Prefill-first, request 1 is prefilled (6.875 s) before request 0's round:
    # first token at 13.75 s, and request 0's round ends at 16.25 s.
    trace = hand_trace(["1" * 10] * 2, latency=latency_table(draft=0.25, verify={1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}))
    runs = {mixed: serve_once(Simulator(trace), [0.0, 1.0], ServeConfig(scheduler=Scheduler(2, 64, mixed)), "sd",
                              {"gamma": 2}, record=True) for mixed in (False, True)}
    for mixed, (first, round_end) in {False: (13.75, 16.25), True: (15.625, 15.625)}.items():
        run = runs[mixed]
        r0, r1 = run.requests
        assert (r0.first_token, r1.admitted, r1.first_token) == (6.875, 6.875, first)
        second = [s for s in run.slices if s.args["step"] == 2 and s.device == "target"]
        assert max(s.end for s in second) == round_end
        assert run.stats.prefill_steps == 2
    [carried] = [s for s in runs[True].slices if s.name == "verify+prefill"]
    assert (carried.start, carried.end, carried.args["batch"], carried.args["tokens"]) == (7.375, 15.625, 2, 13)
    # what each request decodes does not depend on where its prefill ran
    decoded = {mixed: [(c.tokens, c.target_calls, c.drafted, c.accepted) for c in (r.counts for r in run.requests)]
               for mixed, run in runs.items()}
    assert decoded[True] == decoded[False] == [(9, 3, 6, 6)] * 2


def heavy_load_run(batch: BatchSpec, policy="sd", params=None):
    trace = hand_trace(["1" * n for n in (10, 20, 30, 40, 50, 60)], latency=latency_table(draft=0.1, verify={k: 1 + 0.1 * k for k in range(1, 41)}))
    sim = Simulator(trace)
    return serve_once(sim, [0.0] * 6, ServeConfig(scheduler=Scheduler(6, 100), batch=batch), policy,
                      params or {"gamma": 5}, record=True)


def verify_slices(run):
    return [s for s in run.slices if s.name == "verify"]


def test_sd_off_above_a_batch_size_verifies_one_token_per_request_in_larger_batches():
    run = heavy_load_run(BatchSpec(off_above=3))
    big = [s for s in verify_slices(run) if s.args["batch"] > 3]
    assert big and all(s.args["tokens"] == s.args["batch"] for s in big)
    assert any(s.args["tokens"] > s.args["batch"] for s in verify_slices(run) if s.args["batch"] <= 3)


def test_gamma_by_batch_caps_every_request_at_its_batch_sizes_entry():
    run = heavy_load_run(BatchSpec(gamma_by_batch="1:5,4:2"))
    for s in verify_slices(run):
        cap = 2 if s.args["batch"] >= 4 else 5
        assert s.args["tokens"] <= s.args["batch"] * (cap + 1)
    assert any(s.args["tokens"] == 3 * s.args["batch"] for s in verify_slices(run) if s.args["batch"] >= 4)


def test_sd_off_above_b_still_speculates_in_a_batch_of_b():
    assert [OffAbove(3).cap([None] * b, []) for b in (1, 3, 4)] == [None, None, 0]


def test_gamma_by_batch_table_picks_the_largest_batch_size_not_above_the_batch():
    table = GammaByBatch.parse("1:6,4:4,16:0")
    assert [table.cap([None] * b, []) for b in (1, 3, 4, 15, 16, 40)] == [6, 6, 4, 4, 0, 0]


def smartspec_policy(draft: float, acceptance: float, max_gamma=6, verify_slope=0.01):
    """SmartSpec's cap for 4 requests of acceptance estimate ``acceptance`` at context 20, a
    draft step of ``draft`` s and a k-token verification of 1 + ``verify_slope`` k s."""
    trace = hand_trace(["1" * 10], latency=latency_table(draft=draft, verify={k: 1 + verify_slope * k for k in range(1, 41)}))
    sim = Simulator(trace)
    from simlab.latency.batch import BatchLatency

    policy = SmartSpec(BatchLatency(sim.latency), max_gamma)
    requests = []
    for _ in range(4):
        p = CappedPolicy(None)
        p.acceptance = acceptance
        requests.append(p)
    return policy.cap(requests, [20] * 4)


def test_smartspec_drafts_nothing_when_drafting_costs_more_than_it_can_earn():
    assert smartspec_policy(draft=5.0, acceptance=0.9) == 0
    assert smartspec_policy(draft=0.01, acceptance=0.0) == 0


def test_smartspec_drafts_the_longest_length_when_drafts_are_cheap_and_always_accepted():
    assert smartspec_policy(draft=0.001, acceptance=1.0) == 6


def test_smartspec_picks_the_length_of_the_highest_goodput_by_hand():
    # acceptance 0.5 commits E(k) = (1 - 0.5^(k+1)) / 0.5 = 1, 1.5, 1.75, 1.875 tokens a request
    # for k = 0..3; the batch of 4 verifies 4(k + 1) tokens in 1 + 0.05 * 4(k + 1) s, and k
    # draft steps at 0.001 s (times the batch's growth, 1.2 / 1.05) add next to nothing. Goodput
    # per request: 1 / 1.2 = 0.83, 1.5 / 1.401 = 1.07, 1.75 / 1.602 = 1.09, 1.875 / 1.803 = 1.04
    assert smartspec_policy(draft=0.001, acceptance=0.5, verify_slope=0.05) == 2


def test_smartspec_serves_every_request_to_its_end():
    run = heavy_load_run(BatchSpec(smartspec=5))
    assert all(r.committed == r.replay.n_tokens for r in run.requests)
    assert set(run.stats.caps) <= set(range(6))


def test_speculation_pays_at_low_load_on_a_high_acceptance_trace():
    trace = hand_trace(["1" * 60] * 3, latency=latency_table(draft=0.05, verify={k: 1 + 0.05 * k for k in range(1, 41)}))
    res = serve(Simulator(trace), alone(3), ServeConfig("sd", {"gamma": 4}, slo=Slo(ttft_s=1e9)))
    assert res.speedups["tpot_speedup"] > 2
    assert res.run.summary["slo_attainment"] == 1.0


def run_main(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", *map(str, args)])
    err = capsys.readouterr().err.strip()
    return exc.value.code, err


@pytest.mark.parametrize("args,needle", [
    (["--rate", "0"], "--rate"),
    (["--rate", "-2"], "--rate"),
    (["--max-batch", "0"], "--max-batch"),
    (["--requests", "0"], "--requests"),
    (["--slo-ttft", "0"], "--slo-ttft"),
    (["--slo-tpot", "-1"], "--slo-tpot"),
    (["--policy", "pearl"], "parallel"),
    (["--gamma-by-batch", "4:2,1:6"], "--gamma-by-batch"),
    (["--sd-off-above", "4", "--smartspec", "5"], "one batch-level policy"),
])
def test_bad_input_fails_in_one_line_before_the_trace_is_read(args, needle, capsys, tmp_path):
    code, err = run_main([*args, "--trace", tmp_path / "no-such-trace"], capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and needle in err


@pytest.mark.parametrize("lines,needle", [(["1", "0.5"], "sorted"), (["-1", "2"], ">= 0"), (["x"], "number"),
                                          ([], "no arrival times")])
def test_bad_arrivals_files_fail_in_one_line(lines, needle, capsys, tmp_path):
    path = tmp_path / "arrivals.txt"
    path.write_text("\n".join(lines))
    code, err = run_main(["--arrivals", path, "--trace", tmp_path / "no-such-trace"], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and needle in err


def test_serve_cli_writes_json_per_request_results_and_a_timeline(tmp_path):
    arrivals = tmp_path / "arrivals.txt"
    arrivals.write_text("# seconds\n0\n0\n5\n")
    out, timeline = tmp_path / "requests.csv", tmp_path / "timeline.json"
    proc = subprocess.run([sys.executable, "-m", "simlab", "serve", "--trace", SHIPPED, "--arrivals", arrivals,
                           "--gamma", "3", "--max-batch", "2", "--slo-tpot", "10", "--json", "--out", out,
                           "--timeline", timeline], capture_output=True, text=True, check=True)
    res = json.loads(proc.stdout)
    assert res["requests"] == 3 and res["slo_attainment"] == 1.0 and res["batch_latency_extrapolated"]
    base = res["baseline"]
    assert base["requests"] == 3 and res["e2e_speedup"] == pytest.approx(base["e2e_mean_s"] / res["e2e_mean_s"])
    # the baseline runs no draft, so its first tokens come sooner: SD pays the draft's prefill
    assert base["ttft_mean_s"] < res["ttft_mean_s"]
    # the warning says how to probe the batch axis without re-recording a pre-tail trace's rollouts
    assert "extrapolated" in proc.stderr and "--keep-rollouts" in " ".join(proc.stderr.split())
    df = pd.read_csv(out)
    assert list(df.request_id) == [0, 1, 2] and (df.e2e_s >= df.ttft_s).all()
    events = json.loads(timeline.read_text())["traceEvents"]
    assert any(e.get("name") == "verify" and e["args"]["batch"] == 2 for e in events)


def test_serve_bench_serves_every_token_of_every_request():
    from simlab.serve.bench import bench_serve

    r = bench_serve(requests=40, tokens=32, max_batch=4)
    assert r.tokens == 40 * 32 and 1 <= r.mean_batch <= 4 and r.cpu_seconds > 0


def test_serve_prints_latency_percentiles_slo_attainment_and_the_speedup_at_that_load(tmp_path, capsys):
    arrivals = tmp_path / "arrivals.txt"
    arrivals.write_text("0\n1\n")
    main(["serve", "--trace", str(SHIPPED), "--arrivals", str(arrivals), "--smartspec", "4", "--slo-ttft", "1e-3"])
    text = capsys.readouterr().out
    for label in ("(TTFT, ms)", "(TPOT, ms)", "(e2e, s)", "p99", "SLO attainment 0.000", "batch policy smartspec",
                  "acceptance rate", "speedup at this load"):
        assert label in text


def test_serve_records_the_timeline_of_the_served_policy_and_names_its_latency_rule(shipped_sim):
    # two requests alone, sd with γ=4: a prefill, then rounds of a draft phase and a verification
    # each, per request: the recorded slices are the run's forwards, the baseline keeps none
    res = serve(shipped_sim, alone(2), ServeConfig("sd", {"gamma": 4}), record=True)
    slices = res.run.slices
    assert {s.device for s in slices} == {"draft", "target"}
    # named as the timeline plot colours them: the target's prefills and verifications
    assert {s.name for s in slices if s.device == "target"} == {"prefill", "verify"}
    # each slice names its engine step: the first prefill opens step 1, and time never goes back a step
    assert slices[0].args["step"] == 1 and all(a.args["step"] <= b.args["step"] for a, b in zip(slices, slices[1:]))
    # a prefill's tokens are its prompt's (one request a step, alone)
    assert [s.args["tokens"] for s in slices if s.name == "prefill"] == [r.prompt_len for r in res.run.requests]
    verifies = [s for s in slices if s.device == "target" and "accepted" in s.args]
    assert len(verifies) == sum(r.counts.target_calls for r in res.run.requests)
    assert res.run.stats.prefill_steps == 2  # alone, each request is prefilled in a step of its own
    assert res.baseline.slices == [] and serve(shipped_sim, alone(2), ServeConfig()).run.slices == []
    # the shipped trace's latency is a measured table, not a roofline: batches beyond one sequence
    # are priced by the token-count rule, and the result says so
    assert res.extrapolated and res.latency_rule.startswith("batched forwards priced by the token-count rule")


def test_the_token_budget_counts_every_admitted_prompt_and_one_token_per_running_request():
    # three waiting 10-token prompts beside 2 running requests, a budget of 25 tokens: 2 + 10
    # and 2 + 10 + 10 fit, a third prompt (32 tokens) waits, and so does everything behind it
    prompts = Simulator(hand_trace(["11"] * 3)).replay.prompts
    waiting = deque(ServedRequest(i, p, CappedPolicy(None), 0.0) for i, p in enumerate(prompts))
    admitted = Scheduler(max_batch=8, token_budget=25).admit(waiting, running=2)
    assert [r.request_id for r in admitted] == [0, 1] and [r.request_id for r in waiting] == [2]


def waiting_prompts(lens: list[int]) -> deque:
    """Waiting requests, in arrival order, of prompts of ``lens`` tokens."""
    trace = hand_trace(["11"] * len(lens))
    trace.prompts["prompt_len"] = lens
    return deque(ServedRequest(i, p, CappedPolicy(None), 0.0) for i, p in enumerate(Simulator(trace).replay.prompts))


@pytest.mark.parametrize("budget, admitted", [(22, [0, 1]), (21, [0])])
def test_a_prompt_that_fills_the_token_budget_exactly_is_admitted_and_one_token_more_is_not(budget, admitted):
    # 2 running requests (a token each) and 10-token prompts: 2 + 10 + 10 = 22 tokens fills a
    # budget of 22 exactly (admitted: the budget bounds with <=); at 21 the second prompt waits
    waiting = waiting_prompts([10, 10, 10])
    assert [r.request_id for r in Scheduler(max_batch=8, token_budget=budget).admit(waiting, running=2)] == admitted
    assert [r.request_id for r in waiting] == [i for i in range(3) if i not in admitted]


@pytest.mark.parametrize("running, admitted", [(2, [0, 1]), (3, [0]), (4, [])])
def test_admission_fills_the_batch_to_max_batch_exactly(running, admitted):
    # max batch 4 and a budget no prompt reaches: 4 - running requests join, the running included
    waiting = waiting_prompts([10, 10, 10])
    assert [r.request_id for r in Scheduler(max_batch=4, token_budget=1000).admit(waiting, running)] == admitted


def test_a_request_that_does_not_fit_blocks_the_smaller_ones_behind_it():
    # first come, first served: a 15-token head beside 2 running requests needs 17 of a budget of
    # 16 and waits; the 5-token prompt behind it would fit (2 + 5 = 7) but does not overtake it
    waiting = waiting_prompts([15, 5])
    assert Scheduler(max_batch=8, token_budget=16).admit(waiting, running=2) == []
    assert [r.request_id for r in waiting] == [0, 1]


def served_together(n: int, scheduler: Scheduler) -> list:
    """``n`` requests of 10-token prompts and 7 positions (two rounds of sd γ=2, every draft
    accepted) arriving at once, by request id."""
    sim = Simulator(hand_trace(["1111111"] * n))
    run = serve_once(sim, [0.0] * n, ServeConfig(scheduler=scheduler), "sd", {"gamma": 2})
    return sorted(run.requests, key=lambda r: r.request_id)


@pytest.mark.parametrize("budget, n, steps", [(20, 4, [1, 1, 2, 3]), (19, 3, [1, 2, 3])])
def test_the_engine_admits_at_the_token_budgets_exact_boundary_counting_the_running_requests(budget, n, steps):
    # max batch 8. Budget 20: step 1 admits two prompts (10 + 10 = 20), step 2 one (2 running +
    # 10 = 12; + 10 more = 22 > 20), step 3 the last (3 running + 10). Budget 19: one a step, as
    # 10 + 10 = 20 > 19 in step 1 and 1 running + 10 + 10 = 21 > 19 in step 2. (Each step admits
    # at its start, so the admission times rank the steps.)
    requests = served_together(n, Scheduler(8, budget))
    starts = sorted({r.admitted for r in requests})
    assert [starts.index(r.admitted) + 1 for r in requests] == steps


def test_the_engine_admits_a_waiting_request_when_the_full_batch_frees_a_place():
    # max batch 2: the first two are admitted together and decode two steps; the third waits for
    # them and joins at the start of the step after they finish
    first, second, third = served_together(3, Scheduler(2, 1000))
    assert first.admitted == second.admitted == 0.0 and first.finish == second.finish
    assert third.admitted == first.finish > second.first_token


def test_bad_policy_parameters_fail_before_the_scheduler_is_checked():
    # a budget of 1 token is too small for any prompt here, but the bad γ is what is reported
    sim = Simulator(hand_trace(["1111"]))
    with pytest.raises(SimlabError, match="^gamma must be an integer >= 1, got 0$"):
        serve_once(sim, [0.0], ServeConfig(scheduler=Scheduler(8, 1)), "sd", {"gamma": 0})


def test_serving_no_arrivals_is_refused_in_one_line():
    with pytest.raises(SimlabError, match="^nothing to serve: no arrivals$"):
        serve_once(Simulator(hand_trace(["1111"])), [], ServeConfig(), "sd", {"gamma": 2})


def test_a_token_budget_too_small_for_the_longest_prompt_says_what_it_needs():
    # a prompt of 9 tokens beside 3 running requests (max batch 4) needs 9 + 3 = 12 tokens
    with pytest.raises(SimlabError) as err:
        Scheduler(max_batch=4, token_budget=11).check(longest_prompt=9)
    assert str(err.value) == ("--token-budget 11 is too small: the longest prompt (9 tokens) beside 3 running "
                              "requests needs 12")
    Scheduler(max_batch=4, token_budget=12).check(longest_prompt=9)


def test_a_cap_shortens_a_plan_and_keeps_its_drafter():
    # LayerSkip drafts a fixed 6 tokens with exit layer 2; a cap of 3 keeps both, one of 6 is no cap
    inner = REGISTRY["layerskip"](PolicyContext(latency=None, exit_layers=[2, 5], n_layers=8), exit_layer=2)
    capped, state = CappedPolicy(inner), RoundState(0, 20, 0, 10)
    capped.cap = 3
    assert capped.plan(state) == Serial(3, fixed=True, layer=2)
    capped.cap = 6
    assert capped.plan(state) == Serial(6, fixed=True, layer=2)


def test_two_batch_level_policies_are_refused_by_name():
    with pytest.raises(SimlabError) as err:
        BatchSpec(off_above=2, smartspec=4)
    assert str(err.value) == "choose one batch-level policy, got --sd-off-above and --smartspec"
    with pytest.raises(SimlabError) as err:
        BatchSpec(gamma_by_batch="1:4", off_above=2)
    assert str(err.value) == "choose one batch-level policy, got --gamma-by-batch and --sd-off-above"


def test_one_request_under_a_cap_by_hand():
    # a 10-token prompt, all 10 positions accepted; draft step 0.25 s, a k-token target forward
    # 1.0 + 0.5 (k - 1) s (k = 10 extends the last slope: 5.5 s). Prefill: 5.5 s, plus the
    # draft's forward over the prompt, 0.25 * 5.5 / 1.0 = 1.375 s: first token at 6.875 s. The
    # table caps sd's γ = 3 at 2: rounds from positions 1, 4, 7, each 2 drafts (0.5 s) and a
    # 3-token verification (2.0 s) accepting both, 3 tokens a round; the second and third rounds
    # follow one that accepted every draft, so their first draft step feeds two tokens, 0.25 s
    # times the growth from 1 to 2 tokens (1.5): 0.125 s more each. Done at 6.875 + 7.5 + 0.25 s
    trace = hand_trace(["1" * 10], latency=latency_table(draft=0.25, verify={1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}))
    run = serve_once(Simulator(trace), [0.0], ServeConfig(batch=BatchSpec(gamma_by_batch="1:2")), "sd", {"gamma": 3})
    s = run.stats
    assert (s.steps, s.prefill_steps, s.decode_steps, s.batch_sizes, s.draft_forwards, s.caps) == (4, 1, 3, 3, 6, {2: 3})
    assert list(run.frame.columns) == ["request_id", "prompt_id", "prompt_len", "arrival_s", "admitted_s",
                                       "first_token_s", "finish_s", "queue_s", "ttft_s", "tpot_s", "e2e_s", "tokens",
                                       "target_calls", "drafted", "accepted", "meets_slo"]
    row = run.frame.iloc[0]
    assert (row.request_id, row.first_token_s, row.finish_s, row.ttft_s, row.e2e_s) == (0, 6.875, 14.625, 6.875, 14.625)
    assert (row.tokens, row.target_calls, row.drafted, row.accepted) == (10, 3, 6, 6)
    assert row.tpot_s == 7.75 / 9  # 3 rounds of 2.5 s and two catch-ups for the 9 tokens after the first
    assert run.summary["mean_accept_len"] == 3.0  # the 9 tokens after the prefill's over 3 target calls
    assert run.summary["throughput_tokens_per_s"] == 10 / 14.625
    assert run.summary["throughput_requests_per_s"] == 1 / 14.625
    assert run.summary["acceptance_rate"] == 1.0  # 6 accepted of 6 drafted
    # every round checked its 2 drafts and accepted both: positions 0 and 1 checked and accepted 3 times
    assert (run.positions.checked, run.positions.accepted) == ([3, 3], [3, 3])
    # SmartSpec's estimate: from the prior 0.7, each round moves it 0.1 of the way to its rate, 1.0
    assert run.requests[0].policy.acceptance == pytest.approx(1 - 0.3 * 0.9 ** 3, rel=1e-12)


@pytest.mark.parametrize("policy, params", [("layerskip", {"exit_layer": 2, "gamma": 3}), ("del", {})])
def test_a_self_speculative_request_drafts_at_its_exit_layers_price(policy, params):
    # exit layer 2 drafts at 0.02 s a step, the draft model at 0.1 s: LayerSkip (E = 2, γ = 3)
    # and DEL (which reads the layer's shadow tokens) served alone decode as simulate does,
    # every draft step at the layer's price. The layer's first forward feeds its own, empty KV
    # cache the prompt and the first token (11 tokens: 0.02 s x (2.1 / 1.1 - 1) more); a later
    # round's first feeds at most two (after a round that accepted every draft: 0.0018 s more)
    trace = hand_trace(["1111111111"], layers={2: ["1110111011"]},
                       latency=latency_table(draft=0.1, verify={k: 1 + 0.1 * k for k in range(1, 12)}, layers={2: 0.02}))
    sim = Simulator(trace)
    want = sim.run(policy, params, with_cost=False).per_prompt.iloc[0]
    run = serve_once(sim, [0.0], ServeConfig(policy, params), policy, params, record=True)
    r = run.requests[0]
    # DEL drafts and drops a token below its threshold: drafted and paid for, never verified
    assert (r.counts.target_calls, r.counts.drafted, r.counts.draft_calls, r.counts.accepted) == (
        want.target_calls, want.drafted, want.draft_calls, round(want.mat * want.target_calls))
    assert r.finish - r.first_token == pytest.approx(want.wall_time_s, rel=1e-12)
    drafts = [s for s in run.slices if s.name.startswith("draft")]
    steps = [0.02 * int(s.name[len("draft x"):]) for s in drafts]
    assert drafts[0].end - drafts[0].start == pytest.approx(steps[0] + 0.02 * (2.1 / 1.1 - 1))
    assert all(-1e-12 <= s.end - s.start - step <= 0.02 * (1.2 / 1.1 - 1) + 1e-12 for s, step in zip(drafts[1:], steps[1:]))


def test_a_request_meets_the_tpot_objective_only_at_or_under_it():
    # as above without a cap: TPOT 7.625 s / 9 tokens = 0.8472 s (rounds of 3.25 s, 3.375 s whose
    # first draft step feeds two tokens, and a 1.0 s target step)
    trace = hand_trace(["1" * 10], latency=latency_table(draft=0.25, verify={1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}))
    for objective, meets in ((7.625 / 9, True), (0.847, False)):
        run = serve_once(Simulator(trace), [0.0], ServeConfig(slo=Slo(tpot_s=objective)), "sd", {"gamma": 3})
        assert run.frame["meets_slo"].tolist() == [meets]


def test_a_request_meets_the_slo_only_when_it_meets_both_objectives():
    # the request above: TTFT 6.875 s (its prefill), TPOT 0.8472 s
    trace = hand_trace(["1" * 10], latency=latency_table(draft=0.25, verify={1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}))
    for ttft, tpot, meets in ((7.0, 1.0, True), (6.0, 1.0, False), (7.0, 0.8, False)):
        run = serve_once(Simulator(trace), [0.0], ServeConfig(slo=Slo(ttft, tpot)), "sd", {"gamma": 3})
        assert run.frame["meets_slo"].tolist() == [meets], (ttft, tpot)


def test_latency_percentiles_interpolate_between_the_requests():
    # four requests with end-to-end latencies 1, 2, 3, 4 s: the median is 2.5 s, and p90 and
    # p99 interpolate linearly between the ranks (numpy's default, as vLLM's benchmarks report)
    frame = pd.DataFrame({"arrival_s": 0.0, "finish_s": [1.0, 2.0, 3.0, 4.0], "ttft_s": [0.5, 0.5, 1.0, 1.0],
                          "tpot_s": [0.1, np.nan, 0.2, 0.3], "e2e_s": [1.0, 2.0, 3.0, 4.0], "tokens": [10, 1, 10, 10],
                          "target_calls": [3, 0, 3, 3], "drafted": 6, "accepted": 6, "meets_slo": True})
    s = summarize(frame)
    assert (s["e2e_p50_s"], s["e2e_p90_s"], s["e2e_p99_s"]) == pytest.approx((2.5, 3.7, 3.97))
    assert (s["ttft_p50_s"], s["ttft_mean_s"]) == (0.75, 0.75)
    # a one-token answer has no TPOT: the percentiles are of the other three
    assert (s["tpot_p50_s"], s["tpot_p90_s"]) == pytest.approx((0.2, 0.28))


def test_the_latency_rule_reported_is_that_of_the_served_run():
    # batches of 1 and 2 measured; 6 requests at once decode in batches of 6 > 2 x 2, priced
    # beyond the measured sizes: serve() says so even without a baseline run
    single = latency_table(draft=0.1, verify={k: 1 + 0.1 * k for k in range(1, 12)})
    samples = pd.concat([single.assign(batch=1), single.assign(seconds=single["seconds"] * 1.5, batch=2)],
                        ignore_index=True)
    res = serve(Simulator(hand_trace(["1" * 10], latency=samples)), [0.0] * 6,
                ServeConfig("sd", {"gamma": 2}, Scheduler(8, 1000)), baseline=False)
    assert res.extrapolated and res.latency_rule.endswith("batches beyond the measured ones extrapolated linearly")


def test_the_latency_rule_reported_covers_the_baseline_run_too():
    # batches of 1 and 2 measured; a request every 10 s decodes its 39 tokens in about 6 s with
    # sd (γ = 8, every draft accepted), alone, but in about 39 s a token at a time: the baseline
    # piles up batches of 5 and 6, beyond twice the largest measured one, and the result says so
    single = latency_table(draft=0.01, verify={k: 1 + 0.01 * k for k in range(1, 80)})
    samples = pd.concat([single.assign(batch=1), single.assign(seconds=single["seconds"] * 1.5, batch=2)],
                        ignore_index=True)
    sim = Simulator(hand_trace(["1" * 40] * 6, latency=samples))
    config = ServeConfig("sd", {"gamma": 8}, Scheduler(8, 1000))
    assert not serve(sim, [10.0 * i for i in range(6)], config, baseline=False).extrapolated
    res = serve(sim, [10.0 * i for i in range(6)], config)
    assert res.extrapolated and res.latency_rule.endswith("batches beyond the measured ones extrapolated linearly")


def test_bad_objectives_and_request_counts_are_refused_by_flag():
    with pytest.raises(SimlabError, match=r"^--slo-ttft must be a number of seconds > 0, got 0$"):
        Slo(ttft_s=0)
    with pytest.raises(SimlabError, match=r"^--requests must be >= 1, got 0$"):
        check_requests(0)
    check_requests(1)


def test_an_arrivals_file_skips_blank_and_comment_lines_anywhere(tmp_path):
    path = tmp_path / "arrivals.txt"
    path.write_text("# seconds\n0.5\n\n# a burst\n1.0\n1.0\n")
    assert read_arrivals(path) == [0.5, 1.0, 1.0]


def test_the_smallest_scheduler_and_the_slowest_arrivals_are_allowed():
    # a budget of 1 token fits a 1-token prompt beside no other request (max batch 1)
    Scheduler(max_batch=1, token_budget=1).check(longest_prompt=1)
    # speculation only while a request decodes alone; SmartSpec choosing between 0 and 1 draft
    BatchSpec(off_above=1)
    BatchSpec(smartspec=1)
    # half a request per second: exponential gaps of mean 1 / 0.5 = 2 s, drawn under the seed
    gaps = np.random.default_rng(0).exponential(2.0, 3)
    assert poisson_arrivals(0.5, 3, seed=0) == [gaps[0], gaps[0] + gaps[1], gaps[0] + gaps[1] + gaps[2]]
    # without a seed, the draw of `simlab serve`'s default --seed, 0
    assert poisson_arrivals(0.5, 3) == poisson_arrivals(0.5, 3, seed=0)


def test_with_points_replaces_the_samples_of_the_points_measured_again_and_keeps_the_rest():
    from simlab.record.reprobe import with_points

    def samples(rows):
        return pd.DataFrame(rows, columns=["op", "k", "context_len", "layer", "corun", "repeat", "seconds", "batch"])

    old = samples([("target_forward", 1, 128, -1, False, r, 0.5, 2) for r in range(2)]
                  + [("target_forward", 1, 128, -1, False, 0, 0.7, 4), ("draft_step", 1, 128, -1, False, 0, 0.1, 2),
                     ("target_forward", 1, 256, -1, False, 0, 0.6, 2), ("target_forward", 1, 128, -1, True, 0, 0.9, 2)])
    new = samples([("target_forward", 1, 128, -1, False, r, 0.4, 2) for r in range(3)])
    got = with_points(old, new)
    assert sorted(got.seconds) == [0.1, 0.4, 0.4, 0.4, 0.6, 0.7, 0.9]  # the two 0.5 samples gone, the others kept
    assert list(got.columns) == list(old.columns)

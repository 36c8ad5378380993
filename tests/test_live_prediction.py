"""The simulator's side of a live session (simlab/live/prediction.py), without models: the
policies' context comes from the simulator's one recipe, and the prediction is simulated once
however often the measured table is written."""

from types import SimpleNamespace

import pytest

from simlab.common.metrics import Counts
from simlab.live.prediction import Prediction
from simlab.sim.devices import Topology
from simlab.sim.run import Simulator
from tests.helpers import hand_trace, latency_table

TRACE = ["1101111", "1111011"]


def fake_setup(topology=Topology.ONE_DEVICE, budget=7):
    """The facts of a live run that the prediction reads (a real LiveSetup loads a tokenizer)."""
    cfg = SimpleNamespace(policy="sd", params={"gamma": 2}, seed=0, max_new_tokens=budget)
    return SimpleNamespace(cfg=cfg, ids={0: [1] * 10, 1: [1] * 10}, topology=topology,
                           tree_data=lambda: None)  # sd drafts no trees


def outcome(source, seconds=1.0, forwards=(), ad_seconds=None):
    ad_seconds = 2 * seconds if ad_seconds is None else ad_seconds
    run = SimpleNamespace(counts=Counts(tokens=6, target_calls=3, drafted=6, accepted=3, wall_time_s=seconds,
                                        ad_wall_time_s=ad_seconds), forwards=list(forwards))
    ad = SimpleNamespace(counts=Counts(wall_time_s=2 * seconds))
    return SimpleNamespace(prompt_id=int(source[-1]), source=source, policy=run, ad=ad, ad_after=ad, lossless=True,
                           ad_spread=0.0, speedups=[2.0], speedup_spread=0.0, other_cpu_max=0.02, disturbed=False)


def test_live_policies_get_the_simulators_context():
    trace = hand_trace(TRACE, latency=latency_table(draft=0.25, corun=(2.0, 1.5)))
    live = Prediction(fake_setup(), trace, None).context()
    sim = Simulator(trace, topology="one-device").context()
    assert (live.context_len, live.corun, live.exit_layers, live.n_layers) == \
        (sim.context_len, sim.corun, sim.exit_layers, sim.n_layers)
    assert type(live.latency) is type(sim.latency)
    for k in range(1, 8):
        assert live.latency.target_forward(k, live.context_len, True) == sim.latency.target_forward(k, sim.context_len, True)
    assert live.best_gamma() == sim.best_gamma()


def test_without_a_trace_the_context_is_sized_from_the_prompts_and_budget():
    latency = Simulator(hand_trace(TRACE)).latency.model
    ctx = Prediction(fake_setup(Topology.TWO_DEVICES, budget=40), None, latency).context()
    assert (ctx.context_len, ctx.corun) == (10 + 40 // 2, False)  # median prompt + half the budget
    assert ctx.latency.target_forward(3, 30) == latency.target_forward(3, 30)


def test_the_prediction_is_simulated_once_however_often_the_table_is_written():
    trace = hand_trace(TRACE)
    prediction = Prediction(fake_setup(Topology.TWO_DEVICES), trace, None)
    runs = []
    real_run = prediction.simulator.run
    prediction.simulator.run = lambda *a, **k: runs.append((a, k)) or real_run(*a, **k)
    first = prediction.compare([outcome("hand/0")])
    both = prediction.compare([outcome("hand/0"), outcome("hand/1")])
    # the policy once, and each prompt's timeline (its price per kind of forward) once
    assert [k.get("timeline_prompt") for _, k in runs] == [None, 0, 1]
    assert list(both.table["predicted_target_calls"]) == list(prediction.simulated().per_prompt["target_calls"])
    assert first.table.loc[0, "predicted_target_calls"] == both.table.loc[0, "predicted_target_calls"]


def test_other_processes_cpu_share_is_busy_time_less_our_own():
    """/proc/stat's busy seconds of all processes less this process's, over the machine's capacity."""
    from simlab.common.cpu_load import other_share

    assert other_share(busy=3.0, own=2.0, seconds=2.0, cpus=2) == 0.25  # others: 1 of 4 CPU-seconds
    assert other_share(busy=2.0, own=2.0, seconds=2.0, cpus=2) == 0.0  # we were alone
    assert other_share(busy=1.9, own=2.0, seconds=2.0, cpus=2) == 0.0  # the counters tick apart: clipped
    assert other_share(busy=9.0, own=0.5, seconds=2.0, cpus=2) == 1.0


def test_a_child_process_waited_for_is_our_cpu_time_not_the_others():
    """The llama.cpp tools simlab runs to the end (a re-probe) are ours: their CPU seconds count
    in our own once waited for, so a probe alone reads as alone."""
    import subprocess
    import sys

    from simlab.common.cpu_load import _own_cpu_seconds

    before = _own_cpu_seconds()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert _own_cpu_seconds() - before >= 0.45


def test_a_prompt_is_disturbed_when_others_took_more_than_the_threshold_in_any_decode():
    from simlab.live.decoding import DISTURBED, PromptOutcome

    def prompt(shares, speedups=(1.0,)):
        return PromptOutcome(0, "s", None, None, None, True, list(speedups), list(shares))

    assert not prompt([0.0, DISTURBED, None]).disturbed
    assert prompt([0.0, DISTURBED + 0.01, 0.0]).disturbed
    assert prompt([None, None]).other_cpu_max is None and not prompt([None]).disturbed
    assert prompt([0.0], speedups=[1.0, 1.2, 0.9]).speedup_spread == (1.2 - 0.9) / 1.0


def test_a_prompt_has_drifted_when_its_baselines_ran_further_than_the_threshold_from_their_price():
    """Baselines 1% inside the threshold of the trace's price for them are not flagged; 1% beyond
    it, either way, are."""
    from simlab.live.prediction import DRIFTED

    prediction = Prediction(fake_setup(Topology.TWO_DEVICES), hand_trace(["1101111"]), None)
    priced = prediction.simulated().per_prompt.loc[0, "ad_wall_time_s"]
    rows = prediction.compare([outcome("hand/0", ad_seconds=priced * f) for f in
                               (1 + DRIFTED - 0.01, 1 + DRIFTED + 0.01, 1 - DRIFTED - 0.01)]).table
    assert list(rows["ad_drift"]) == pytest.approx([DRIFTED - 0.01, DRIFTED + 0.01, -DRIFTED - 0.01])
    assert list(rows["drifted"]) == [False, True, True]


def test_each_prompt_is_explained_by_its_forwards_against_their_price():
    """sd γ=2 on "1101111" with 0.1 s draft steps and 1 s forwards of any size (so no catch-up
    costs more than a step), drafter and target on two devices: a round from 1 drafts 2 and
    accepts 1, a round from 3 drafts 2 and accepts both, the last position is a plain target
    step: 4 draft steps (0.4 s) and 3 verifications (3 s) priced."""
    trace = hand_trace(["1101111"], latency=latency_table(draft=0.1))
    prediction = Prediction(fake_setup(Topology.TWO_DEVICES), trace, None)
    live = [SimpleNamespace(what=what, start=start, end=end) for what, start, end in
            [("prefill", 0.0, 5.0), ("draft", 5.0, 5.25), ("draft", 5.25, 5.5), ("verify", 5.5, 6.6),
             ("draft", 6.6, 6.7), ("verify", 6.7, 7.8), ("verify", 7.8, 8.9)]]
    comparison = prediction.compare([outcome("hand/0", forwards=live)])
    draft, verify = comparison.forwards[0]["draft"], comparison.forwards[0]["verify"]
    assert draft == pytest.approx((0.6, 0.4)) and verify == pytest.approx((3.3, 3.0))  # the prefill is not priced
    assert set(comparison.forwards[0]) == {"draft", "verify"}
    # the verifications are 0.3 s over their price, the drafts 0.2 s: the row names the former
    assert comparison.table.loc[0, "forward_gap"] == "verify 3.30 s vs 3.00 s priced (+10%)"


def test_the_sizes_a_probe_times_under_k_auto_are_every_verification_and_the_baselines_step():
    # sd γ=2 over 12 positions, every draft accepted: verifications of 3 tokens from 1, 4 and 7,
    # then 2 from 10 (one position left to draft); the autoregressive baseline steps one token
    setup = fake_setup()
    setup.prompts = [SimpleNamespace(source="hand/0"), SimpleNamespace(source="elsewhere/9")]  # not in the trace
    prediction = Prediction(setup, hand_trace(["1" * 12]), None)
    assert prediction.verified_sizes() == (1, 2, 3)
    # a parallel policy's verifications are sized so too
    setup.cfg.policy, setup.cfg.params = "pearl", {}
    pearl = Prediction(setup, hand_trace(["1" * 12], latency=latency_table(draft=0.25, corun=(2.0, 1.5))), None)
    parallel = {s.args["tokens"] for s in pearl.timeline("hand/0") if s.name.startswith("verify (parallel)")}
    assert parallel and parallel <= set(pearl.verified_sizes())

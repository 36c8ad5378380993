"""The simulator's side of a live session (simlab/live/prediction.py), without models: the
policies' context comes from the simulator's one recipe, and the prediction is simulated once
however often the measured table is written."""

from types import SimpleNamespace

from simlab.live.prediction import Prediction
from simlab.metrics import Counts
from simlab.sim.devices import Topology
from simlab.sim.run import Simulator
from tests.helpers import hand_trace, latency_table

TRACE = ["1101111", "1111011"]


def fake_setup(topology=Topology.ONE_DEVICE, budget=7):
    """The facts of a live run that the prediction reads (a real LiveSetup loads a tokenizer)."""
    cfg = SimpleNamespace(policy="sd", params={"gamma": 2}, seed=0, max_new_tokens=budget)
    return SimpleNamespace(cfg=cfg, ids={0: [1] * 10, 1: [1] * 10}, topology=topology)


def outcome(source, seconds=1.0):
    run = SimpleNamespace(counts=Counts(tokens=6, target_calls=3, drafted=6, accepted=3, wall_time_s=seconds,
                                        ad_wall_time_s=2 * seconds))
    ad = SimpleNamespace(counts=Counts(wall_time_s=2 * seconds))
    return SimpleNamespace(prompt_id=int(source[-1]), source=source, policy=run, ad=ad, ad_after=ad, lossless=True,
                           ad_spread=0.0)


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
    prediction.simulator.run = lambda *a, **k: runs.append(a) or real_run(*a, **k)
    first = prediction.compare([outcome("hand/0")])
    both = prediction.compare([outcome("hand/0"), outcome("hand/1")])
    assert len(runs) == 1
    assert list(both.table["predicted_target_calls"]) == list(prediction.simulated().per_prompt["target_calls"])
    assert first.table.loc[0, "predicted_target_calls"] == both.table.loc[0, "predicted_target_calls"]

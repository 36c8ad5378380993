"""DEL's compiled replay (simlab/sim/del_rounds.py) against the SimPy executor: the same counts,
times and per-position statistics, bit for bit."""

from __future__ import annotations

import pytest

from simlab.common.errors import SimlabError
from simlab.common.locations import TRACES
from simlab.policies import make_policy
from simlab.sim import run as sim_run
from simlab.sim.del_rounds import DelRounds
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace
from tests.helpers import assert_same_run, hand_trace, random_trace

PARAMS = [{}, {"omega": 0.5}, {"d_max": 3}, {"dynamic_exit": False}, {"dynamic_exit": False, "d_max": 6, "omega": 0.8}]


def both(sim: Simulator, params: dict):
    """DEL's numbers from the executor and from the compiled replay, each with a fresh policy (its
    update keeps state from round to round)."""
    policy = make_policy("del", sim.context(), **params)
    protocol = SimExecutor(sim.latency, sim.topology).run(sim.replay, policy)
    rounds = DelRounds(sim.replay, sim.latency)
    assert rounds.replays(policy)
    return protocol, rounds.simulate(make_policy("del", sim.context(), **params))


@pytest.mark.parametrize("topology", ["one-device", "two-devices"])
def test_the_shipped_self_speculative_trace_bit_for_bit(topology):
    sim = Simulator(read_trace(TRACES / "smollm2-selfspec"), topology=topology)
    for params in PARAMS:
        protocol, compiled = both(sim, params)
        assert_same_run(protocol, compiled)
        assert sum(p.counts.target_busy_s > 0 for p in compiled.prompts) == len(compiled.prompts)


def test_random_traces_bit_for_bit_through_every_branch():
    reached = {"overrun": 0, "catch-up": 0, "drop": 0, "cap": 0, "plain step": 0}
    for seed in range(40):
        sim = Simulator(random_trace(seed, layers=(1, 2, 4), rolled=(1,)))
        for params in [*PARAMS, {"d_max": 1}]:
            protocol, compiled = both(sim, params)
            assert_same_run(protocol, compiled)
            counts = [p.counts for p in compiled.prompts]
            reached["overrun"] += sum(c.rollout_overruns for c in counts)
            reached["drop"] += sum(c.drafted - c.verified for c in counts)
            reached["plain step"] += compiled.positions.checked_hist.get(0, 0)
            reached["cap"] += sum(c.verified == c.drafted > 0 for c in counts)
            timeline = sim.run("del", params, timeline_prompt=0, with_cost=False).timeline
            reached["catch-up"] += sum(s.args.get("fed", 1) > 1 for s in timeline)
    assert all(reached.values()), reached


def test_simulate_runs_del_without_the_round_protocol(monkeypatch):
    sim = Simulator(read_trace(TRACES / "smollm2-selfspec"))
    expected = sim.run("del", keep_tokens=True).summary  # tokens asked for: the executor
    monkeypatch.setattr(sim_run, "SimExecutor", None)
    assert sim.run("del").summary == expected


def test_traces_it_cannot_read_are_left_to_the_protocol():
    # a prompt without layer 5's signals: the executor's error, not the compiled replay's
    trace = hand_trace(["1" * 6, "1" * 6], layers={2: ["111011", "110111"], 5: ["111111", "111111"]})
    trace.layers = trace.layers[~((trace.layers["prompt_id"] == 1) & (trace.layers["layer"] == 5))]
    sim = Simulator(trace)
    assert not sim._del_rounds().usable
    with pytest.raises(SimlabError, match="layer"):
        sim.run("del")

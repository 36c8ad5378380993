"""SPIDE's compiled replay (simlab/sim/spide_rounds.py) against the SimPy executor: the same
counts, times and per-position statistics, bit for bit, for SPIDE and both its ablations."""

from __future__ import annotations

import pytest

from simlab.common.locations import TRACES
from simlab.policies import make_policy
from simlab.sim import run as sim_run
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.sim.spide_rounds import SpideRounds
from simlab.trace.io import read_trace
from tests.helpers import assert_same_run, random_trace

RUNS = [("spide", {}), ("spide", {"tau": 0.5, "window": 3}), ("spide", {"tau": 0.95, "prior": 0.8, "window": 1}),
        ("spide-no-dyna-draft", {"gamma": 3}), ("spide-no-dyna-draft", {"gamma": 1, "window": 2}),
        ("spide-no-para-verify", {}), ("spide-no-para-verify", {"tau": 0.3})]


def compare(sim: Simulator, name: str, params: dict):
    """SPIDE's numbers from the executor and from the compiled replay, each with a fresh policy
    (the mapping table learns as it goes)."""
    protocol = SimExecutor(sim.latency, sim.topology).run(sim.replay, make_policy(name, sim.context(), **params))
    rounds = SpideRounds(sim.replay, sim.latency, sim.topology)
    policy = make_policy(name, sim.context(), **params)
    assert rounds.replays(policy)
    compiled = rounds.simulate(policy)
    assert_same_run(protocol, compiled)
    return compiled


@pytest.mark.parametrize("trace", ["qwen-coder-humaneval", "qwen-coder-tree"])
@pytest.mark.parametrize("topology", ["one-device", "two-devices"])
def test_shipped_traces_bit_for_bit(trace, topology):
    sim = Simulator(read_trace(TRACES / trace), topology=topology)
    for name, params in [("spide", {}), ("spide-no-dyna-draft", {}), ("spide-no-para-verify", {})]:
        run = compare(sim, name, params)
        assert sum(p.counts.parallel_rounds for p in run.prompts) > 0 or name == "spide-no-para-verify"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_random_traces_bit_for_bit_through_every_branch(temperature):
    reached = {"overrun": 0, "parallel all accepted": 0, "parallel rejected": 0, "serial": 0, "plain step": 0,
               "window cut": 0}
    for seed in range(30):
        for topology in ("one-device", "two-devices"):
            sim = Simulator(random_trace(seed, temperature=temperature, corun=True), topology=topology)
            for name, params in RUNS:
                run = compare(sim, name, params)
                counts = [p.counts for p in run.prompts]
                reached["overrun"] += sum(c.rollout_overruns for c in counts)
                reached["serial"] += sum(c.target_calls - c.parallel_rounds for c in counts)
                reached["plain step"] += run.positions.checked_hist.get(0, 0)
                window = params.get("window", 0)
                reached["parallel all accepted"] += sum(n for k, n in run.positions.accepted_hist.items() if k > window)
                reached["parallel rejected"] += sum(c.parallel_rounds > 0 and c.accepted < c.verified for c in counts)
                reached["window cut"] += sum(c.drafted < c.parallel_rounds * window for c in counts)
    assert all(reached.values()), reached


def test_a_window_past_the_latency_grid():
    # s new drafts past the contexts the grid tabulated are priced by the latency model itself
    sim = Simulator(random_trace(3))
    assert sim.latency.max_context < sim.replay.max_context + 100
    compare(sim, "spide", {"window": 100})


def test_simulate_runs_spide_without_the_round_protocol(monkeypatch):
    sim = Simulator(read_trace(TRACES / "qwen-coder-humaneval"))
    expected = [sim.run(name, keep_tokens=True).summary for name in ("spide", "spide-no-dyna-draft", "spide-no-para-verify")]
    monkeypatch.setattr(sim_run, "SimExecutor", None)
    assert [sim.run(name).summary for name in ("spide", "spide-no-dyna-draft", "spide-no-para-verify")] == expected

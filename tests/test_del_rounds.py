"""DEL's compiled replay (simlab/sim/del_rounds.py) against the SimPy executor: the same counts,
times and per-position statistics, bit for bit."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pandas as pd
import pytest

from simlab.errors import SimlabError
from simlab.paths import TRACES
from simlab.policies import make_policy
from simlab.sim import run as sim_run
from simlab.sim.del_rounds import DelRounds
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.io import Trace, read_trace
from simlab.trace.schema import Manifest
from tests.helpers import hand_trace, latency_table

PARAMS = [{}, {"omega": 0.5}, {"d_max": 3}, {"dynamic_exit": False}, {"dynamic_exit": False, "d_max": 6, "omega": 0.8}]


def both(sim: Simulator, params: dict):
    """DEL's numbers from the executor and from the compiled replay, and what the replay decided."""
    policy = make_policy("del", sim.context(), **params)
    protocol = SimExecutor(sim.latency, sim.topology).run(sim.replay, policy)
    rounds = DelRounds(sim.replay, sim.latency)
    assert rounds.replays(policy)
    return protocol, rounds.simulate(make_policy("del", sim.context(), **params))


def assert_same(protocol, compiled):
    assert [dataclasses.asdict(p.counts) for p in compiled.prompts] == [dataclasses.asdict(p.counts) for p in protocol.prompts]
    assert [p.prompt_id for p in compiled.prompts] == [p.prompt_id for p in protocol.prompts]
    assert dict(compiled.positions.checked_hist) == {n: c for n, c in protocol.positions.checked_hist.items() if c}
    assert dict(compiled.positions.accepted_hist) == {n: c for n, c in protocol.positions.accepted_hist.items() if c}


@pytest.mark.parametrize("topology", ["one-device", "two-devices"])
def test_the_shipped_self_speculative_trace_bit_for_bit(topology):
    sim = Simulator(read_trace(TRACES / "smollm2-selfspec"), topology=topology)
    for params in PARAMS:
        protocol, compiled = both(sim, params)
        assert_same(protocol, compiled)
        assert sum(p.counts.target_busy_s > 0 for p in compiled.prompts) == len(compiled.prompts)


def random_trace(seed: int) -> Trace:
    """Prompts of random exit-layer matches and confidences (layers 1, 2, 4 of 6); layer 1 with
    its own rollouts, some short (overruns), some prompts with a tail past the path's end (step 0
    at n) and some without, layer 4 with none (teacher-forced signals stand in); some prompts end
    on an end token with a budget past it, some stop at the budget; exit heads and catch-ups priced."""
    rng = random.Random(seed)
    layers, prompts, positions, layer_rows, rollouts = (1, 2, 4), [], [], [], []
    budget = 24
    for pid in range(rng.randint(1, 5)):
        n = rng.choice([1, 2, 3, rng.randint(4, budget)])
        stop = rng.choice(["eos", "length"]) if n < budget else "length"
        target = 100 + np.arange(n)
        positions.append(pd.DataFrame({
            "prompt_id": pid, "pos": np.arange(n), "target_token": target, "draft_token": target, "draft_conf": 0.9,
            "draft_entropy": 0.1, "q_target": 0.9, "p_target": 1.0, "p_draft": 1.0, "accept_prob": 1.0}))
        prompts.append({"prompt_id": pid, "source": f"random/{pid}", "prompt_len": rng.randint(3, 40), "n_tokens": n,
                        "stop": stop, "prompt_text": ""})
        for layer in layers:
            p_match = rng.choice([0.2, 0.6, 0.95, 1.0])
            match = np.array([rng.random() < p_match for _ in range(n)])
            conf = np.array([rng.choice([rng.random(), 0.97, 0.999]) for _ in range(n)])
            layer_rows.append(pd.DataFrame({"prompt_id": pid, "pos": np.arange(n), "layer": layer,
                                            "token": np.where(match, target, 9_000), "draft_conf": conf,
                                            "draft_entropy": 0.5}))
            if layer != 1:
                continue
            for d in [*np.flatnonzero(~match).tolist(), n]:
                first = 0 if d == n else 1
                if d == n and rng.random() < 0.4:
                    continue  # no tail: the last position's signal stands in, an overrun
                steps = np.arange(first, 1 + rng.choice([1, 2, 5, 12]))  # a tail: step 0 and one or more
                rollouts.append(pd.DataFrame({"prompt_id": pid, "pos": d, "step": steps, "token": 7,
                                              "draft_conf": [rng.choice([rng.random(), 0.98]) for _ in steps],
                                              "draft_entropy": 0.5, "layer": 1}))
    manifest = Manifest(kind="synthetic", draft_model="random", target_model="random", dataset="random",
                        hardware="none", temperature=0.0, max_new_tokens=budget, exit_layers=list(layers), n_layers=6,
                        eos_token_ids=[7])
    latency = latency_table(layers={1: 0.011, 2: 0.023, 4: 0.041}, slope=0.0007, verify={k: 0.3 + 0.05 * k for k in range(1, 40)},
                            heads={r: 0.001 * r + 0.0003 for r in range(1, 40)})
    return Trace(manifest=manifest, prompts=pd.DataFrame(prompts), positions=pd.concat(positions, ignore_index=True),
                 rollouts=pd.concat(rollouts, ignore_index=True), latency=latency,
                 layers=pd.concat(layer_rows, ignore_index=True))


def test_random_traces_bit_for_bit_through_every_branch():
    reached = {"overrun": 0, "catch-up": 0, "drop": 0, "cap": 0, "plain step": 0}
    for seed in range(40):
        sim = Simulator(random_trace(seed))
        for params in [*PARAMS, {"d_max": 1}]:
            protocol, compiled = both(sim, params)
            assert_same(protocol, compiled)
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

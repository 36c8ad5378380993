"""The vectorised fixed-γ SD pass (the cost reference) gives the SimPy executor's numbers bit for bit."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simlab.common.locations import TRACES
from simlab.sim.run import REFERENCE_GAMMAS, Simulator
from simlab.sim.vanilla import FixedGammaSD, walls
from simlab.trace.io import read_trace
from simlab.trace.schema import NO_LAYER
from tests.helpers import hand_trace

CONTEXTS = (0, 15, 40, 90)  # prompts are 10 tokens long in hand traces: every round's context differs


def context_latency(draft: list[float], verify: list[list[float]]) -> pd.DataFrame:
    """Samples whose medians vary with the context (interpolated between CONTEXTS) and with k."""
    rows = [("draft_step", 1, c, NO_LAYER, False, 0, s) for c, s in zip(CONTEXTS, draft)]
    rows += [("target_forward", k, c, NO_LAYER, False, 0, s)
             for k, per_ctx in enumerate(verify, start=1) for c, s in zip(CONTEXTS, per_ctx)]
    return pd.DataFrame(rows, columns=["op", "k", "context_len", "layer", "corun", "repeat", "seconds"])


def simpy_sd(sim: Simulator, gamma: int):
    """Vanilla SD replayed round by round by the SimPy executor (keep_tokens bypasses the closed form)."""
    return sim.run("sd", {"gamma": gamma}, with_cost=False, keep_tokens=True)


def same_values(a: dict, b: dict) -> bool:
    """Equal key by key, exactly; NaN equals NaN."""
    def nan(v):
        return isinstance(v, float) and np.isnan(v)
    return a.keys() == b.keys() and all(a[k] == b[k] or (nan(a[k]) and nan(b[k])) for k in a)


def assert_same(sim: Simulator, gamma: int):
    fast = FixedGammaSD(sim.replay, sim.latency).run(gamma)
    slow = simpy_sd(sim, gamma)
    assert fast.target_calls.tolist() == slow.per_prompt["target_calls"].tolist()
    assert fast.wall_time_s.tolist() == slow.per_prompt["wall_time_s"].tolist()
    assert fast.total_wall_time_s == slow.summary.wall_time_s
    assert fast.total_ad_wall_time_s == slow.summary.ad_wall_time_s
    assert fast.speedup == slow.summary.speedup or np.isnan(slow.summary.speedup)
    # `sd` runs without tokens or timeline take the closed form: every figure as the executor's
    closed = sim.run("sd", {"gamma": gamma}, with_cost=False)
    assert same_values(closed.summary.to_dict(), slow.summary.to_dict())
    assert closed.per_prompt.equals(slow.per_prompt)
    assert (closed.positions.checked, closed.positions.accepted) == (slow.positions.checked, slow.positions.accepted)


@st.composite
def traces(draw):
    lengths = draw(st.lists(st.integers(1, 70), min_size=1, max_size=4))
    patterns = ["".join(draw(st.sampled_from("0111"))for _ in range(n)) for n in lengths]
    seconds = st.floats(0.001, 2.0, allow_subnormal=False)
    draft = draw(st.lists(seconds, min_size=len(CONTEXTS), max_size=len(CONTEXTS)))
    verify = draw(st.lists(st.lists(seconds, min_size=len(CONTEXTS), max_size=len(CONTEXTS)), min_size=9, max_size=9))
    stop = draw(st.sampled_from(["length", "eos"]))
    budget = max(lengths) + draw(st.integers(0, 8)) if stop == "eos" else 0
    temperature = draw(st.sampled_from([0.0, 0.0, 0.7]))  # > 0: acceptance drawn per position under the seed
    trace = hand_trace(patterns, latency=context_latency(draft, verify), stop=stop, max_new_tokens=budget,
                       temperature=temperature)
    return trace, draw(st.integers(0, 3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(), st.integers(1, 9))
def test_fixed_gamma_pass_equals_the_simpy_executor_on_random_traces(case, gamma):
    trace, seed = case
    assert_same(Simulator(trace, seed=seed), gamma)


def test_fixed_gamma_pass_counts_rounds_by_hand():
    # γ=2 on 0|111|0|1111 (position 0 is the prefill's): rounds at 1 (accept 2, bonus at 3),
    # 4 (reject), 5 (accept 2), 8 (the end token 9 is the target's: accept 1) -> 4 calls
    trace = hand_trace(["0111011111"])
    assert FixedGammaSD(Simulator(trace).replay, Simulator(trace).latency).run(2).target_calls.tolist() == [4]


@pytest.mark.parametrize("name", ["qwen-coder-humaneval", "smollm2-selfspec", "synthetic-iid"])
def test_reference_equals_vanilla_sd_simulated_at_every_gamma(name):
    sim = Simulator(read_trace(TRACES / name))
    best = None
    for gamma in REFERENCE_GAMMAS:  # the reference as the SimPy executor finds it
        res = simpy_sd(sim, gamma)
        if best is None or res.summary.speedup > best[1].summary.speedup:
            best = (gamma, res)
    ref = sim.reference()
    assert ref.gamma == best[0]
    assert ref.speedup == best[1].summary.speedup
    assert ref.target_calls == best[1].summary.target_calls
    assert ref.per_prompt_calls == dict(zip(best[1].per_prompt["prompt_id"], best[1].per_prompt["target_calls"]))
    for gamma in (1, ref.gamma, 24):
        assert_same(sim, gamma)


def test_reference_on_a_stochastic_trace_follows_the_seed():
    trace = read_trace(TRACES / "synthetic-iid")
    rng = np.random.default_rng(0)
    trace.positions = trace.positions.assign(q_target=rng.random(len(trace.positions)), p_target=1.0)
    trace.manifest = dataclasses.replace(trace.manifest, temperature=1.0)
    calls = []
    for seed in (0, 1):
        sim = Simulator(trace, seed=seed)
        assert_same(sim, 4)
        calls.append(FixedGammaSD(sim.replay, sim.latency).run(4).target_calls.tolist())
    assert calls[0] != calls[1]


def simpy_walls(seconds: list[float], ends: list[int]) -> list[float]:
    """Prompts back to back on one SimPy clock, each priced as the executor prices serial rounds."""
    import simpy

    env, walls = simpy.Environment(), []

    def prompts():
        begin = 0
        for end in ends:
            t0 = clock = env.now
            for s in seconds[begin:end]:
                clock += s
            if clock > env.now:
                yield env.timeout(clock - env.now)
            walls.append(env.now - t0)
            begin = end

    env.process(prompts())
    env.run()
    return walls


def test_prompt_walls_follow_simpy_where_its_timeout_does_not_land_on_the_clock():
    # the first prompt ends at t0 = 4.5 ulp(1); the second one's clock ends at c, but SimPy's
    # timeout lands at t0 + (c - t0) = c - ulp(c), and the third prompt starts from there
    # (its wall time shows where: half an ulp after c - ulp(c) rounds to 0, after c to 1 ulp)
    t0, a, b = 9.992007221626409e-16, 1.0000000000000053, 2.886579864025407e-15
    seconds, ends = [0.0, t0, a, b, 2.0**-53], [2, 4, 5]
    assert (t0 + a) + b != t0 + (((t0 + a) + b) - t0)
    assert walls(np.array(seconds), np.array(ends)).tolist() == simpy_walls(seconds, ends)


def test_prompt_walls_follow_simpy_when_two_timeouts_miss_the_clock():
    # prompt 2 runs 0.001 + 0.032 s from 0.004 s: its clock ends at 0.037, SimPy's timeout at
    # 0.004 + (0.037 - 0.004) = 0.037000000000000005; prompt 3 runs 0.257 + 0.061 s from there
    # and misses again (0.35500000000000004 vs 0.3550000000000001): the clock restarts twice
    seconds, ends = [0.004, 0.001, 0.032, 0.257, 0.061], [1, 3, 5]
    assert 0.004 + ((0.004 + 0.001 + 0.032) - 0.004) == 0.037000000000000005
    t0 = 0.037000000000000005
    assert t0 + (((t0 + 0.257) + 0.061) - t0) == 0.3550000000000001 != (t0 + 0.257) + 0.061
    assert walls(np.array(seconds), np.array(ends)).tolist() == simpy_walls(seconds, ends)

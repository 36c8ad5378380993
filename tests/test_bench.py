"""`simlab bench`: the one benchmark entry point, for the simulator (with its goals) and for sweeps."""

import json

import pytest

from simlab.sim.bench import (
    LOOKUP_TRACE,
    MIN_CPU_SECONDS,
    POLICY_GOAL,
    SD_GOAL,
    SIMULATE_GOAL,
    BenchResult,
    bench_trace,
    run_bench,
    time_cold,
    time_policy,
)
from simlab.sim.run import Simulator
from tests.test_cli import simlab


def test_bench_trace_has_about_the_tokens_asked_in_prompts_of_typical_length():
    trace = bench_trace(2_000)
    assert len(trace.prompts) == 8
    assert trace.prompts["n_tokens"].sum() == 2_000


def test_a_figure_passes_exactly_when_it_reaches_its_goal():
    assert BenchResult("x", 1_000, 2.0, goal=500, trace="t").passed
    assert not BenchResult("x", 999, 2.0, goal=500, trace="t").passed


def test_policy_timing_counts_every_simulated_token():
    sim = Simulator(bench_trace(1_000))
    r = time_policy(sim, "sd", {"gamma": 3}, repeats=1)
    per_run = sim.run("sd", {"gamma": 3}, with_cost=False).summary.tokens
    # one run takes far less than MIN_CPU_SECONDS: the timing repeats it and counts every run
    assert r.tokens % per_run == 0 and r.tokens > per_run
    assert r.seconds >= MIN_CPU_SECONDS
    assert r.what == "sd gamma=3"


def test_bench_reports_whole_process_simulate_each_policy_and_fixed_gamma_sd_with_their_goals():
    seen = []
    results = run_bench(simulate_tokens=500, policy_tokens=500, policies=[("pearl", {}), ("layerskip", {})],
                        repeats=1, progress=seen.append)
    assert seen == results
    assert [r.goal for r in results] == [SIMULATE_GOAL, POLICY_GOAL, POLICY_GOAL, SD_GOAL]
    assert results[0].tokens == 500 - 2 and results[0].cpu_seconds > 0  # two prompts; the prefill's token is not counted
    assert results[2].trace == "smollm2-selfspec"  # early-exit policies need a trace with layer signals
    assert results[3].what.startswith("fixed-γ SD")


def test_a_lookup_policy_is_also_timed_cold_one_run_in_a_new_process_not_judged():
    from simlab.common.locations import TRACES
    from simlab.trace.io import read_trace

    r = time_cold("pld", {"num_tokens": 4}, LOOKUP_TRACE)
    one_run = Simulator(read_trace(TRACES / LOOKUP_TRACE)).run("pld", {"num_tokens": 4}, with_cost=False).summary.tokens
    assert r.tokens == one_run and r.seconds > 0
    assert not r.judged and r.what == "pld num_tokens=4, cold (one run, new process)"


@pytest.mark.parametrize("args", [["--json"], []])
def test_bench_sweep_times_a_grid_per_worker_count(args):
    proc = simlab("bench", "--sweep", "--grid", "sd:gamma=1..3", "--workers", "1", *args)
    if args:
        out = json.loads(proc.stdout)
        assert [(r["workers"], r["configurations"]) for r in out["results"]] == [(1, 3)]
    else:
        assert "3 configurations in" in proc.stdout

"""The T > 0 prediction interval (simlab/sim/spread.py): per-prompt resampling over recorded
continuations and replay seeds."""

import warnings

import numpy as np
import pytest

from simlab.common.errors import SimlabError
from simlab.sim.spread import combine, run_metrics, sampling_spread
from tests.helpers import hand_trace

# counts per outcome: tokens, target_calls, accepted, num_drafts, wall_time_s, ad_wall_time_s


def test_one_outcome_per_prompt_gives_a_point():
    outcomes = np.array([[[10, 5, 5, 5, 2.0, 4.0]], [[10, 5, 5, 5, 2.0, 4.0]]])
    iv = combine(outcomes, 100, 0.95, np.random.default_rng(0))
    assert iv["speedup"].low == iv["speedup"].high == iv["speedup"].mean == 2.0
    assert iv["target_calls"].mean == 10 and iv["mean_acceptance_length"].mean == 2.0
    assert iv["tokens_per_s"].mean == 5.0  # 10 + 10 tokens in 2.0 + 2.0 s


def test_prompts_are_resampled_independently():
    """Two prompts, each with two equally likely outcomes of 4 or 6 target calls: a run's total
    is 8, 10 or 12 with probabilities 1/4, 1/2, 1/4; resampling whole runs from two columns
    could only give 8 and 12."""
    a = [10, 4, 0, 1, 1.0, 1.0]
    b = [10, 6, 0, 1, 1.0, 1.0]
    outcomes = np.array([[a, b], [a, b]], dtype=float)
    iv = combine(outcomes, 20000, 0.95, np.random.default_rng(1))
    assert iv["target_calls"].mean == pytest.approx(10, abs=0.05)
    assert (iv["target_calls"].low, iv["target_calls"].high) == (8, 12)
    middle = combine(outcomes, 20000, 0.4, np.random.default_rng(1))["target_calls"]  # 30th-70th percentile
    assert (middle.low, middle.high) == (10, 10)


class Picks:
    """A generator whose draws pick the outcomes given."""

    def __init__(self, picks):
        self.picks = np.array(picks)

    def integers(self, low, high, size):
        return self.picks.reshape(size)


def test_one_continuation_gives_the_draws_central_range_interpolated():
    # one prompt whose outcomes took 4 and 6 target calls, two draws picking each once: the 95%
    # range is the 2.5th to the 97.5th percentile of [4, 6], 4 + 0.025 · 2 = 4.05 to 4 + 0.975 · 2 = 5.95
    outcomes = np.array([[[10, 4, 0, 1, 1.0, 1.0], [10, 6, 0, 1, 1.0, 1.0]]])
    iv = combine(outcomes, 2, 0.95, Picks([[0], [1]]))["target_calls"]
    assert iv.mean == 5.0
    assert (iv.low, iv.high) == (pytest.approx(4.05), pytest.approx(5.95))


def test_with_several_continuations_the_interval_is_the_textbook_predictive_interval():
    """One prompt whose four recorded continuations took 4, 5, 6 and 7 target calls (one replay
    seed each): a new run's 95% predictive interval is mean ± t(0.975; 3 dof) · s · √(1 + 1/4),
    s the sample standard deviation of the four: 5.5 ± 3.182 · 1.291 · 1.118 = 5.5 ± 4.59."""
    import statistics

    from scipy import stats

    calls = [4, 5, 6, 7]
    outcomes = np.array([[[10, c, 0, 1, 1.0, 1.0] for c in calls]], dtype=float)
    iv = combine(outcomes, 40000, 0.95, np.random.default_rng(2), continuations=4)["target_calls"]
    half = stats.t.ppf(0.975, 3) * statistics.stdev(calls) * (1 + 1 / 4) ** 0.5
    assert half == pytest.approx(4.593, abs=1e-3)
    assert iv.mean == pytest.approx(5.5, abs=0.02)
    assert (iv.low, iv.high) == (pytest.approx(5.5 - half, abs=0.05), pytest.approx(5.5 + half, abs=0.05))
    seeds_only = combine(outcomes, 40000, 0.95, np.random.default_rng(2))["target_calls"]  # the draws' range
    assert (seeds_only.low, seeds_only.high) == (4, 7)


def test_a_greedy_trace_has_no_spread():
    with pytest.raises(SimlabError, match="greedy"):
        sampling_spread([hand_trace(["1101"])], "sd")


def test_recorded_continuations_widen_the_seed_only_interval():
    """On the SmolLM2 T = 0.7 traces recorded with record --seed 0-3 (results/live/), the
    interval over four continuations is wider than the replay seeds' of one."""
    from simlab.common.locations import ROOT
    from simlab.trace.io import read_trace

    traces = [read_trace(ROOT / "results/live/smollm2-t07/traces" / f"seed{s}") for s in range(4)]
    one = sampling_spread(traces[:1], "sd", {"gamma": 3}, seeds=10, draws=2000).intervals["mean_acceptance_length"]
    four = sampling_spread(traces, "sd", {"gamma": 3}, seeds=10, draws=2000).intervals["mean_acceptance_length"]
    assert four.high - four.low > 1.2 * (one.high - one.low)
    assert one.low < one.mean < one.high


def test_traces_must_hold_the_same_prompts():
    from simlab.common.locations import ROOT
    from simlab.trace.io import read_trace

    first = read_trace(ROOT / "results/live/smollm2-t07/traces/seed0")
    fewer = first.select_prompts([int(first.prompts["prompt_id"].min())])
    with pytest.raises(SimlabError, match="lacks"):
        sampling_spread([first, fewer], "sd", seeds=1)


def test_simulate_prints_the_interval_at_temperature():
    import json
    import subprocess

    from simlab.common.locations import ROOT, TRACES
    from tests.helpers import simlab_cmd

    traces = ROOT / "results/live/smollm2-t07/traces"
    proc = subprocess.run(simlab_cmd("simulate", "--trace", traces / "seed0", "--spread-trace", traces / "seed1",
                                     "--spread-seeds", 3, "--gamma", 3, "--json"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    spread = json.loads(proc.stdout)["spread"]
    assert (spread["continuations"], spread["seeds"]) == (2, 3)
    bad = subprocess.run(simlab_cmd("simulate", "--trace", TRACES / "synthetic-iid", "--spread-trace",
                                    traces / "seed1"), capture_output=True, text=True)
    assert bad.returncode == 2 and "temperature > 0" in bad.stderr


def test_traces_must_be_recorded_alike():
    from simlab.common.locations import ROOT
    from simlab.trace.io import read_trace

    first = read_trace(ROOT / "results/live/smollm2-t07/traces/seed0")
    other = read_trace(ROOT / "results/live/smollm2-t07/traces/seed0")
    other.manifest.temperature = 1.0  # recorded at 0.7
    with pytest.raises(SimlabError, match=r"other models or settings than .* \(draft_model, target_model, "
                                          r"temperature, max_new_tokens\)"):
        sampling_spread([first, other], "sd", seeds=1)


def test_a_run_that_drafted_nothing_has_no_acceptance_length_and_says_so_quietly():
    # 10 tokens in 10 target calls, no drafts: mean acceptance length 1 + 0/0 is NaN, with no
    # floating-point warning; speedup 2.0 / 2.0 = 1
    totals = {"tokens": np.array([10.0]), "target_calls": np.array([10.0]), "accepted": np.array([0.0]),
              "num_drafts": np.array([0.0]), "wall_time_s": np.array([2.0]), "ad_wall_time_s": np.array([2.0])}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = run_metrics(totals)
    assert np.isnan(metrics["mean_acceptance_length"][0]) and metrics["speedup"][0] == 1.0


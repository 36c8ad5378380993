"""Serving sweeps (`simlab sweep --rate`): a grid of policies served at every rate on the sweep's
executors and store, each row the figures `simlab serve --rate` gives for that configuration."""

import math

import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.common.table_file import read_frame
from simlab.plots.serving import rates_figure
from simlab.serve.batch_policy import BatchSpec
from simlab.serve.metrics import Slo
from simlab.serve.rates import rate_sweep
from simlab.serve.run import ServeConfig
from simlab.serve.scheduler import Scheduler
from simlab.sim.run import Simulator
from simlab.sweep import combine, run_sweep
from simlab.sweep.serving import ServeLoad
from tests.helpers import hand_trace, latency_table
from tests.test_cli import one_line_error, simlab
from tests.test_sweep import ray_matches_serial

RATES = (0.05, 0.5, 5.0)
REQUESTS = 9
GRID = ["sd:gamma=2,3", "hf-heuristic"]
TIMING = ["sim_seconds", "cpu_seconds"]


@pytest.fixture(scope="module")
def trace():
    patterns = ["1" + "1101" * 5, "1" + "10" * 12, "1" + "1" * 30]
    return hand_trace(patterns, latency=latency_table(draft=0.1, verify={k: 1 + 0.1 * k for k in range(1, 200)}))


def load(**kwargs):
    options = {"scheduler": Scheduler(max_batch=2), "slo": Slo(tpot_s=0.5), **kwargs}
    return ServeLoad(RATES, REQUESTS, **options)


def served(trace, tmp_path=None, grid=GRID, **options):
    cache = tmp_path / "cache" if tmp_path else False
    return run_sweep(trace, combine(grid), cache=cache, progress=False, **{"workers": 1, "load": load(), **options})


def test_every_configuration_at_every_rate_then_ad_once_per_rate(trace):
    table = served(trace).table
    labels = ["sd(gamma=2)", "sd(gamma=3)", "hf-heuristic", "ad (no SD)"]
    assert list(table["label"]) == labels * len(RATES)
    assert list(table["rate_per_s"]) == [r for r in RATES for _ in labels]
    assert list(table["speculative"]) == [True, True, True, False] * len(RATES)
    assert table["gamma"].dtype == "Int64"


@pytest.mark.parametrize("seed", [0, 3])
def test_each_row_is_what_serve_gives_that_configuration_at_that_rate(trace, seed):
    # simlab serve --rate serves one policy and ad at each rate; the sweep's rows are the same
    # figures, on the arrivals its seed draws
    table = served(trace, seed=seed).table
    sim = Simulator(trace, seed=seed)
    for label, policy, params in [("sd(gamma=3)", "sd", {"gamma": 3}), ("hf-heuristic", "hf-heuristic", {})]:
        config = ServeConfig(policy, params, Scheduler(max_batch=2), BatchSpec(), Slo(tpot_s=0.5))
        direct = rate_sweep(sim, RATES, REQUESTS, seed, config, progress=False)
        for spec, base in ((True, False), (False, True)):
            want = direct[direct["speculative"] == spec].reset_index(drop=True)
            got = table[table["label"] == (label if spec else "ad (no SD)")].reset_index(drop=True)
            columns = [c for c in want.columns if c != "label"]
            pd.testing.assert_frame_equal(got[columns], want[columns], check_dtype=False)


def test_speedups_are_over_ad_at_the_same_rate_and_absent_without_the_baseline(trace):
    table = served(trace).table
    for rate, rows in table.groupby("rate_per_s"):
        base = rows[~rows["speculative"]].iloc[0]
        for _, row in rows[rows["speculative"]].iterrows():
            assert row["e2e_speedup"] == base["e2e_mean_s"] / row["e2e_mean_s"]
            assert row["tpot_speedup"] == base["tpot_mean_s"] / row["tpot_mean_s"]
        assert math.isnan(base["e2e_speedup"])
    alone = served(trace, load=load(baseline=False)).table
    assert list(alone["speculative"]) == [True] * 3 * len(RATES)
    assert "e2e_speedup" not in alone.columns


def test_a_batch_level_policy_is_named_on_the_speculative_rows_only(trace):
    table = served(trace, grid=["sd:gamma=3"], load=load(batch=BatchSpec(off_above=1))).table
    assert list(table["label"].unique()) == ["sd(gamma=3) + off-above", "ad (no SD)"]
    assert table.loc[~table["speculative"], "batch_policy"].eq("none").all()


def test_a_process_pool_gives_the_same_table(trace):
    serial = served(trace).table
    pooled = served(trace, workers=2)
    assert pooled.workers == 2
    cols = [c for c in serial.columns if c not in TIMING]
    pd.testing.assert_frame_equal(pooled.table[cols], serial[cols])


@pytest.mark.slow
def test_ray_gives_the_same_table(trace):
    ray_matches_serial(lambda **options: served(trace, **options))


def test_the_cache_key_covers_rate_and_serving_settings(trace, tmp_path):
    first = served(trace, tmp_path)
    assert (first.cached, first.computed) == (0, 12)
    assert served(trace, tmp_path).computed == 0
    more = run_sweep(trace, combine(GRID), cache=tmp_path / "cache", progress=False, workers=1,
                     load=ServeLoad(RATES + (50.0,), REQUESTS, Scheduler(max_batch=2), slo=Slo(tpot_s=0.5)))
    assert (more.cached, more.computed) == (12, 4)
    for changed in (load(scheduler=Scheduler(max_batch=3)), load(slo=Slo(tpot_s=0.4)),
                    ServeLoad(RATES, REQUESTS + 1, Scheduler(max_batch=2), slo=Slo(tpot_s=0.5)),
                    load(batch=BatchSpec(smartspec=3))):
        assert served(trace, tmp_path, load=changed).computed == 12, changed


def test_parallel_policies_are_refused_before_any_work(trace, tmp_path):
    with pytest.raises(SimlabError, match="serve does not batch parallel policies"):
        served(trace, tmp_path, grid=["sd:gamma=2", "pearl"])
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("rates, requests, fragment", [
    ((), 5, "--rate must be finite numbers > 0"),
    ((0.1, -1.0), 5, "--rate must be finite numbers > 0"),
    ((0.2, 0.1), 5, "--rate lists increasing rates"),
    ((0.1,), 0, "--requests must be >= 1"),
])
def test_a_bad_load_fails_when_it_is_made(rates, requests, fragment):
    with pytest.raises(SimlabError, match=fragment):
        ServeLoad(rates, requests)


def test_the_rates_plot_draws_every_series_of_a_serving_sweep(trace):
    table = served(trace).table
    fig = rates_figure([table])
    good = fig.axes[0]
    assert [line.get_label() for line in good.get_lines()] == ["sd(gamma=2)", "sd(gamma=3)", "hf-heuristic",
                                                               "ad (no SD)"]


# -- the command -----------------------------------------------------------------------------------

def test_sweep_rate_prints_the_rate_table_and_writes_every_row(tmp_path):
    out = tmp_path / "rates.csv"
    proc = simlab("sweep", "--rate", "0.02,0.2", "--requests", "12", "--policy", "sd:gamma=2,4", "--max-batch", "4",
                  "--slo-tpot", "1", "--out", out, "--cache", tmp_path / "cache", "--workers", "2")
    for text in ("sd(gamma=2)", "sd(gamma=4)", "ad (no SD)", "12 Poisson requests per rate", "max batch 4",
                 "6 configurations: 0 from the cache, 6 served"):
        assert text in proc.stdout, text
    table = read_frame(out)
    assert len(table) == 6 and set(table["rate_per_s"]) == {0.02, 0.2}
    assert (table["max_batch"] == 4).all() and (table["slo_tpot_s"] == 1).all()
    png = tmp_path / "rates.png"
    simlab("plot", "rates", out, "-o", png)
    assert png.stat().st_size > 0


@pytest.mark.parametrize("args, fragment", [
    (["--rate", "0"], "--rate must be finite numbers > 0"),
    (["--rate", "0.1", "--requests", "0"], "--requests must be >= 1"),
    (["--rate", "0.1", "--max-batch", "0"], "--max-batch must be >= 1"),
    (["--rate", "0.1", "--slo-ttft", "-1"], "--slo-ttft must be a number of seconds > 0"),
    (["--rate", "0.1", "--smartspec", "3", "--sd-off-above", "4"], "choose one batch-level policy"),
    (["--rate", "0.1", "--topology", "one-device"], "a serving sweep (--rate) runs serve's engine"),
    (["--rate", "0.1", "--policy", "spide"], "serve does not batch parallel policies (spide)"),
    (["--max-batch", "4"], "--max-batch sets how a serving sweep serves; add --rate"),
    (["--no-baseline"], "--no-baseline sets how a serving sweep serves"),
])
def test_bad_serving_sweeps_are_one_line_before_any_work(tmp_path, args, fragment):
    policy = [] if "--policy" in args else ["--policy", "sd:gamma=2"]
    proc = simlab("sweep", *policy, "--cache", tmp_path / "cache", *args, check=False)
    one_line_error(proc, fragment)
    assert not (tmp_path / "cache").exists()

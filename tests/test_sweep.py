"""Sweeps: every configuration simulated once, the same as `simulate`, cached and resumable."""

import json

import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.common.metrics import SUMMARY_KEYS
from simlab.sim.run import Simulator
from simlab.sweep import combine, run_sweep
from simlab.sweep.frontier import pareto_mask
from simlab.sweep.result_table import TIMING_COLUMNS, param_columns
from simlab.sweep.runner import labels
from simlab.trace.synth import SynthSpec, synth_trace

GRID = ["sd:gamma=1..4", "oracle:max_draft=2,4", "ad"]


@pytest.fixture(scope="module")
def trace():
    return synth_trace(SynthSpec(alpha=0.8, c=0.1, prompts=3, tokens=120, seed=1), command="test")


def sweep(trace, specs, tmp_path, **options):
    return run_sweep(trace, combine(specs), cache=tmp_path / "cache", progress=False, **options)


def test_every_configuration_once_in_grid_order(trace, tmp_path):
    table = sweep(trace, GRID, tmp_path, workers=1).table
    assert list(table["label"]) == ["sd(gamma=1)", "sd(gamma=2)", "sd(gamma=3)", "sd(gamma=4)",
                                    "oracle(max_draft=2)", "oracle(max_draft=4)", "ad"]
    assert param_columns(table) == ["gamma", "max_draft"]
    assert table["gamma"].dtype == "Int64" and table["gamma"].isna().sum() == 3
    assert set(SUMMARY_KEYS) <= set(table.columns)


def test_rows_equal_a_direct_simulation(trace, tmp_path):
    table = sweep(trace, GRID, tmp_path, workers=1).table.set_index("label")
    sim = Simulator(trace)
    for label, policy, params in [("sd(gamma=3)", "sd", {"gamma": 3}), ("oracle(max_draft=4)", "oracle", {"max_draft": 4})]:
        summary = sim.run(policy, params).summary
        for key in ("speedup", "cost", "mat", "target_calls", "wall_time_s"):
            assert table.loc[label, key] == getattr(summary, key), (label, key)
    assert (table["reference_gamma"] == sim.reference().gamma).all()
    assert (table["reference_speedup"] == sim.reference().speedup).all()


def test_pareto_column_marks_the_front(trace, tmp_path):
    table = sweep(trace, GRID, tmp_path, workers=1).table
    assert table["pareto"].tolist() == pareto_mask(table["speedup"], table["cost"]).tolist()
    assert table["pareto"].any() and not table.set_index("label").loc["ad", "pareto"]


def test_defaults_are_filled_in_and_duplicates_dropped(trace, tmp_path):
    table = sweep(trace, ["oracle", "oracle:max_draft=16", "sd:gamma=5,5"], tmp_path, workers=1).table
    assert list(table["label"]) == ["oracle", "sd"]


def test_labels_name_the_swept_and_the_changed_parameters_only():
    rows = [{"policy": "spide", "params": {"tau": tau, "window": 7, "prior": 1.0}} for tau in (0.6, 0.7)]
    rows += [{"policy": "dv", "params": {"threshold": 0.8, "max_draft": 4, "target_rate": 0.9, "epsilon": 0.01,
                                         "beta1": 0.5, "beta2": 0.9}}]
    # spide's window is derived (default None), prior at its default; dv's max_draft is not its default (8)
    assert labels(rows) == ["spide(tau=0.6)", "spide(tau=0.7)", "dv(max_draft=4)"]


@pytest.mark.parametrize("spec, fragment", [
    ("nope:x=1", "unknown policy 'nope'"),
    ("sd:window=3", "policy 'sd' has no parameter(s) ['window']"),
    ("sd:gamma=0..2", "sd:gamma=0: gamma must be an integer >= 1"),
])
def test_bad_configurations_fail_before_any_work(trace, tmp_path, spec, fragment):
    with pytest.raises(SimlabError) as err:
        sweep(trace, ["sd:gamma=2", spec], tmp_path)
    assert fragment in str(err.value)
    assert not (tmp_path / "cache").exists()


def test_a_rerun_reads_the_cache(trace, tmp_path):
    first = sweep(trace, GRID, tmp_path, workers=1)
    assert (first.cached, first.computed) == (0, 7)
    again = sweep(trace, GRID + ["sd:gamma=6"], tmp_path, workers=1)
    assert (again.cached, again.computed) == (7, 1)
    cols = [c for c in first.table.columns if c not in TIMING_COLUMNS]
    pd.testing.assert_frame_equal(again.table[cols].iloc[:7], first.table[cols])


def test_the_cache_key_covers_seed_topology_and_trace(trace, tmp_path):
    sweep(trace, ["sd:gamma=2"], tmp_path, workers=1)
    assert sweep(trace, ["sd:gamma=2"], tmp_path, workers=1, seed=1).computed == 1
    assert sweep(trace, ["sd:gamma=2"], tmp_path, workers=1, topology="one-device").computed == 1
    other = synth_trace(SynthSpec(alpha=0.6, c=0.1, prompts=3, tokens=120, seed=1), command="test")
    assert sweep(other, ["sd:gamma=2"], tmp_path, workers=1).computed == 1
    assert sweep(trace, ["sd:gamma=2"], tmp_path, workers=1).computed == 0


def test_a_torn_line_is_skipped_and_the_next_row_starts_a_new_line(trace, tmp_path):
    res = sweep(trace, ["sd:gamma=1,2"], tmp_path, workers=1)
    store = res.store
    lines = store.read_text().splitlines()
    store.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # killed while writing row 2
    again = sweep(trace, ["sd:gamma=1,2"], tmp_path, workers=1)
    assert (again.cached, again.computed) == (1, 1)
    rows = [json.loads(line) for line in store.read_text().splitlines()[::2]]  # skip the torn one
    assert [r["params"] for r in rows] == [{"gamma": 1}, {"gamma": 2}]


def test_no_cache_writes_nothing(trace, tmp_path):
    res = run_sweep(trace, combine(["sd:gamma=2"]), cache=False, workers=1, progress=False)
    assert res.store is None and res.computed == 1


def test_a_process_pool_gives_the_same_table(trace, tmp_path):
    serial = run_sweep(trace, combine(GRID), cache=False, workers=1, progress=False).table
    pooled = run_sweep(trace, combine(GRID), cache=False, workers=2, progress=False)
    assert pooled.workers == 2
    cols = [c for c in serial.columns if c not in TIMING_COLUMNS]
    pd.testing.assert_frame_equal(pooled.table[cols], serial[cols])


def ray_matches_serial(sweep) -> None:
    """``sweep(**options)`` on two Ray workers gives the one-worker table (timings aside)."""
    pytest.importorskip("ray")
    serial = sweep(workers=1).table
    try:
        on_ray = sweep(workers=2, executor="ray")
    except SimlabError as exc:  # Ray gives its local node a fixed 30 s to start: too little on a busy 2-core box
        if "timed out during startup" in str(exc):
            pytest.skip(f"the local Ray instance did not start: {exc}")
        raise
    assert on_ray.executor == "ray"
    cols = [c for c in serial.columns if c not in TIMING_COLUMNS]
    pd.testing.assert_frame_equal(on_ray.table[cols], serial[cols])


@pytest.mark.slow
def test_ray_gives_the_same_table(trace):
    ray_matches_serial(lambda **options: run_sweep(trace, combine(GRID), cache=False, progress=False, **options))


def test_unknown_executor_and_bad_workers(trace):
    with pytest.raises(SimlabError, match="unknown executor 'dask'"):
        run_sweep(trace, combine(["ad"]), executor="dask", cache=False)
    with pytest.raises(SimlabError, match="--workers must be at least 1"):
        run_sweep(trace, combine(["ad"]), workers=-1, cache=False)


def test_policies_that_describe_more_than_their_parameters_sweep(trace, tmp_path):
    # specdecpp, ags and pacer also name their acceptance predictor, which is not a parameter
    table = sweep(trace, ["specdecpp:threshold=0.3,0.5", "ags", "pacer"], tmp_path, workers=1).table
    assert list(table["label"]) == ["specdecpp(threshold=0.3)", "specdecpp(threshold=0.5)", "ags", "pacer"]
    assert "predictor" not in table.columns and table["speedup"].notna().all()

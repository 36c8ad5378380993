"""Latency fits recover known models from noisy samples and predict samples they did not see."""

import numpy as np
import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.latency.fitted import FittedLatency, fit_latency, held_out, predict_samples
from simlab.latency.model import TableLatency, load_profile, save_profile
from simlab.latency.surface import Surface, fit_best, fit_surface
from simlab.sim.run import Simulator
from simlab.trace.schema import NO_LAYER
from tests.helpers import hand_trace, latency_table, noisy_latency

KS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17)  # a sparse k grid (the recorder probed these before it took every k to 17)
CONTEXTS = (128, 512, 1024, 2048, 4096)  # a range wide enough to pin the context slopes
REPEATS = 5
# CPU verify costs (ms) of the Qwen pair on 2 cores for k = 1..4, from an early probe, with its k = 6, 8, 16 figures
CPU_VERIFY_MS = {1: 317, 2: 660, 3: 935, 4: 575, 6: 687, 8: 638, 16: 837}


def samples(fn, ks=KS, contexts=CONTEXTS, noise=0.02, seed=0, **kw):
    return noisy_latency(fn, ks, contexts, REPEATS, noise, seed, **kw)


def with_draft(df, draft=lambda k, c: 0.01 + 2e-6 * c, **kw):
    return pd.concat([df, samples(draft, ks=(1,), op="draft_step", **kw)], ignore_index=True)


def columns(df):
    return df["k"], df["context_len"], df["seconds"]


@pytest.mark.parametrize("seed", range(5))
def test_affine_fit_recovers_parameters_within_5_percent(seed):
    a, b, c, d = 0.02, 0.003, 1e-5, 2e-6
    df = samples(lambda k, x: a + b * k + c * x + d * k * x, seed=seed)
    s = fit_surface(*columns(df), "affine")
    got = np.array([*s.base, s.ctx_slope, s.ctx_x_slope])
    np.testing.assert_allclose(got, [a, b, c, d], rtol=0.05)


def test_hinge_fit_recovers_knot_and_slopes_within_5_percent():
    a, b, knot, c = 0.03, 0.004, 6.0, 1e-5
    df = samples(lambda k, x: a + b * max(0.0, k - knot) + c * x, seed=4)
    s = fit_surface(*columns(df), "hinge")
    np.testing.assert_allclose([*s.base, s.ctx_slope], [a, b, knot, c], rtol=0.05)


def test_per_k_fit_recovers_non_monotone_cpu_costs_within_5_percent():
    ks = tuple(CPU_VERIFY_MS)
    df = samples(lambda k, x: CPU_VERIFY_MS[k] / 1e3 + 1e-4 * x, ks=ks, seed=5)
    s = fit_surface(*columns(df), "per-x")
    np.testing.assert_allclose(s.base, [CPU_VERIFY_MS[k] / 1e3 for k in ks], rtol=0.05)
    assert s.ctx_slope == pytest.approx(1e-4, rel=0.05)
    # between measured k: linear; past the last: the last slope, never downwards
    assert s(5, 128) == pytest.approx((s(4, 128) + s(6, 128)) / 2)
    assert s(30, 128) >= s(16, 128)


def test_bic_picks_the_simplest_form_the_data_support():
    affine = samples(lambda k, x: 0.02 + 0.003 * k + 1e-5 * x, seed=6)
    assert fit_best(*columns(affine))[0].form == "affine"
    hinge = samples(lambda k, x: 0.03 + 0.004 * max(0, k - 6) + 1e-5 * x, seed=7)
    assert fit_best(*columns(hinge))[0].form == "hinge"
    cpu = samples(lambda k, x: CPU_VERIFY_MS[k] / 1e3, ks=tuple(CPU_VERIFY_MS), seed=8)
    assert fit_best(*columns(cpu))[0].form == "per-x"


def test_outliers_do_not_drag_the_fit():
    df = samples(lambda k, x: 0.05 + 0.002 * k, contexts=(256,), seed=9)
    df.loc[::7, "seconds"] *= 3  # another process woke up
    s = fit_surface(*columns(df), "affine")
    assert s.base == pytest.approx((0.05, 0.002), rel=0.05)


def test_context_slopes_are_never_negative():
    df = samples(lambda k, x: 0.05 + 0.002 * k - 1e-6 * x, seed=10)
    s = fit_surface(*columns(df), "affine")
    assert s.ctx_slope >= 0 and s.ctx_x_slope >= 0
    # below the smallest measured context the smallest context's figure holds
    assert s(3, 0) == s(3, min(CONTEXTS))


def test_every_series_gets_its_own_fit_and_corun_falls_back_to_solo():
    solo = with_draft(samples(lambda k, x: 0.1 + 0.01 * k, contexts=(128, 256)), contexts=(128, 256))
    corun = samples(lambda k, x: 0.2 + 0.02 * k, contexts=(128, 256), corun=True, seed=1)
    exits = samples(lambda layer, x: 0.002 * layer + 1e-6 * x, ks=(4, 8, 12, 16), contexts=(128, 256),
                    op="draft_step", layer=0, seed=2)
    exits["layer"], exits["k"] = exits["k"], 1
    model = fit_latency(pd.concat([solo, corun, exits], ignore_index=True))
    assert set(model.surfaces) == {("draft", False), ("target", False), ("target", True), ("exit", False)}
    assert model.target_forward(3, 128, corun=True) == pytest.approx(0.26, rel=0.03)
    assert model.target_forward(3, 128) == pytest.approx(0.13, rel=0.03)
    assert model.draft_step(128, corun=True) == model.draft_step(128)  # no co-run draft samples
    assert model.draft_step(128, layer=10) == pytest.approx(0.02 + 1.28e-4, rel=0.05)
    assert model.has_corun


def test_held_out_error_sits_at_the_noise_level():
    df = with_draft(samples(lambda k, x: 0.02 + 0.003 * k + 1e-5 * x, noise=0.03, seed=11))
    h = held_out(df)
    assert h.folds == REPEATS and h.samples == len(df)
    # |N(0, 3%)| has median 2.0%; the fit adds a little, a wrong model would add a lot
    assert 0.015 < h.fitted_median < 0.025
    assert h.fitted_median <= h.table_median * 1.1


def test_fitted_profile_round_trips_and_drives_the_simulator(tmp_path):
    df = with_draft(samples(lambda k, x: 0.1 + 0.01 * k + 1e-5 * x, contexts=(0, 64)), contexts=(0, 64))
    model = fit_latency(df, name="unit")
    loaded = load_profile(save_profile(model, tmp_path / "fit.json"))
    assert isinstance(loaded, FittedLatency)
    for k in (1, 4, 30):
        assert loaded.target_forward(k, 40) == pytest.approx(model.target_forward(k, 40))
    np.testing.assert_allclose(loaded.draft_step(np.arange(5)), [model.draft_step(c) for c in range(5)])
    trace = hand_trace(["1111011110" * 3])
    res = Simulator(trace, loaded).run("sd", {"gamma": 3}, with_cost=False)
    assert res.summary.speedup > 1.0


def test_self_speculative_fit_prices_draft_steps_at_the_draft_layer(tmp_path):
    exits = samples(lambda layer, x: 0.002 * layer + 1e-6 * x, ks=(4, 8, 12, 16), op="draft_step", layer=0)
    exits["layer"], exits["k"] = exits["k"], 1
    model = fit_latency(pd.concat([exits, samples(lambda k, x: 0.05 + 0.002 * k)], ignore_index=True), draft_layer=8)
    assert ("draft", False) not in model.surfaces
    assert model.draft_step(300) == model.draft_step(300, layer=8) == pytest.approx(0.016 + 3e-4, rel=0.05)
    assert load_profile(save_profile(model, tmp_path / "self.json")).draft_step(300) == model.draft_step(300)


def test_the_chosen_form_has_the_smallest_bic_and_the_worst_point_its_relative_error():
    model = fit_latency(with_draft(samples(lambda k, x: 0.03 + 0.004 * max(0, k - 6) + 1e-5 * x, seed=7)))
    surface = model.surfaces[("target", False)]
    bics = surface.quality["bic_by_form"]
    assert set(bics) == {"affine", "per-x", "hinge"} and bics[surface.form] == min(bics.values())
    w = surface.quality["worst_point"]
    assert w["rel_err"] == pytest.approx(w["fitted_s"] / w["measured_s"] - 1)


def test_three_measured_ks_can_be_fitted_per_k_but_not_as_a_hinge():
    # a table in k needs three points (two would define the line); a hinge four
    three = samples(lambda k, x: CPU_VERIFY_MS[k] / 1e3, ks=(1, 2, 3), seed=8)
    _, bics = fit_best(*columns(three))
    assert set(bics) == {"affine", "per-x"}


def test_a_fit_without_samples_or_without_a_draft_step_is_refused_by_name():
    with pytest.raises(SimlabError, match="^the trace has no latency samples to fit$"):
        fit_latency(samples(lambda k, x: 0.1, ks=(1,)).iloc[:0])
    with pytest.raises(SimlabError, match="^latency model 'q' has no solo draft-step fit$"):
        fit_latency(samples(lambda k, x: 0.1 + 0.01 * k), name="q")


def test_co_running_samples_are_predicted_by_the_co_running_fit():
    solo = with_draft(samples(lambda k, x: 0.1 + 0.01 * k, contexts=(128, 256)), contexts=(128, 256))
    corun = samples(lambda k, x: 0.2 + 0.02 * k, contexts=(128, 256), corun=True, seed=1)
    model = fit_latency(pd.concat([solo, corun], ignore_index=True))
    # twice the solo cost beside the draft model: 0.2 + 0.02 k, not 0.1 + 0.01 k
    assert predict_samples(model, corun) == pytest.approx(0.2 + 0.02 * corun["k"].to_numpy(), rel=0.03)


def test_tree_series_get_their_own_fits_and_round_trip(tmp_path):
    # the probe's tree axis: verifications 20% dearer than the chain, the drafting exit layer's
    # expansion of w nodes 1 + 0.5 (w - 1) of its steps; a self-speculative trace (exit layer 8)
    def chain(k, x):
        return 0.05 + 0.01 * k + 1e-5 * x

    def step(w, x):
        return (0.01 + 2e-6 * x) * (1 + 0.5 * (w - 1))

    exits = samples(lambda layer, x: step(1, x) * layer / 8, ks=(4, 8), op="draft_step", layer=0)
    exits["layer"], exits["k"] = exits["k"], 1
    trees = pd.concat([samples(lambda k, x: 1.2 * chain(k, x), ks=(2, 4, 8, 16), op="target_tree", seed=3),
                       samples(step, ks=(2, 4, 8), op="draft_tree", layer=8, seed=4)], ignore_index=True)
    df = pd.concat([samples(chain), exits], ignore_index=True)
    model = fit_latency(pd.concat([df, trees], ignore_index=True), draft_layer=8)
    assert {("target_tree", False), ("draft_tree", False)} <= set(model.surfaces)
    assert model.target_tree(8, 1024) == pytest.approx(1.2 * chain(8, 1024), rel=0.03)
    assert model.target_forward(8, 1024) == pytest.approx(chain(8, 1024), rel=0.03)
    assert model.draft_tree_factor(4, 1024) == pytest.approx(2.5, rel=0.05)
    loaded = load_profile(save_profile(model, tmp_path / "trees.json"))
    assert (loaded.target_tree(5, 700), loaded.draft_tree_factor(3, 700)) == (model.target_tree(5, 700),
                                                                             model.draft_tree_factor(3, 700))
    h = held_out(pd.concat([df, trees], ignore_index=True), draft_layer=8)
    assert h.by_series["target_tree"] < 0.03 and h.by_series["draft_tree"] < 0.03  # 2% noise
    chains = fit_latency(df, draft_layer=8)  # no tree axis: trees are priced as chains
    assert chains.target_tree(8, 1024) == chains.target_forward(8, 1024)
    assert chains.draft_tree_factor(4, 1024) == chains.target_forward(4, 1024) / chains.target_forward(1, 1024)


def test_held_out_needs_only_two_repeats_and_the_table_baseline_is_exact_on_noiseless_samples():
    # two noiseless repeats: each fold's table holds the other repeat's identical medians, so
    # every left-out sample is predicted exactly (relative error 0); an affine fit nearly so
    def verify(k, x):
        return 0.02 + 0.003 * k + 1e-5 * x

    df = pd.concat([noisy_latency(verify, KS, CONTEXTS, 2, 0.0),
                    noisy_latency(lambda k, c: 0.01 + 2e-6 * c, (1,), CONTEXTS, 2, 0.0, op="draft_step")],
                   ignore_index=True)
    h = held_out(df)
    assert (h.folds, h.samples) == (2, len(df))
    assert sorted(h.by_series) == ["draft", "target"]
    with pytest.raises(SimlabError, match="^held-out evaluation needs latency samples of at least two probe repeats$"):
        held_out(df[df["repeat"] == 0])
    corun = noisy_latency(lambda k, c: 2 * verify(k, c), KS, CONTEXTS, 2, 0.0, corun=True)
    assert sorted(held_out(pd.concat([df, corun], ignore_index=True)).by_series) == ["draft", "target",
                                                                                   "target (co-run)"]
    assert h.table_median == pytest.approx(0.0, abs=1e-12)
    assert h.fitted_median < 1e-6  # an affine fit recovers them, to its solver's rounding


def test_co_running_tree_verifications_are_predicted_co_running():
    # a co-running tree verification: the co-running chain (1.5 x solo) times the solo tree's
    # measured ratio to its chain, 0.9 / chain(2): 1.5 x 0.9 = 1.35 s, not the solo 0.9 s
    lat = TableLatency.from_samples(latency_table(draft=0.1, verify={1: 0.5, 2: 0.6, 3: 0.7}, ctx=(100, 200),
                                                  corun=(2.0, 1.5), tree={2: 0.9}))
    rows = pd.DataFrame([("target_tree", 2, 100, NO_LAYER, corun, 0, 0.0) for corun in (False, True)],
                        columns=["op", "k", "context_len", "layer", "corun", "repeat", "seconds"])
    assert predict_samples(lat, rows) == pytest.approx([0.9, 1.35])


def test_a_fit_names_no_hardware_unless_told():
    df = with_draft(samples(lambda k, x: 0.1 + 0.01 * k, contexts=(0, 64)), contexts=(0, 64))
    assert fit_latency(df).hardware == ""
    assert fit_latency(df, hardware="2-core CPU").hardware == "2-core CPU"


def test_a_surface_with_a_negative_context_slope_or_a_non_finite_parameter_is_refused():
    ok = {"form": "affine", "base": [0.1, 0.01], "xs": [1, 2, 4]}
    assert Surface.from_dict(ok).base == (0.1, 0.01)
    for bad in ({**ok, "ctx_slope": -1e-6}, {**ok, "ctx_x_slope": -1e-6}, {**ok, "base": [0.1, float("nan")]}):
        with pytest.raises(SimlabError, match="must be finite, with non-negative context slopes"):
            Surface.from_dict(bad)


def test_a_fitted_exit_head_is_its_surface_over_the_rows():
    # the probe's exit-head axis: 1 ms a row of hidden state (context 0); an affine fit in rows
    heads = noisy_latency(lambda n, c: 0.001 * n, (1, 2, 4, 8, 16, 32), (0,), 2, 0.0, op="exit_head")
    model = fit_latency(pd.concat([with_draft(samples(lambda k, x: 0.1 + 0.01 * k)), heads], ignore_index=True))
    assert model.exit_head(4) == pytest.approx(0.004, rel=1e-6)
    assert fit_latency(with_draft(samples(lambda k, x: 0.1 + 0.01 * k))).exit_head(4) is None  # no such axis


def test_an_unknown_form_is_refused_naming_the_forms():
    with pytest.raises(SimlabError, match=r"unknown latency form 'cubic'; choose one of affine, hinge, per-x or auto"):
        fit_surface([1, 2, 3], [0, 0, 0], [0.1, 0.2, 0.3], "cubic")


def test_r2_is_one_for_an_exact_fit_and_below_one_for_a_poor_one():
    # 1 - residual / total sum of squares: an affine fit of affine samples leaves no residual;
    # an affine fit of the non-monotone CPU verify costs leaves some, so 0 < r2 < 1
    ks = list(CPU_VERIFY_MS)
    exact = fit_surface(ks, [0] * len(ks), [0.1 + 0.01 * k for k in ks], "affine").quality["r2"]
    poor = fit_surface(ks, [0] * len(ks), [CPU_VERIFY_MS[k] / 1000 for k in ks], "affine").quality["r2"]
    assert exact == pytest.approx(1.0)
    assert 0.0 < poor < 1.0


"""No silent extrapolation (issue 44, item 2): every run counts the forwards it priced past
what the trace measured, by rule; ``--strict`` refuses them; a fit from too few samples says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simlab.cli import main
from simlab.common.locations import CALIBRATE, TRACES
from simlab.latency.coverage import CONTEXT, K, Span, coverage_of
from simlab.latency.fitted import thin_fits
from simlab.latency.model import TableLatency, load_profile
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace, write_trace


def at_k1(trace):
    """``trace`` with its target forwards' samples cut to k = 1 (the issue's example)."""
    lat = trace.latency
    trace.latency = lat[(lat["op"] != "target_forward") | (lat["k"] == 1)].reset_index(drop=True)
    return trace


@pytest.fixture(scope="module")
def k1_path(tmp_path_factory):
    """The default trace, its target forwards timed at k = 1 only, on disk."""
    return write_trace(at_k1(read_trace(TRACES / "qwen-coder-humaneval")), tmp_path_factory.mktemp("k1") / "trace")


def run_cli(capsys, *args) -> tuple[int, str, str]:
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_span_names_the_size_and_context_rules():
    span = Span({1: (128, 512), 4: (128, 256), 8: (128, 512)})
    ctx = np.array([100, 200, 300, 600])
    assert span.codes(1, ctx, K).tolist() == [CONTEXT, 0, 0, CONTEXT]
    assert span.codes(2, ctx, K).tolist() == [CONTEXT, 0, CONTEXT, CONTEXT]  # between 1 and 4: both ranges
    assert span.codes(9, ctx, K).tolist() == [K | CONTEXT, K, K | CONTEXT, K | CONTEXT]  # past 8: reads 4 and 8
    assert Span({3: (0, 0)}).codes(2, 0, K) == K  # below the smallest size


def test_k1_trace_simulates_sd_at_1_99x_and_says_every_drafted_verification_was_extrapolated(k1_path):
    full = Simulator(read_trace(TRACES / "qwen-coder-humaneval")).run("sd", {"gamma": 5}).summary
    sim = Simulator(read_trace(k1_path))
    cut = sim.run("sd", {"gamma": 5}).summary
    assert round(full.speedup, 2) == 1.37 and round(cut.speedup, 2) == 1.99  # the figures
    assert full.extra["extrapolated_by_rule"].get("k", 0) == 0
    # every verification of drafts is a forward of k >= 2 tokens, priced as the one-token forward;
    # so is the catch-up of a round after a fully accepted one (the target's growth to 2 tokens),
    # part of that round's first draft step
    _, drafts, _, _, _, _, after_full = sim._fixed_gamma()._rounds(5)
    catch_ups = int((after_full & (drafts > 0)).sum())
    assert catch_ups > 0 and cut.extra["extrapolated_by_rule"]["k"] == cut.num_drafts + catch_ups
    # the same forwards at the same contexts: the context rule counts the same on both
    assert cut.extra["extrapolated_by_rule"]["context"] == full.extra["extrapolated_by_rule"]["context"] > 0
    assert cut.extra["priced_forwards"] == full.extra["priced_forwards"] == cut.draft_calls + cut.target_calls + cut.tokens


def test_llama_cpp_trace_at_k1_counts_exactly_its_drafted_verifications():
    """A llama.cpp trace: contexts inside the probed ones, no catch-ups (its verification feeds the
    draft), plain steps timed: the only extrapolated forwards are the verifications of drafts."""
    sim = Simulator(at_k1(read_trace(TRACES / "qwen-coder-llama-cpp")))
    s = sim.run("sd", {"gamma": 5}).summary
    assert s.extra["extrapolated_by_rule"] == {"k": s.num_drafts}
    assert s.extra["extrapolated_forwards"] == s.num_drafts > 0
    assert s.extra["priced_forwards"] == s.draft_calls + s.target_calls + s.tokens


@pytest.mark.parametrize("policy, params", [("sd", {"gamma": 5}), ("pearl", {}), ("dv", {}), ("oracle", {}),
                                            ("ags", {}), ("pld", {})])
def test_full_table_trace_shows_zero_extrapolated_forwards(policy, params):
    """qwen-coder-edit: every k to 17 (then 24, 32) at contexts 128 and 512, its prompts' contexts 159-395."""
    s = Simulator(read_trace(TRACES / "qwen-coder-edit")).run(policy, params).summary
    assert s.extra["extrapolated_forwards"] == 0 and s.extra["extrapolated_by_rule"] == {}
    assert s.extra["priced_forwards"] >= s.draft_calls + s.target_calls + s.tokens


def test_a_schedule_that_outgrows_the_probed_k_is_flagged_on_the_full_table():
    """The same trace: the heuristic schedule and SPIDE's dynamic drafting grow past k = 32, the
    largest probed."""
    sim = Simulator(read_trace(TRACES / "qwen-coder-edit"))
    for policy in ("hf-heuristic", "spide"):
        s = sim.run(policy).summary
        assert set(s.extra["extrapolated_by_rule"]) == {"k"} and s.extra["extrapolated_forwards"] > 0


@pytest.mark.parametrize("trace, policy, params", [
    ("qwen-coder-humaneval", "sd", {"gamma": 5}),
    ("qwen-coder-humaneval", "spide", {}),
    ("qwen-coder-humaneval", "pld", {}),
    ("smollm2-selfspec", "del", {}),
    ("smollm2-tree", "tree-static", {}),
    ("smollm2-tree", "eagle2", {}),
])
def test_closed_forms_count_what_the_simpy_executor_counts(trace, policy, params):
    """keep_tokens sends a run through the round protocol; the compiled and vectorised replays
    must count the same forwards with the same rules."""
    tr = read_trace(TRACES / trace)
    at_k1(tr)  # every rule in play: k (and the trees' chain), context
    sim = Simulator(tr)
    closed, protocol = sim.run(policy, params).summary, sim.run(policy, params, keep_tokens=True).summary
    assert closed.speedup == protocol.speedup
    keys = ("priced_forwards", "extrapolated_forwards", "extrapolated_by_rule")
    assert {k: closed.extra[k] for k in keys} == {k: protocol.extra[k] for k in keys}
    assert closed.extra["extrapolated_forwards"] > 0


@pytest.mark.parametrize("keep_tokens", [False, True])
def test_tree_sizes_past_the_probed_ones_are_flagged(keep_tokens):
    tr = read_trace(TRACES / "smollm2-tree")
    lat = tr.latency
    tr.latency = lat[(lat["op"] != "target_tree") | (lat["k"] <= 3)].reset_index(drop=True)
    sim = Simulator(tr)
    s = sim.run("tree-static", {}, keep_tokens=keep_tokens).summary
    # every tree verified over more than 3 tokens: all but those cut short at a prompt's end
    assert set(s.extra["extrapolated_by_rule"]) == {"tree_size"}
    assert 0.95 * s.target_calls < s.extra["extrapolated_forwards"] <= s.target_calls
    # the draft's levels over more nodes than probed, too
    tr.latency = lat[~lat["op"].isin(["target_tree", "draft_tree"]) | (lat["k"] <= 3)].reset_index(drop=True)
    both = Simulator(tr).run("tree-static", {}, keep_tokens=keep_tokens).summary
    assert both.extra["extrapolated_forwards"] > 1.5 * s.extra["extrapolated_forwards"]


def test_simulate_json_table_and_strict(k1_path, capsys):
    code, out, err = run_cli(capsys, "simulate", "--json", "--trace", k1_path, "--param", "gamma=5")
    figures = json.loads(out)
    assert code == 0 and figures["extrapolated_by_rule"]["k"] > 0
    assert figures["extrapolated_forwards"] <= figures["priced_forwards"]
    code, out, err = run_cli(capsys, "simulate", "--trace", k1_path)
    assert code == 0 and "priced forwards extrapolated past the measured latencies (by rule: k " in " ".join(out.split())
    code, out, err = run_cli(capsys, "simulate", "--strict", "--trace", k1_path)
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("simlab: error: --strict: sd on ") and "by rule: k " in err
    code, out, err = run_cli(capsys, "simulate", "--strict", "--trace", TRACES / "qwen-coder-edit")
    assert code == 0 and "none extrapolated past the measured latencies" in " ".join(out.split())


def test_calibrate_fit_from_k1_samples_says_so_and_its_profile_flags_k(k1_path, tmp_path, capsys):
    profile = tmp_path / "k1.json"
    code, out, err = run_cli(capsys, "calibrate", "fit", k1_path, "--out", profile, "--json")
    thin = json.loads(out)["too_few_samples"]
    assert code == 0 and thin[0].startswith("target: samples at one k only (k = 1)")
    code, out, err = run_cli(capsys, "calibrate", "fit", k1_path, "--out", profile, "--force")
    assert code == 0 and "too few samples: target: samples at one k only" in " ".join(out.split())
    code, out, err = run_cli(capsys, "calibrate", "fit", k1_path, "--out", tmp_path / "no.json", "--strict")
    assert code == 2 and err.count("\n") == 1 and "--strict: 2 series" in err and not (tmp_path / "no.json").exists()
    s = Simulator(read_trace(k1_path), load_profile(profile)).run("sd", {"gamma": 5}).summary
    assert s.extra["extrapolated_by_rule"]["k"] >= s.num_drafts


def test_shipped_fit_rests_on_enough_samples():
    assert thin_fits(load_profile(CALIBRATE / "qwen-coder-cpu.json")) == []


def test_one_sample_per_point_is_named(k1_path):
    from simlab.latency.fitted import fit_latency

    lat = read_trace(k1_path).latency
    fit = fit_latency(lat[lat["repeat"] == 0])
    assert any("one sample per measured point" in line for line in thin_fits(fit))


def test_table_coverage_of_the_default_trace():
    model = TableLatency.from_samples(read_trace(TRACES / "qwen-coder-humaneval").latency)
    ctx = np.array([100, 300])
    assert coverage_of(model, "target_forward", 6, ctx).tolist() == [CONTEXT, 0]
    assert coverage_of(model, "target_forward", 200, ctx).tolist() == [K | CONTEXT, K]  # probed to k = 128
    assert coverage_of(model, "draft_step", -1, ctx, corun=True).tolist() == [CONTEXT, 0]


def test_sweep_table_and_frontier_plot_say_which_rows_were_extrapolated(k1_path, tmp_path, capsys):
    from simlab.common.table_file import read_frame
    from simlab.plots.frontier import EXTRAPOLATED_LABEL, frontier_figure
    from simlab.sweep.result_table import param_columns

    out = tmp_path / "sweep.csv"
    args = ("sweep", "--trace", k1_path, "--policy", "sd:gamma=1..2", "--workers", "1", "--no-cache")
    code, text, err = run_cli(capsys, *args, "--out", out)
    assert code == 0 and "2 of 2 configurations priced forwards past the measured latencies (rules: k, context;" in (
        " ".join(text.split()))
    table = read_frame(out)
    assert (table["extrapolated_forwards"] > 0).all() and table["extrapolated_rules"].str.startswith("k=").all()
    assert param_columns(table) == ["gamma"]  # the new columns are not taken for policy parameters
    ax = frontier_figure(table).axes[0]
    assert "2 of 2 configurations priced forwards past the measured latencies" in ax.get_title()
    assert EXTRAPOLATED_LABEL not in [t.get_text() for t in ax.get_legend().get_texts()]  # all of them: no marks
    table.loc[0, "extrapolated_forwards"] = 0  # one configuration measured throughout: the other is marked
    labels = [t.get_text() for t in frontier_figure(table).axes[0].get_legend().get_texts()]
    assert EXTRAPOLATED_LABEL in labels
    code, text, err = run_cli(capsys, *args, "--strict")
    assert code == 2 and err.count("\n") == 1 and "--strict: 2 of 2 configurations" in err


def test_serve_counts_batches_priced_from_batch_1_figures_and_prompt_sized_prefills(k1_path):
    from simlab.serve.run import ServeConfig, serve
    from simlab.serve.scheduler import Scheduler

    times = [0.0] * 6
    # one request at a time on the full table: only the prefills, k = a prompt's tokens at context 0
    res = serve(Simulator(read_trace(TRACES / "qwen-coder-edit")), times, ServeConfig(scheduler=Scheduler(1)))
    prefills = 2 * res.run.stats.prefill_steps + res.baseline.stats.prefill_steps  # target and draft; ad: target
    priced = res.priced.to_dict()
    assert priced["extrapolated_forwards"] == prefills and set(priced["extrapolated_by_rule"]) == {"k", "context"}
    # four at once on the k = 1 trace, which has no batch axis: the token-count rule prices every batch
    res = serve(Simulator(read_trace(k1_path)), times, ServeConfig(scheduler=Scheduler(4)))
    priced = res.priced.to_dict()
    assert res.extrapolated and priced["extrapolated_by_rule"]["batch"] > 0 and priced["extrapolated_by_rule"]["k"] > 0


def test_rate_rows_carry_the_counts(k1_path, capsys):
    code, out, err = run_cli(capsys, "serve", "--trace", k1_path, "--rate", "1,2", "--requests", "4", "--max-batch", "4",
                             "--json")
    rows = json.loads(out)
    assert code == 0 and all(r["extrapolated_forwards"] > 0 and "batch=" in r["extrapolated_rules"] for r in rows)
    code, out, err = run_cli(capsys, "serve", "--trace", k1_path, "--rate", "1,2", "--requests", "4", "--max-batch", "4",
                             "--strict")
    assert code == 2 and err.count("\n") == 1 and "--strict: 4 of 4 rows priced forwards" in err


def test_fitted_profile_spans_its_samples(k1_path):
    from simlab.latency.fitted import FittedLatency, fit_latency

    fit = fit_latency(read_trace(k1_path).latency)
    ctx = np.array([100, 300, 600])  # probed at 128 and 512
    assert coverage_of(fit, "target_forward", 1, ctx).tolist() == [CONTEXT, 0, CONTEXT]
    assert coverage_of(fit, "target_forward", 2, ctx).tolist() == [K | CONTEXT, K, K | CONTEXT]
    profile = fit.to_profile()
    assert coverage_of(FittedLatency.from_profile(profile), "target_forward", 1, ctx).tolist() == [CONTEXT, 0, CONTEXT]
    for surface in profile["surfaces"]:  # a profile written before the largest context was kept
        del surface["ctx_max"]
    assert coverage_of(FittedLatency.from_profile(profile), "target_forward", 1, ctx).tolist() == [CONTEXT, 0, 0]


def test_batch_rule_of_each_batched_price():
    from simlab.latency.batch import BatchLatency
    from simlab.latency.coverage import BATCH

    no_axis = BatchLatency(Simulator(read_trace(TRACES / "qwen-coder-edit")).latency)  # batch-1 samples only
    assert no_axis.target_bits([3], [200]) == 0 and no_axis.target_bits([3, 3], [200, 200]) == BATCH
    assert no_axis.step_bits([200, 200]) == BATCH and no_axis.draft_bits([1, 1], [200, 200]) == BATCH
    probed = BatchLatency(Simulator(read_trace(TRACES / "smollm2-selfspec")).latency)  # batches 2, 4, 8; k to 9
    assert probed.target_bits([3] * 2, [200] * 2) == 0 and probed.target_bits([3] * 3, [200] * 3) == 0
    assert probed.target_bits([3] * 16, [200] * 16) == BATCH and probed.target_bits([12] * 2, [200] * 2) == K
    assert probed.step_bits([200] * 16) == BATCH and probed.draft_bits([1] * 16, [200] * 16) == BATCH

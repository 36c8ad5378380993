"""`simlab calibrate`, `analytic --trace`, `synth --latency-profile` and `simulate --predictor`
as a user runs them: real subprocesses, real files, one-line errors."""

import json

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from simlab.latency.model import load_profile
from simlab.latency.plot import plot_fit
from simlab.trace.io import read_trace, write_trace
from tests.helpers import noisy_latency
from tests.test_cli import simlab


def draws_the_same(path, expected) -> bool:
    """Whether two PNGs have the same pixels and are not blank."""
    pixels, want = mpimg.imread(path), mpimg.imread(expected)
    return pixels.shape == want.shape and np.array_equal(pixels, want) and pixels[..., :3].std() > 0.05


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """A synthetic trace whose latency table looks probed: 5 repeats with 2% noise of a 25 ms
    target step (+5% per extra token) and a 2.5 ms draft step."""
    out = tmp_path_factory.mktemp("traces") / "iid"
    simlab("synth", "--kind", "iid", "--alpha", "0.8", "--prompts", "6", "--tokens", "300", "--out", out)
    tr = read_trace(out)
    contexts = (128, 428)
    tr.latency = pd.concat([
        noisy_latency(lambda k, c: 0.025 * (1 + 0.05 * (k - 1)), range(1, 18), contexts),
        noisy_latency(lambda k, c: 0.0025, (1,), contexts, op="draft_step", seed=1),
    ], ignore_index=True)
    write_trace(tr, out)
    return out


@pytest.fixture(scope="module")
def profile(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "fit.json"
    simlab("calibrate", trace, "--out", out)
    return out


def test_calibrate_fits_a_profile_that_simulate_uses(trace, profile):
    data = json.loads(profile.read_text())
    assert data["kind"] == "fitted" and {s["series"] for s in data["surfaces"]} == {"draft", "target"}
    by_table = json.loads(simlab("simulate", "--trace", trace, "--gamma", "4", "--json").stdout)
    by_fit = json.loads(simlab("simulate", "--trace", trace, "--gamma", "4", "--latency", profile, "--json").stdout)
    assert by_fit["latency"] == "fit"
    assert by_fit["speedup"] == pytest.approx(by_table["speedup"], rel=0.01)


def test_calibrate_prints_fit_quality_and_draws_the_fit(trace, tmp_path):
    # held-out errors sit at the 2% noise: median |N(0, 2%)| is 1.3%
    out = simlab("calibrate", "fit", trace, "--out", tmp_path / "p.json", "--plot", tmp_path / "fit.png").stdout
    text = " ".join(out.split())  # rich wraps long lines and table headers
    for label in ("R²", "worst", "held-out samples", "median |error|"):
        assert label in text
    held = json.loads((tmp_path / "p.json").read_text())["held_out"]
    assert 0.008 < held["fitted_median"] < 0.02
    # the picture is the library's drawing of the saved fit over the trace's samples, not merely a PNG
    expected = plot_fit(load_profile(tmp_path / "p.json"), read_trace(trace).latency, tmp_path / "expected.png")
    assert draws_the_same(tmp_path / "fit.png", expected)
    # and it shows the data: another trace's samples draw another picture
    other = read_trace(trace).latency.assign(seconds=lambda d: d["seconds"] * 2)
    assert not draws_the_same(tmp_path / "fit.png", plot_fit(load_profile(tmp_path / "p.json"), other,
                                                            tmp_path / "other.png"))


def test_roofline_check_states_the_error_against_pacer():
    out = json.loads(simlab("calibrate", "roofline", "--check", "--json").stdout)
    pacer = [r for r in out["rows"] if r["source"] == "Pacer Table 14"]
    assert len(pacer) == 2 and all(abs(r["rel_err"]) < 0.10 for r in pacer)
    assert out["overhead"]["per_layer_s"] > 0


def test_roofline_summary_prices_tree_verification(tmp_path):
    """A tree of n nodes is verified over n + 1 tokens with the mask's reads on top: at least the
    chain forward of fewer tokens, growing with n, and on an H100 at batch 1 nearly flat (the
    forward reads the weights once however many tokens it carries)."""
    out = json.loads(simlab("calibrate", "roofline", "--target-config", "smollm2-135m", "--draft-layer", "24",
                            "--gpu", "h100", "--out", tmp_path / "s.json", "--json").stdout)
    from simlab.latency.model import load_profile

    model = load_profile(tmp_path / "s.json")
    trees = {r["nodes"]: r["target_ms"] for r in out["target_tree_ms"]}
    assert sorted(trees) == [4, 16, 64]
    for n, ms in trees.items():  # n nodes and the last committed token, plus a mask's reads (well under 1%)
        assert ms == 1e3 * model.target_tree(n + 1, out["context_len"])
        chain = 1e3 * model.target_forward(n + 1, out["context_len"])
        assert chain < ms < 1.01 * chain
    assert trees[4] < trees[16] < trees[64] < 1.5 * out["target_forward_ms"][0]["target_ms"]
    text = simlab("calibrate", "roofline", "--target-config", "smollm2-135m", "--draft-layer", "24", "--gpu", "h100",
                  "--out", tmp_path / "t.json").stdout
    assert "tree of 64 nodes" in text


def test_a_paper_setup_without_its_gpus(tmp_path):
    prof = tmp_path / "pacer.json"
    simlab("calibrate", "roofline", "--draft-config", "deepseek-coder-1.3b", "--target-config", "deepseek-coder-33b",
           "--gpu", "a800-80g", "--out", prof)
    table = "calibrate/mapping/spide-fig4-deepseek-1.3b-33b.csv"
    simlab("synth", "--kind", "table", "--table", table, "--latency-profile", prof, "--prompts", "4", "--out",
           tmp_path / "fig4")
    manifest = json.loads((tmp_path / "fig4" / "manifest.json").read_text())
    assert manifest["hardware"] == "NVIDIA A800 80GB SXM" and "pacer" in manifest["notes"]
    res = json.loads(simlab("simulate", "--trace", tmp_path / "fig4", "--gamma", "6", "--json").stdout)
    roofline = json.loads(simlab("simulate", "--trace", tmp_path / "fig4", "--gamma", "6", "--latency", prof,
                                 "--json").stdout)
    assert res["speedup"] == pytest.approx(roofline["speedup"], rel=0.01)
    assert res["speedup"] > 2


def test_predictor_trains_reports_and_feeds_simulate(trace, tmp_path):
    out = json.loads(simlab("calibrate", "predictor", trace, "--out", tmp_path / "p.json", "--json").stdout)
    assert out["kind"] == "logistic" and out["report"]["test"]["auc"] > 0.6
    res = json.loads(simlab("simulate", "--trace", trace, "--predictor", tmp_path / "p.json", "--json").stdout)
    assert res["predictor"] == out["name"]


def test_analytic_trace_compares_closed_forms_with_the_simulator(trace):
    out = json.loads(simlab("analytic", "--trace", trace, "--max-gamma", "4", "--json").stdout)
    assert [g["gamma"] for g in out["gammas"]] == [1, 2, 3, 4]
    assert {"speedup_iid", "speedup_runs", "speedup_sim", "err_iid"} <= set(out["gammas"][0])
    assert out["window"] == int(out["t_target_s"] / out["t_draft_s"]) in (9, 10)  # about 25 ms / 2.5 ms
    assert len(out["h_rule"]) == 4


@pytest.mark.parametrize("args, message", [
    (("calibrate", "{tmp}/missing", "--out", "{tmp}/p.json"), "trace not found"),
    (("calibrate", "{trace}", "--out", "{tmp}/p.json", "--form", "cubic"), "unknown form"),
    (("calibrate", "{trace}", "--out", "{tmp}/p.json", "--plot", "{tmp}/fit.txt"), "--plot must end in"),
    (("calibrate", "roofline", "--target-config", "gpt-9", "--out", "{tmp}/r.json"), "unknown model"),
    (("calibrate", "roofline", "--target-config", "vicuna-13b", "--gpu", "tpu-v9", "--out", "{tmp}/r.json"),
     "unknown GPU"),
    (("calibrate", "roofline", "--gpu", "h100"), "needs --target-config"),
    (("calibrate", "predictor", "{trace}", "--out", "{tmp}/p.json", "--kind", "forest"), "unknown predictor kind"),
    (("simulate", "--trace", "{trace}", "--predictor", "{tmp}/garbage.json"), "not valid JSON"),
    (("simulate", "--trace", "{trace}", "--latency", "{tmp}/broken-fit.json"), "malformed"),
    (("analytic", "--trace", "{trace}", "--max-gamma", "0"), "--max-gamma must be >= 1"),
    (("synth", "--out", "{tmp}/s", "--latency-profile", "{tmp}/none.json"), "latency profile not found"),
])
def test_bad_input_gets_one_line_and_status_2(trace, tmp_path, args, message):
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "broken-fit.json").write_text(json.dumps(
        {"format": "simlab-latency", "version": 1, "kind": "fitted", "surfaces": [{"series": "target"}]}))
    proc = simlab(*(a.format(tmp=tmp_path, trace=trace) for a in args), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simlab: error:") and message in lines[0], proc.stderr


def test_calibrate_fits_the_tree_series_and_its_profile_prices_trees(trace, tmp_path):
    # the trace above with a tree axis: verifications 15% dearer than the 25 ms (+5%/token) chain,
    # the draft's expansion of w nodes 1 + 0.6 (w - 1) draft steps
    tr = read_trace(trace)
    contexts = (128, 428)
    tr.latency = pd.concat([
        tr.latency,
        noisy_latency(lambda k, c: 1.15 * 0.025 * (1 + 0.05 * (k - 1)), (2, 4, 8, 16, 32), contexts, op="target_tree",
                      seed=2),
        noisy_latency(lambda k, c: 0.0025 * (1 + 0.6 * (k - 1)), (2, 4, 8), contexts, op="draft_tree", seed=3),
    ], ignore_index=True).fillna({"batch": 1})
    write_trace(tr, tmp_path / "trees")
    out = json.loads(simlab("calibrate", tmp_path / "trees", "--out", tmp_path / "p.json", "--plot",
                            tmp_path / "fit.png", "--json").stdout)
    assert {s["series"] for s in out["surfaces"]} == {"draft", "target", "target_tree", "draft_tree"}
    assert set(out["held_out"]["by_series"]) == {"draft", "target", "target_tree", "draft_tree"}
    model = load_profile(tmp_path / "p.json")
    assert model.target_tree(16, 300) == pytest.approx(1.15 * model.target_forward(16, 300), rel=0.03)
    assert model.draft_tree_factor(4, 300) == pytest.approx(2.8, rel=0.05)


def test_calibrate_fits_a_llama_cpp_traces_plain_step_and_prefills(trace, tmp_path):
    # a llama.cpp trace's extra series (its plain step, its prefills as a server runs them) are
    # fitted, tabulated and drawn, and the saved fit prices a prefill from them
    tr = read_trace(trace)
    contexts = (128, 428)
    tr.latency = pd.concat([
        tr.latency,
        noisy_latency(lambda k, c: 0.02, (1,), contexts, op="target_step", seed=2),
        noisy_latency(lambda k, c: 0.002 * k, (16, 32, 64, 128), contexts, op="target_prefill", seed=3),
        noisy_latency(lambda k, c: 0.0004 * k, (16, 32, 64, 128), contexts, op="draft_prefill", seed=4),
    ], ignore_index=True)
    if "batch" in tr.latency:  # the new rows are single-sequence forwards
        tr.latency["batch"] = tr.latency["batch"].fillna(1).astype("int32")
    path = write_trace(tr, tmp_path / "llama")
    simlab("calibrate", "fit", path, "--out", tmp_path / "p.json", "--plot", tmp_path / "fit.png")
    data = json.loads((tmp_path / "p.json").read_text())
    assert {s["series"] for s in data["surfaces"]} == {"draft", "target", "target_step", "target_prefill", "draft_prefill"}
    fit = load_profile(tmp_path / "p.json")
    assert fit.prefill(100, 128) == pytest.approx(0.2, rel=0.05)
    assert fit.prefill(100, 128, draft=True) == pytest.approx(0.04, rel=0.05)
    assert (tmp_path / "fit.png").stat().st_size > 0

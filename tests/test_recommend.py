"""`simlab recommend`: its advice is what `simlab sweep` of the same grid gives, its ranges and
assumptions come from simulations that can be checked, and its engine settings run in the engines
(Hugging Face generate with SmolLM2; llama.cpp's llama-speculative-simple, slow)."""

import json
import shlex
import subprocess

import pandas as pd
import pytest

from simlab.cli import main
from simlab.common.locations import TRACES, default_trace
from simlab.engines.llama_cpp.args import drafting_args, policy_args
from simlab.policies.hf import assistant_settings
from simlab.sim.run import Simulator
from simlab.sim.spread import prompt_spread
from simlab.sweep.recommend import ENGINES, STANDARD_GRID, Assumption, Choice, Recommendation, resolved, standard_grid
from simlab.trace.io import read_trace

GRID = ["sd:gamma=1..6", "llama-cpp:draft_max=2..6:2,p_min=0.0,0.75", "hf-confidence:threshold=0.2..0.8:0.3",
        "spide:tau=0.6..0.9:0.15"]


def run_json(capsys, *args) -> dict:
    main([*args, "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "grid.csv"
    main(["sweep", *sum((["--policy", g] for g in GRID), []), "--workers", "1", "--no-cache", "--out", str(out)])
    return pd.read_csv(out)


@pytest.mark.parametrize("objective", ["speed", "cost"])
def test_the_advice_is_what_a_sweep_of_the_same_grid_gives(swept, capsys, objective):
    rec = run_json(capsys, "recommend", *sum((["--policy", g] for g in GRID), []), "--objective", objective,
                   "--top", "4", "--workers", "1", "--no-cache")
    assert rec["grid"] == GRID and rec["configurations"] == len(swept)
    if objective == "speed":
        best = swept.sort_values(["speedup", "label"], ascending=[False, True])
        shown = [c["value"] for c in rec["top"]]
        assert shown == pytest.approx(list(best["speedup"][:4]), rel=1e-12)
    else:  # the fewest target calls among those faster than the target alone
        best = swept[swept["speedup"] > 1].sort_values(["cost", "label"])
        assert [c["value"] for c in rec["top"]] == pytest.approx(list(best["cost"][:4]), rel=1e-12)
        assert all(c["figures"]["speedup"] > 1 for c in rec["top"])
    assert [c["label"] for c in rec["top"]] == list(best["label"][:4])
    for c in rec["top"]:  # the range holds the figure it is of
        centre = c["figures"]["speedup"]
        assert c["low"] <= centre <= c["high"] and c["low"] < c["high"]
    # each engine's best is the first row of the ranking that engine runs
    for engine, translate in ENGINES.items():
        runs = [row for row in best.itertuples(index=False) if translate(row.policy, resolved(row.policy, row)) is not None]
        assert rec["engines"][engine]["label"] == runs[0].label, engine


def test_the_engines_settings_are_the_translations_of_the_chosen_parameters(capsys):
    rec = run_json(capsys, "recommend", "--policy", "sd:gamma=3..5", "--policy", "llama-cpp:draft_max=4,p_min=0.5",
                   "--top", "4", "--workers", "1", "--no-cache")
    for c in rec["top"]:
        hf, llama = c["engines"]["Hugging Face transformers"], c["engines"]["llama.cpp"]
        assert llama.endswith(" ".join(policy_args(c["policy"], c["params"])))
        vllm = c["engines"]["vLLM"]
        if c["policy"] == "sd":
            assert f"num_assistant_tokens={c['params']['gamma']}," in hf
            assert llama.endswith(" ".join(drafting_args(c["params"]["gamma"], 0, 0.0)))
            config = json.loads(vllm.removeprefix("--speculative-config '").removesuffix("'"))
            assert config == {"method": "draft_model", "model": "DRAFT", "num_speculative_tokens": c["params"]["gamma"]}
        else:  # vLLM has no confidence stop
            assert hf is None and "--spec-draft-p-min 0.5" in llama and vllm is None


def test_sd_at_gamma_is_llama_cpps_rule_at_that_draft_max_without_stops():
    """What makes `sd` γ's llama.cpp flags exact: the llama-cpp policy at draft_max γ, p_min 0 and
    draft_min 0 makes the same rounds, count for count and second for second."""
    sim = Simulator(read_trace(default_trace()))
    for gamma in (2, 5):
        sd = sim.run("sd", {"gamma": gamma}).summary.to_dict()
        llama = sim.run("llama-cpp", {"draft_max": gamma, "p_min": 0.0, "draft_min": 0}).summary.to_dict()
        assert sd == llama


def test_policies_no_engine_runs_have_no_settings():
    for policy in ("spide", "pearl", "dv", "eagle2"):
        for translate in ENGINES.values():
            assert translate(policy, {}) is None
    assert assistant_settings("hf-heuristic", {"gamma": 5, "schedule": "heuristic"})["assistant_confidence_threshold"] == 0


def test_the_standard_grid_follows_what_the_trace_holds_and_what_serving_batches():
    assert standard_grid(read_trace(default_trace())) == list(STANDARD_GRID)
    selfspec = standard_grid(read_trace(TRACES / "smollm2-selfspec"))
    assert {"layerskip", "del"} <= {s.split(":")[0] for s in selfspec}
    trees = standard_grid(read_trace(TRACES / "smollm2-tree"))
    assert {"eagle2", "tree-static", "ags-tree"} <= {s.split(":")[0] for s in trees}
    served = {s.split(":")[0] for s in standard_grid(read_trace(TRACES / "smollm2-tree"), serving=True)}
    assert not served & {"pearl", "spide", "eagle2", "tree-static", "ags-tree"} and "sd" in served


def test_the_prompt_range_is_a_bootstrap_over_prompts():
    res = Simulator(read_trace(default_trace())).run("sd", {"gamma": 5})
    iv = prompt_spread(res.per_prompt)["speedup"]
    assert iv.low < res.summary.speedup < iv.high and iv.mean == pytest.approx(res.summary.speedup, rel=0.01)
    same = pd.concat([res.per_prompt.iloc[:1]] * 5)  # five copies of one prompt: nothing to resample
    one = prompt_spread(same)["speedup"]
    assert one.low == pytest.approx(one.high)


def test_the_assumption_that_matters_most_is_one_that_changes_the_winner_else_the_largest_move():
    top = [Choice("a", "sd", {}, 2.0, 1.9, 2.1, {}, {}), Choice("b", "sd", {}, 1.9, 1.8, 2.0, {}, {})]
    small_change = Assumption("topology", "b", -0.01, {"a": 1.98, "b": 1.99})
    large_move = Assumption("latency", "a", -0.2, {"a": 1.6, "b": 1.5})
    rec = Recommendation("speed", "speedup", [], pd.DataFrame(), top, [large_move, small_change])
    assert rec.most is small_change
    rec.assumptions = [large_move, Assumption("topology", "a", 0.05, {})]
    assert rec.most is large_move


def test_serial_policies_do_not_move_with_the_topology_and_parallel_ones_do(capsys):
    rec = run_json(capsys, "recommend", "--policy", "sd:gamma=4..5", "--policy", "pearl", "--top", "3",
                   "--workers", "1", "--no-cache")
    topology = next(a for a in rec["assumptions"] if a["name"].startswith("topology"))
    sims = {t: Simulator(read_trace(default_trace()), topology=t) for t in ("one-device", "two-devices")}
    for label, figure in topology["figures"].items():
        c = next(c for c in rec["top"] if c["label"] == label)
        assert figure == pytest.approx(sims["two-devices"].run(c["policy"], c["params"]).summary.speedup)
        if c["policy"] == "sd":
            assert figure == pytest.approx(c["value"])


def test_cost_and_goodput_say_what_they_need(capsys):
    for args, words in ((["--objective", "goodput"], "needs a load"), (["--objective", "cost", "--rate", "0.05"], "drop --rate"),
                        (["--objective", "fast"], "--objective takes")):
        with pytest.raises(SystemExit) as exc:
            main(["recommend", "--policy", "sd:gamma=2", *args])
        assert exc.value.code == 2 and words in capsys.readouterr().err


def test_under_load_the_advice_is_the_serving_sweep_of_the_same_grid(tmp_path, capsys):
    grid = ["sd:gamma=2..6:2", "hf-heuristic"]
    args = [*sum((["--policy", g] for g in grid), []), "--rate", "0.05", "--requests", "40"]
    rec = run_json(capsys, "recommend", *args, "--objective", "goodput", "--slo-tpot", "1", "--workers", "1",
                   "--no-cache")
    main(["sweep", *args, "--slo-tpot", "1", "--workers", "1", "--no-cache", "--out", str(tmp_path / "s.csv")])
    capsys.readouterr()
    table = pd.read_csv(tmp_path / "s.csv")
    best = table[table["speculative"]].sort_values(["goodput_requests_per_s", "label"], ascending=[False, True])
    assert [c["label"] for c in rec["top"]] == list(best["label"])
    assert all(c["low"] <= c["value"] <= c["high"] for c in rec["top"])
    assert [a["name"].split(":")[0] for a in rec["assumptions"]] == ["latency"]  # serving has no topology


# ---- the engines run the settings -------------------------------------------------------------

def test_hugging_face_generate_runs_the_printed_settings():
    """A real generate(assistant_model=...) with SmolLM2 drafting for itself, configured by the
    settings recommend prints: the draft length takes effect (every draft is accepted, so each
    target forward after the prefill commits num_assistant_tokens + 1 tokens)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from simlab.models import install
    from simlab.models.load import load_model, load_tokenizer, resolve

    install("smollm2")
    ref = resolve("smollm2")
    model, tokenizer = load_model(ref, "cpu", "float32"), load_tokenizer(ref)
    assistant = load_model(ref, "cpu", "float32")
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    new = 25
    for policy, params in (("sd", {"gamma": 3}), ("sd", {"gamma": 7}),
                           ("hf-confidence", {"threshold": 0.0, "max_draft": 5, "schedule": "constant", "retune": False})):
        assistant.generation_config.update(**assistant_settings(policy, params))
        calls = []
        hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
        try:
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=assistant,
                                     do_sample=False, max_new_tokens=new, min_new_tokens=new)
        finally:
            hook.remove()
        n = assistant.generation_config.num_assistant_tokens
        assert out.shape[1] - ids.shape[1] == new
        assert len(calls) - 1 == -(-(new - 1) // (n + 1)), (policy, params)


@pytest.mark.slow
def test_llama_cpp_runs_the_printed_flags(tmp_path):
    """llama-speculative-simple (built from the package index, as tests/test_llama_cpp_real.py
    builds it) given recommend's flags for llama.cpp's own rule drafts under them."""
    from simlab.engines.llama_cpp import build as llama_cpp
    from simlab.engines.llama_cpp.args import ModelPair, environment
    from simlab.engines.llama_cpp.run import parse
    from simlab.models import install
    from simlab.models.install import gguf_file
    from simlab.sweep.recommend import llama_cpp_settings

    install("smollm2")
    binary = llama_cpp.build().binary
    gguf = gguf_file("smollm2", print)
    pair = ModelPair(gguf, gguf, 2)
    printed = llama_cpp_settings("llama-cpp", {"draft_max": 4, "draft_min": 0, "p_min": 0.0, "n_predict": 0})
    flags = shlex.split(printed.replace("-md DRAFT.gguf --spec-type draft-simple ", ""))
    done = subprocess.run([str(binary), *pair.args("def fibonacci(n):", 24), *flags], capture_output=True, text=True,
                          env=environment())
    assert done.returncode == 0, done.stderr[-2000:]
    run = parse(done.stdout + "\n" + done.stderr)
    # SmolLM2 drafting for itself accepts every draft, so each round emits its cap + 1 tokens; with -n 24
    # speculative-simple caps a round at min(--draft-max, 24 - generated - 1), reads a cap of 0 or less as
    # no limit and stops once more than 24 are out (docs/llama-cpp.md): rounds of 4, 4, 4, 4 (20 out),
    # 3 (24), then 4 (29) -- 23 drafted, 29 predicted; --draft-max ignored (its default 16): 16, 6, 16, 38 drafted
    assert (run.n_drafted, run.n_accept, run.n_predict) == (23, 23, 29)

"""The roofline model: shapes give the published parameter counts, and with the framework
overhead fitted to Spec-Bench's A100 figures it predicts Pacer's A800 latencies within 10%."""

import dataclasses
import json

import pytest

from simlab.common.errors import SimlabError
from simlab.common.locations import CALIBRATE
from simlab.latency import roofline as rf
from simlab.latency.model import load_profile, save_profile
from simlab.trace.schema import NO_LAYER

# Parameter counts in the models' names / model cards (billions)
PUBLISHED_SIZE_B = {"vicuna-7b": 6.7, "vicuna-13b": 13.0, "vicuna-33b": 32.5, "deepseek-coder-1.3b": 1.3,
                    "deepseek-coder-33b": 33.3, "tinyllama-1.1b": 1.1, "codellama-34b": 33.7, "qwen3-32b": 32.8,
                    "pythia-12b": 11.8, "qwen2.5-coder-1.5b": 1.54}
H100_PROFILE = CALIBRATE / "roofline" / "qwen2.5-coder-0.5b-1.5b-h100.json"
PACER_BOUND = 0.10  # stated in calibrate/README.md


@pytest.mark.parametrize("name", sorted(PUBLISHED_SIZE_B))
def test_shapes_have_the_published_parameter_counts(name):
    shape = rf.model_shape(name)
    assert shape.total_params / 1e9 == pytest.approx(PUBLISHED_SIZE_B[name], rel=0.05)


def test_roofline_with_fitted_overhead_predicts_pacer_table14_within_10_percent():
    df = rf.check_published("hf-eager")
    pacer = df[df["source"] == "Pacer Table 14"]
    assert set(pacer["model"]) == {"deepseek-coder-1.3b", "deepseek-coder-33b"}
    assert (pacer["role"] == "check").all()  # not used to fit the overhead
    assert (pacer["rel_err"].abs() < PACER_BOUND).all(), pacer


def test_bare_roofline_is_a_lower_bound_on_every_published_figure():
    df = rf.check_published("hf-eager")
    assert (df["ideal_s"] < df["seconds"]).all()


def test_overhead_is_fitted_only_from_fit_rows():
    rows = rf.published_latencies()
    changed = rows.copy()
    changed.loc[changed["role"] == "check", "value"] *= 10
    assert rf.fit_overhead("hf-eager", changed) == rf.fit_overhead("hf-eager", rows)
    assert rf.fit_overhead("ideal").per_layer_s == 0.0


def test_verify_is_flat_while_memory_bound_then_grows_with_k():
    model = rf.RooflineLatency("t", rf.model_shape("vicuna-13b"), rf.gpu_spec("a100-80g"), rf.model_shape("vicuna-68m"))
    assert model.target_forward(8, 512) == pytest.approx(model.target_forward(1, 512), rel=0.01)
    # 2 FLOPs per weight per token: ~26 TFLOP at k=1000 is 83 ms at 312 TFLOPS, more than the 13 ms weight read
    assert model.target_forward(1000, 512) > 3 * model.target_forward(1, 512)
    assert model.target_forward(1, 4096) > model.target_forward(1, 128)  # a longer KV cache to read
    assert model.draft_step(512) < model.target_forward(1, 512) / 5


def test_early_exit_steps_cost_grows_with_the_exit_layer():
    model = rf.RooflineLatency("self", rf.model_shape("vicuna-7b"), rf.gpu_spec("h100"))
    steps = [model.draft_step(256, layer) for layer in (4, 8, 16, 32)]
    assert steps == sorted(steps)
    assert steps[-1] == pytest.approx(model.target_forward(1, 256))
    with pytest.raises(rf.SimlabError, match="no draft model"):
        model.draft_step(256, NO_LAYER)
    model.draft_layer = 8  # the trace's drafting exit layer prices draft-model steps
    assert model.draft_step(256) == steps[1]


def test_a_tree_verification_is_a_chain_plus_the_masks_reads(tmp_path):
    """A tree of k tokens reads a k x (ctx + k) mask per layer beside what a chain of k reads,
    and computes as much: the difference is that read while memory-bound, nothing once the
    arithmetic dominates; the draft's expansion is its own w-token forward under the mask."""
    model = rf.RooflineLatency("t", rf.model_shape("vicuna-13b"), rf.gpu_spec("a100-80g"), rf.model_shape("vicuna-68m"))
    layers, bandwidth = model.target.layers, model.gpu.memory_bandwidth_gb_s * 1e9
    for k, ctx in ((8, 512), (64, 2048)):
        mask_s = layers * k * (ctx + k) * 2 / bandwidth  # bfloat16
        assert model.target_tree(k, ctx) - model.target_forward(k, ctx) == pytest.approx(mask_s, rel=1e-6)
        assert mask_s < 0.001 * model.target_forward(k, ctx)  # "usually negligible"
    assert model.target_tree(4096, 512) == model.target_forward(4096, 512)  # compute-bound
    assert model.draft_tree_factor(4, 512) == model.forward(model.draft, 4, 512, tree=True) / model.draft_step(512)
    assert 1 < model.draft_tree_factor(4, 512) < 1.01  # a memory-bound draft: four nodes cost about one step
    loaded = load_profile(save_profile(model, tmp_path / "p.json"))
    assert (loaded.target_tree(8, 512), loaded.draft_tree_factor(4, 512)) == (model.target_tree(8, 512),
                                                                             model.draft_tree_factor(4, 512))


def test_profile_round_trips(tmp_path):
    model = rf.RooflineLatency("pair", rf.model_shape("deepseek-coder-33b"), rf.gpu_spec("a800-80g"),
                               rf.model_shape("deepseek-coder-1.3b"), "float16", rf.fit_overhead("hf-eager"))
    loaded = load_profile(save_profile(model, tmp_path / "p.json"))
    for k in (1, 5, 64):
        assert loaded.target_forward(k, 300) == model.target_forward(k, 300)
    assert loaded.draft_step(300) == model.draft_step(300)


def test_a_hugging_face_config_gives_the_same_shape(tmp_path):
    config = {"model_type": "llama", "num_hidden_layers": 62, "hidden_size": 7168, "intermediate_size": 19200,
              "vocab_size": 32256, "num_attention_heads": 56, "num_key_value_heads": 8, "hidden_act": "silu",
              "tie_word_embeddings": False}
    path = tmp_path / "deepseek-coder-33b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    shape = rf.model_shape(path)
    assert shape.name == "deepseek-coder-33b"
    assert shape.total_params == rf.model_shape("deepseek-coder-33b").total_params


def test_a_hugging_face_config_with_tied_embeddings_counts_the_embedding_once(tmp_path):
    config = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "vocab_size": 1000,
              "num_attention_heads": 4}
    untied = rf.ModelShape.from_dict(config)
    tied = rf.ModelShape.from_dict({**config, "tie_word_embeddings": True})
    assert not untied.tied_embeddings and tied.tied_embeddings
    # the input embedding (vocab x hidden = 64,000 weights) is the LM head's matrix when tied
    assert untied.total_params - tied.total_params == 1000 * 64


def test_published_figures_are_read_from_the_file_given(tmp_path):
    rows = rf.published_latencies()
    table = tmp_path / "mine.csv"
    rows.head(1).drop(columns="seconds").assign(unit="ms", value=40.0).to_csv(table, index=False)
    mine = rf.published_latencies(table)
    assert len(mine) == 1 and mine["seconds"].tolist() == [0.04]  # 40 ms per forward


def test_an_opt_config_has_the_plain_two_matrix_mlp():
    # OPT's MLP is fc1, ReLU, fc2: two matrices, not a gated three (its act names no gelu)
    config = {"model_type": "opt", "num_hidden_layers": 2, "hidden_size": 64, "ffn_dim": 256, "vocab_size": 1000,
              "num_attention_heads": 4, "activation_function": "relu"}
    assert rf.ModelShape.from_dict(config).mlp == "plain"
    assert rf.ModelShape.from_dict({**config, "model_type": "llama"}).mlp == "gated"
    # GPT-J's gelu_new MLP is plain too, by its act; a config that names no model is "model"
    gptj = {**config, "model_type": "gptj", "activation_function": "gelu_new"}
    assert rf.ModelShape.from_dict(gptj).mlp == "plain"
    assert rf.ModelShape.from_dict(config).name == "model"


def test_the_default_overhead_is_hugging_face_eagers_and_names_its_sources():
    rows = rf.published_latencies()
    overhead = rf.fit_overhead()
    assert overhead == rf.fit_overhead("hf-eager", rows)
    fit = rows[(rows["framework"] == "hf-eager") & (rows["role"] == "fit")]
    assert f"on {len(fit)} published figures" in overhead.source
    assert all(source in overhead.source for source in set(fit["source"]))


def test_an_unknown_dtype_is_refused_by_name():
    model = load_profile(H100_PROFILE)
    with pytest.raises(SimlabError, match="unknown dtype 'fp7'; known: float32, float16, bfloat16, int8"):
        dataclasses.replace(model, dtype="fp7")


def test_a_self_speculative_roofline_keeps_its_draft_layer_through_a_profile(tmp_path):
    model = dataclasses.replace(load_profile(H100_PROFILE), draft=None, draft_layer=10)
    back = load_profile(save_profile(model, tmp_path / "selfspec.json"))
    assert back.draft_layer == 10
    assert back.draft_step(100) == model.draft_step(100)


def test_a_model_config_that_is_not_json_is_named_in_the_error(tmp_path):
    path = tmp_path / "mine" / "config.json"
    path.parent.mkdir()
    path.write_text("{not json")
    with pytest.raises(SimlabError, match="model config .* is not valid JSON"):
        rf.model_shape(path)


def test_published_figures_in_an_unknown_unit_are_refused_naming_the_units(tmp_path):
    table = tmp_path / "mine.csv"
    rf.published_latencies().head(1).drop(columns="seconds").assign(unit="furlongs", value=1.0).to_csv(table, index=False)
    with pytest.raises(SimlabError, match=r"unknown units \['furlongs'\]; use tokens_per_s, ms, s"):
        rf.published_latencies(table)


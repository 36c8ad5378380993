"""The traces shipped in traces/ load, hold what traces/README.md says, and show CPU costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from simlab.latency import TableLatency
from simlab.trace import read_trace

TRACES = Path(__file__).resolve().parents[1] / "traces"
QWEN = {"qwen-coder-humaneval": ("humaneval:40", 40), "qwen-coder-mtbench": ("mtbench:20", 20)}


@pytest.mark.parametrize("name", sorted(QWEN))
def test_qwen_traces_are_greedy_recordings_of_the_pair(name):
    trace = read_trace(TRACES / name)
    m = trace.manifest
    assert (m.kind, m.draft_model, m.target_model) == ("recorded", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
    assert (m.dataset, trace.n_prompts) == QWEN[name]
    assert m.greedy and m.max_new_tokens == 128 and m.eos_token_ids == [151643, 151645]
    assert set(trace.prompts.stop) <= {"eos", "length"}
    assert (trace.prompts.n_tokens[trace.prompts.stop == "length"] == 128).all()
    diverged = trace.positions[trace.positions.draft_token != trace.positions.target_token]
    assert set(zip(diverged.prompt_id, diverged.pos)) == set(zip(trace.rollouts.prompt_id, trace.rollouts.pos))


@pytest.mark.parametrize("name", sorted(QWEN))
def test_on_cpu_the_verify_cost_grows_with_k(name):
    lat = read_trace(TRACES / name).latency
    assert lat.corun.any() and (lat.groupby(["op", "k", "context_len", "corun"]).size() >= 5).all()
    model = TableLatency.from_samples(lat)
    for ctx in sorted(lat.context_len.unique()):
        assert model.target_forward(17, ctx) > 1.5 * model.target_forward(1, ctx)
        assert model.draft_step(ctx) < model.target_forward(1, ctx)


def test_smollm2_selfspec_trace_has_every_exit_layer():
    trace = read_trace(TRACES / "smollm2-selfspec")
    m = trace.manifest
    assert m.draft_model == "smollm2[:24]" and m.draft_layer == 24 and m.exit_layers == list(range(1, 30))
    assert sorted(trace.layers.layer.unique()) == list(range(1, 30))
    steps = trace.latency[trace.latency.op == "draft_step"]
    assert sorted(steps.layer.unique()) == list(range(1, 30))
    at24 = trace.layers[trace.layers.layer == 24].sort_values(["prompt_id", "pos"])
    pos = trace.positions.sort_values(["prompt_id", "pos"])
    assert at24.token.tolist() == pos.draft_token.tolist()
    # the exit layers DEL drafts with on these prompts have their own rollouts (--rollout-layers)
    assert m.rollout_layers == [1, 2, 3, 23] and sorted(set(trace.rollouts.layer)) == [-1, 1, 2, 3, 23]


def test_qwen_tree_trace_holds_the_qwen_pairs_trees_and_its_tree_forwards():
    """The Qwen pair's tree data (issue 13: at least 20 HumanEval prompts x 128 tokens), with
    verifications and expansions under a tree mask in its latency probe."""
    trace = read_trace(TRACES / "qwen-coder-tree")
    m = trace.manifest
    assert (m.topk, m.tree_depth, m.temperature, m.max_new_tokens) == (4, 4, 0.0, 128)
    assert (m.target_model, m.draft_model) == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    assert trace.n_prompts == 20 and len(trace.topk) == 4 * len(trace.positions)
    assert len(trace.tree) == (4 + 3 * 16) * len(trace.positions)
    trees = trace.latency[trace.latency.op.isin(["target_tree", "draft_tree"])]
    assert set(trees.op) == {"target_tree", "draft_tree"} and trees.k.max() == 64


def test_smollm2_tree_trace_holds_top_k_and_eagle2_trees():
    trace = read_trace(TRACES / "smollm2-tree")
    m = trace.manifest
    assert (m.topk, m.tree_depth, m.draft_layer, m.temperature) == (4, 4, 24, 0.0)
    assert len(trace.topk) == 4 * len(trace.positions)
    assert len(trace.tree) == (4 + 3 * 16) * len(trace.positions)
    assert trace.n_prompts == 8 and (trace.latency["k"] >= 64).any()  # verifies of up to 63 nodes are measured


@pytest.mark.parametrize("name, source", [("qwen-coder-edit", "humaneval-edit"), ("qwen-coder-turn2", "mtbench-turn2")])
def test_lookup_traces_copy_their_prompts_and_hold_their_token_ids(name, source):
    """Issue 42's traces: greedy recordings of the pair whose prompts' token ids are kept (lookups
    read them) and whose answers copy their input (prompt lookup finds matches for most rounds)."""
    from simlab.sim.run import Simulator

    trace = read_trace(TRACES / name)
    m = trace.manifest
    assert (m.kind, m.draft_model, m.target_model, m.greedy) == ("recorded", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", True)
    assert m.dataset.startswith(source + ":") and trace.prompts.source.str.startswith(source + "/").all()
    assert (trace.prompts.prompt_token_ids.map(len) == trace.prompts.prompt_len).all()
    diverged = trace.positions[trace.positions.draft_token != trace.positions.target_token]
    ends = dict(zip(trace.prompts.prompt_id, trace.prompts.n_tokens))  # each prompt's tail starts at its end
    rolled = set(zip(trace.rollouts.prompt_id, trace.rollouts.pos))
    assert set(zip(diverged.prompt_id, diverged.pos)) | set(ends.items()) == rolled
    s = Simulator(trace).run("pld", with_cost=False).summary
    assert s.num_drafts > s.target_calls / 2

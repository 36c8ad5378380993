"""`simlab record --topk K --tree-depth D` on SmolLM2: every recorded candidate is what the draft
really proposes after its node's own prefix, checked against a plain forward over that prefix."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
torch = pytest.importorskip("torch", reason="simlab record needs the models extra (torch)")
pytest.importorskip("transformers", reason="simlab record needs the models extra (transformers)")

from simlab.models import install  # noqa: E402
from simlab.record.forward import truncated  # noqa: E402
from simlab.record.recorder import RecordConfig, record  # noqa: E402
from simlab.trace import read_trace  # noqa: E402

pytestmark = pytest.mark.slow
K, DEPTH, LAYER = 3, 3, 24


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = install("smollm2")[0].path
    out = tmp_path_factory.mktemp("traces") / "tree"
    record(RecordConfig(target="smollm2", exit_layers=str(LAYER), draft_layer=LAYER, prompts="humaneval:1",
                        max_new_tokens=8, latency_probe="k=1,2;ctx=32;repeats=1", progress=False, rollout=2,
                        topk=K, tree_depth=DEPTH, out=out))
    return read_trace(out), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def test_every_recorded_candidate_is_the_drafts_top_k_after_its_prefix(traced):
    trace, model = traced
    prompt = list(trace.prompts["prompt_token_ids"].iat[0])
    path = trace.positions.sort_values("pos")["target_token"].tolist()
    assert trace.manifest.topk == K and trace.manifest.tree_depth == DEPTH
    with truncated(model, LAYER) as draft:
        for pos in (0, 5):
            nodes = trace.tree[trace.tree["pos"] == pos].sort_values("node")
            assert len(nodes) == K + (DEPTH - 1) * K * K
            parent, token = nodes["parent"].to_numpy(), nodes["token"].to_numpy()
            for node in range(len(nodes)):
                prefix, up = [], parent[node]
                while up >= 0:
                    prefix.append(int(token[up]))
                    up = parent[up]
                probs = torch.softmax(draft(torch.tensor([prompt + path[:pos] + prefix[::-1]])).logits[0, -1], -1)
                top = torch.topk(probs, K)
                rank = int(nodes["rank"].iat[node])
                assert int(top.indices[rank]) == token[node]
                assert float(top.values[rank]) == pytest.approx(float(nodes["prob"].iat[node]), abs=1e-4)
            # level 3 grew from the K level-2 candidates of largest value (EAGLE-2's frontier)
            value = nodes["prob"].to_numpy(np.float64)
            for node in range(len(nodes)):
                if parent[node] >= 0:
                    value[node] *= value[parent[node]]
            level2 = np.arange(K, K + K * K)
            grown = sorted(set(parent[K + K * K:]))
            assert grown == sorted(level2[np.argsort(-value[level2], kind="stable")[:K]])


def test_the_top_k_table_holds_the_target_token_rank(traced):
    trace, _ = traced
    topk = trace.topk.sort_values(["pos", "rank"])
    assert len(topk) == K * len(trace.positions)
    first = topk[topk["rank"] == 0]["token"].to_numpy()
    assert (first == trace.positions.sort_values("pos")["draft_token"].to_numpy()).all()


def test_a_recording_of_trees_probes_tree_forwards_by_default(traced):
    """``--topk`` without ``tree=`` in the probe: the target's tree verifications and the drafting
    exit layer's expansions are timed at the default sizes, beside the chain forwards."""
    lat = traced[0].latency
    target, expand = lat[lat.op == "target_tree"], lat[lat.op == "draft_tree"]
    assert sorted(target.k.unique()) == sorted(expand.k.unique()) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 32, 64]
    assert set(target.layer) == {-1} and set(expand.layer) == {LAYER}
    assert set(lat[lat.op != "exit_head"].context_len) == {32}  # exit heads read no cache: context 0

"""The real-model set-up that tests/test_live.py and tests/test_live_policies.py share: SmolLM2-135M
drafting for itself with its first 24 layers, on two HumanEval prompts, and a trace of them.

The trace (recorded with the shipped tree trace's --topk 4 --tree-depth 4) is recorded once per
run, not once per file: the two files run on different xdist workers, so the first to need it
records it under the run's shared base directory while holding a lock, and the other waits and
reads it. Each file still loads its own models (a module-scoped session). A plugin of
tests/conftest.py, so the files name the fixtures without importing them; it imports torch only
when a fixture runs, so the suite collects without the models extra."""

from __future__ import annotations

from pathlib import Path

import pytest

from simlab.common.atomic import one_at_a_time

LAYER = 24
TOKENS = 24
PROMPTS = "humaneval:2"


@pytest.fixture(scope="session")
def live_trace(tmp_path_factory, worker_id) -> Path:
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # under xdist: the workers' common parent
    out = shared / "live-selfspec"
    with one_at_a_time(shared / "live-selfspec.lock"):
        if not (out / "manifest.json").exists():
            from simlab.models import install
            from simlab.record.recorder import RecordConfig, record

            install("smollm2")
            record(RecordConfig(target="smollm2", prompts=PROMPTS, out=out, max_new_tokens=TOKENS,
                                exit_layers=str(LAYER), draft_layer=LAYER, rollout=8,
                                latency_probe="k=1-4;ctx=64;repeats=1", topk=4, tree_depth=4, progress=False))
    return out


@pytest.fixture(scope="module")
def live_session(live_trace):
    from simlab.live.session import LiveSession
    from simlab.live.setup import LiveConfig

    s = LiveSession(LiveConfig(policy="sd", params={"gamma": 3}, target="smollm2", draft_layer=LAYER,
                               prompts=PROMPTS, max_new_tokens=TOKENS, trace=live_trace, progress=False),
                    log=lambda _: None)
    s.load_trace()
    s.load_models()
    yield s
    s.close()


@pytest.fixture(scope="module")
def live_greedy(live_session):
    """The target's plain greedy tokens per prompt, from transformers' generate."""
    import torch

    target = live_session.executor.target_model
    out = {}
    for pid, ids in live_session.ids.items():
        x = torch.tensor([ids])
        with torch.inference_mode():
            seq = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=TOKENS, do_sample=False,
                                  eos_token_id=live_session.eos, pad_token_id=live_session.eos[0])
        out[pid] = seq[0, len(ids):].tolist()
    return out

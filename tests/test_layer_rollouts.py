"""Exit layers' own divergence rollouts (``simlab record --rollout-layers``) on SmolLM2-135M.

DEL drafts with whichever exit layer its update picks, and past a rejected draft token the
replay reads that layer's own continuation. A trace of SmolLM2 drafting with its first 24 of 30
layers (exit layers 1, 2, 3 and 24; 2 HumanEval prompts x 32 tokens) is recorded without layer
rollouts (``plain``), and they are added by two ``--resume`` runs (``layered``): what was there
must stay, the rollouts must be what each layer's early-exit draft does from its own wrong
token and past the path's end (decoded token by token), and with them the simulator must predict a
live DEL decode's drafted tokens exactly, which the teacher-forced stand-in does not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `simlab record` does (tests/test_record.py)
torch = pytest.importorskip("torch", reason="simlab record needs the models extra (torch)")
pytest.importorskip("transformers", reason="simlab record needs the models extra (transformers)")

from simlab.common.errors import SimlabError  # noqa: E402
from simlab.live.session import LiveSession  # noqa: E402
from simlab.live.setup import LiveConfig  # noqa: E402
from simlab.models import install  # noqa: E402
from simlab.models.early_exit import early_exit_draft  # noqa: E402
from simlab.record.recorder import RecordConfig, record  # noqa: E402
from simlab.sim.run import Simulator  # noqa: E402
from simlab.trace import read_trace  # noqa: E402
from simlab.trace.checks import validate  # noqa: E402
from tests.helpers import greedy_continuation, simlab_cmd  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, TOKENS, ROLLOUT = "humaneval:2", 32, 8
EXITS, DRAFT_LAYER = "1-3,24", 24
PROBE = "k=1-4;ctx=64;repeats=1"
DEL = {"d_max": ROLLOUT}  # a round reads at most d_max - 1 tokens past its first rejection: no overrun
KEYS = ["layer", "prompt_id", "pos", "step"]


def _config(out: Path, **kw) -> RecordConfig:
    return RecordConfig(target="smollm2", prompts=PROMPTS, out=out, max_new_tokens=TOKENS, exit_layers=EXITS,
                        draft_layer=DRAFT_LAYER, rollout=ROLLOUT, latency_probe=PROBE, progress=False, **kw)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    install("smollm2")
    out = tmp_path_factory.mktemp("layer-rollouts") / "plain"
    record(_config(out))
    return out


@pytest.fixture(scope="module")
def layered(plain, tmp_path_factory) -> Path:
    """``plain`` with the rollouts of exit layers 1 and 2 added by one --resume, and 3 by another."""
    out = tmp_path_factory.mktemp("layer-rollouts") / "layered"
    shutil.copytree(plain, out)
    first = record(_config(out, rollout_layers="1,2", resume=True))
    second = record(_config(out, rollout_layers="3", resume=True))
    assert (first.recorded, first.layer_rollouts, second.layer_rollouts) == (0, 4, 2)
    return out


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(install("smollm2")[0].path, dtype=torch.float32).eval()


def _sorted_rows(rollouts: pd.DataFrame) -> pd.DataFrame:
    return rollouts.sort_values(KEYS).reset_index(drop=True)


def test_resume_adds_the_layers_rollouts_and_keeps_the_rest(plain, layered, tmp_path):
    before, after = read_trace(plain), read_trace(layered)
    for name in ("positions", "layers", "latency"):
        assert after.table(name).equals(before.table(name)), name
    assert after.prompts["prompt_id"].equals(before.prompts["prompt_id"])
    draft = after.rollouts[after.rollouts["layer"] == -1].reset_index(drop=True)
    assert draft.equals(before.rollouts)
    assert sorted(set(after.rollouts["layer"])) == [-1, 1, 2, 3]
    assert after.manifest.rollout_layers == [1, 2, 3] and before.manifest.rollout_layers == []
    cost = after.manifest.extra["layer_rollouts"]
    assert {layer: c["prompts"] for layer, c in cost["layers"].items()} == {"1": 2, "2": 2, "3": 2}
    assert cost["forced_pass_seconds"] > 0 and all(c["seconds"] > 0 for c in cost["layers"].values())

    again = tmp_path / "again"
    shutil.copytree(layered, again)
    again_result = record(_config(again, resume=True))  # the manifest's layers are kept unasked; none is redone
    assert (again_result.recorded, again_result.layer_rollouts) == (0, 0)
    assert read_trace(again).rollouts.equals(after.rollouts)


@pytest.mark.parametrize("layer", [1, 3])
def test_a_layers_rollouts_are_its_early_exit_drafts_own_greedy_continuation(layered, model, layer):
    """After each of its divergences and past the path's end (the tail, from step 0)."""
    trace = read_trace(layered)
    draft = early_exit_draft(model, layer)
    checked = 0
    for pid in trace.prompts["prompt_id"]:
        prompt = [int(t) for t in trace.prompts.set_index("prompt_id").loc[pid, "prompt_token_ids"]]
        path = trace.positions[trace.positions.prompt_id == pid].sort_values("pos")["target_token"].tolist()
        exits = trace.layers[(trace.layers.prompt_id == pid) & (trace.layers.layer == layer)].sort_values("pos")
        diverged = exits[exits["token"].to_numpy() != np.asarray(path)]
        runs = trace.rollouts[(trace.rollouts.prompt_id == pid) & (trace.rollouts.layer == layer)]
        assert sorted(runs.pos.unique()) == [*sorted(diverged.pos), len(path)]
        starts = [(row.pos, 1, prompt + path[: row.pos] + [int(row.token)]) for row in diverged.head(3).itertuples()]
        for at, first, prefix in [*starts, (len(path), 0, prompt + path)]:
            tokens, confs = greedy_continuation(draft, prefix, ROLLOUT)
            got = runs[runs.pos == at].sort_values("step")
            assert got["step"].tolist() == list(range(first, first + ROLLOUT))
            assert got["token"].tolist() == tokens
            np.testing.assert_allclose(got["draft_conf"], confs, atol=1e-4)
            checked += 1
    assert checked > len(trace.prompts), "the layer never diverged"


def test_the_simulator_predicts_a_live_del_decode_with_layer_rollouts_exactly(plain, layered):
    session = LiveSession(LiveConfig(policy="del", params=DEL, target="smollm2", draft_layer=DRAFT_LAYER,
                                     prompts=PROMPTS, max_new_tokens=TOKENS, trace=layered, progress=False),
                          log=lambda _: None)
    session.load_trace()
    session.load_models()
    try:
        live = {}
        for pid, ids in session.ids.items():
            run = session.executor.run(session.make_policy("del", DEL), pid, ids, TOKENS)
            live[pid] = (run.counts.drafted, run.counts.target_calls, run.counts.num_drafts)
    finally:
        session.close()

    def predicted(trace_dir: Path) -> dict[int, tuple[int, int, int]]:
        sim = Simulator(read_trace(trace_dir)).run("del", DEL, with_cost=False).per_prompt
        return {int(r.prompt_id): (int(r.drafted), int(r.target_calls), int(r.num_drafts)) for r in sim.itertuples()}

    assert predicted(layered) == live
    # the teacher-forced stand-in of the trace without layer rollouts drafts other counts
    stand_in = predicted(plain)
    assert any(stand_in[pid][0] != live[pid][0] for pid in live), (stand_in, live)


def _other_hardware(trace_dir: Path) -> None:
    manifest = json.loads((trace_dir / "manifest.json").read_text())
    manifest["hardware"] = "Some Other CPU, 64 cores"
    (trace_dir / "manifest.json").write_text(json.dumps(manifest))


def test_a_killed_layer_recording_loads_and_resumes_to_the_same_rollouts(plain, layered, tmp_path):
    """Killed once a layer's rollouts are committed, on a trace from other hardware (adding
    layer rollouts measures no latency, so it is allowed there; recording prompts is not)."""
    out = tmp_path / "killed"
    shutil.copytree(plain, out)
    _other_hardware(out)
    with pytest.raises(SimlabError, match="hardware="):
        record(_config(out, resume=True))
    cmd = simlab_cmd("record", "--target", "smollm2", "--exit-layers", EXITS, "--draft-layer", DRAFT_LAYER,
                     "--rollout", ROLLOUT, "--prompts", PROMPTS, "--max-new-tokens", TOKENS, "--latency-probe", PROBE,
                     "--out", out, "--resume", "--rollout-layers", "1-3", "--quiet")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while "layer_rollouts" not in json.loads((out / "manifest.json").read_text())["extra"]:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no layer's rollouts were committed in time"
            time.sleep(0.05)
        proc.kill()
    finally:
        proc.wait()
    killed = read_trace(out)
    done = killed.rollouts[killed.rollouts["layer"] > 0]
    assert not done.empty and killed.manifest.rollout_layers != [1, 2, 3]
    record(_config(out, rollout_layers="1-3", resume=True))
    resumed = read_trace(out)
    pd.testing.assert_frame_equal(_sorted_rows(resumed.rollouts), _sorted_rows(read_trace(layered).rollouts))
    assert resumed.manifest.rollout_layers == [1, 2, 3] and resumed.manifest.hardware == "Some Other CPU, 64 cores"
    assert resumed.manifest.extra["layer_rollouts"]["computed_on"] == [read_trace(plain).manifest.hardware]


def test_a_trace_whose_manifest_lists_a_layer_needs_its_rollouts_at_every_divergence(layered):
    trace = read_trace(layered)
    rows = trace.rollouts
    trace.rollouts = rows[~((rows.layer == 3) & (rows.prompt_id == 1))]
    with pytest.raises(SimlabError, match="exit layer 3 has no rollout at prompt 1, position"):
        validate(trace)
    trace.manifest.rollout_layers = [1, 2]  # as a recording interrupted while adding layer 3 leaves it
    validate(trace)
    trace.rollouts = rows.assign(layer=rows.layer.where(rows.layer != 3, DRAFT_LAYER))
    with pytest.raises(SimlabError, match=r"rollouts of exit layers \[24\], which are not among"):
        validate(trace)

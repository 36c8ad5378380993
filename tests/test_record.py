"""`simlab record` on a real model, SmolLM2-135M: the trace is what the models really do.

Two small recordings are shared by the tests (2 HumanEval prompts x 16 tokens each):

- ``selfspec``: greedy, no draft model; the draft is SmolLM2's own first 24 of 30 layers
  (exit layers 22..29 recorded), which disagrees with the full model often enough to give
  many divergences and rollouts;
- ``sampled``: SmolLM2 drafts for itself at temperature 0.8, so the target's sampled path
  leaves the draft's greedy path now and then: a separate draft model with divergences.

Every check compares against transformers doing the obvious slow thing (``generate``, or
decoding token by token with a KV cache).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

# As `simlab record` does (simlab/cli/record.py): on a shared CPU, spinning OpenMP threads slow
# every forward tenfold. Effective only if torch is not loaded yet.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
torch = pytest.importorskip("torch", reason="simlab record needs the models extra (torch)")
pytest.importorskip("transformers", reason="simlab record needs the models extra (transformers)")

from simlab.common.errors import SimlabError  # noqa: E402
from simlab.latency import TableLatency  # noqa: E402
from simlab.models import install  # noqa: E402
from simlab.models.kv_cache import cache_kwargs, cache_of  # noqa: E402
from simlab.record import recorder  # noqa: E402
from simlab.record.forward import truncated  # noqa: E402
from simlab.record.recorder import RecordConfig, record  # noqa: E402
from simlab.record.signals import greedy_stats  # noqa: E402
from simlab.trace import read_trace  # noqa: E402
from tests.helpers import greedy_continuation, kill_moments, run_killed, with_hardware  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 16
PROBE = "k=1,2;ctx=32;repeats=1;batch=1,2;batch_k=1,2"
SELFSPEC = {"target": "smollm2", "exit_layers": "22-29", "draft_layer": 24, "rollout": 4}


def _config(out: Path, **kw) -> RecordConfig:
    base = {"prompts": "humaneval:2", "max_new_tokens": TOKENS, "latency_probe": PROBE, "progress": False}
    return RecordConfig(out=out, **{**base, **kw})


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return install("smollm2")[0].path


@pytest.fixture(scope="module")
def model(smollm2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def selfspec(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "selfspec"
    record(_config(out, **SELFSPEC))
    return read_trace(out)


@pytest.fixture(scope="module")
def sampled(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "sampled"
    record(_config(out, target="smollm2", draft="smollm2", temperature=0.8, rollout=4))
    return read_trace(out)


def _prompt(trace, pid: int) -> tuple[list[int], list[int]]:
    row = trace.prompts.set_index("prompt_id").loc[pid]
    path = trace.positions[trace.positions.prompt_id == pid].sort_values("pos")["target_token"].tolist()
    return list(row["prompt_token_ids"]), path


@torch.inference_mode()
def _incremental_logits(model, prompt: list[int], path: list[int]) -> torch.Tensor:
    """Next-token logits at each position of ``path``, decoding one token at a time."""
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    cache, rows = cache_of(out), [out.logits[0, -1]]
    for token in path[:-1]:
        out = model(input_ids=torch.tensor([[token]]), **cache_kwargs(model, cache), use_cache=True)
        rows.append(out.logits[0, -1])
    return torch.stack(rows)


def test_target_tokens_are_what_generate_produces_greedily(selfspec, model):
    for pid in selfspec.prompts.prompt_id:
        prompt, path = _prompt(selfspec, pid)
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=TOKENS)
        assert out[0, len(prompt) :].tolist() == path


def test_teacher_forced_draft_signals_equal_incremental_decoding(sampled, model):
    temperature = sampled.manifest.temperature
    for pid in sampled.prompts.prompt_id:
        prompt, path = _prompt(sampled, pid)
        pos = sampled.positions[sampled.positions.prompt_id == pid].sort_values("pos")
        logits = _incremental_logits(model, prompt, path)
        stats = greedy_stats(logits)
        q = torch.softmax(logits / temperature, dim=-1)[torch.arange(len(path)), torch.tensor(path)].numpy()
        assert stats.token.tolist() == pos["draft_token"].tolist()
        np.testing.assert_allclose(pos["draft_conf"], stats.conf, atol=1e-4)
        np.testing.assert_allclose(pos["draft_entropy"], stats.entropy, atol=1e-3)
        np.testing.assert_allclose(pos["q_target"], q, atol=1e-4)
        np.testing.assert_allclose(pos["p_target"], q, atol=1e-4)  # the target is the same model


def test_early_exit_signals_equal_incremental_decoding_of_the_cut_model(selfspec, model):
    layers = selfspec.layers
    assert sorted(layers.layer.unique()) == list(range(22, 30))
    for pid in selfspec.prompts.prompt_id:
        prompt, path = _prompt(selfspec, pid)
        for layer in (22, 24, 29):
            with truncated(model, layer):
                stats = greedy_stats(_incremental_logits(model, prompt, path))
            rows = layers[(layers.prompt_id == pid) & (layers.layer == layer)].sort_values("pos")
            assert rows["token"].tolist() == stats.token.tolist()
            np.testing.assert_allclose(rows["draft_conf"], stats.conf, atol=1e-4)
            np.testing.assert_allclose(rows["draft_entropy"], stats.entropy, atol=1e-3)
        draft = selfspec.positions[selfspec.positions.prompt_id == pid].sort_values("pos")
        at24 = layers[(layers.prompt_id == pid) & (layers.layer == 24)].sort_values("pos")
        assert draft["draft_token"].tolist() == at24["token"].tolist()


@pytest.mark.parametrize("name", ["selfspec", "sampled"])
def test_rollouts_are_the_drafts_own_greedy_continuation(name, request, model):
    """After a divergence at d, step s is the draft at d + s given its own wrong token; the tail
    (pos = n, from step 0) is the draft past the whole path's end."""
    trace = request.getfixturevalue(name)
    steps = trace.manifest.rollout_len
    checked = 0
    for pid in trace.prompts.prompt_id:
        prompt, path = _prompt(trace, pid)
        pos = trace.positions[trace.positions.prompt_id == pid].sort_values("pos")
        diverged = pos[pos.draft_token != pos.target_token]
        runs = trace.rollouts[trace.rollouts.prompt_id == pid]
        assert sorted(runs.pos.unique()) == [*sorted(diverged.pos), len(path)]
        starts = [(row.pos, 1, prompt + path[: row.pos] + [int(row.draft_token)]) for row in diverged.head(3).itertuples()]
        for at, first, prefix in [*starts, (len(path), 0, prompt + path)]:
            cut = truncated(model, trace.manifest.draft_layer) if name == "selfspec" else _no_cut()
            with cut:
                tokens, confs = greedy_continuation(model, prefix, steps)
            got = runs[runs.pos == at].sort_values("step")
            assert got["step"].tolist() == list(range(first, first + steps))
            assert got["token"].tolist() == tokens
            np.testing.assert_allclose(got["draft_conf"], confs, atol=1e-4)
            checked += 1
    assert checked > len(trace.prompts), "the recording had no divergence to check"


@pytest.mark.parametrize("name", ["selfspec", "sampled"])
def test_resume_records_again_the_rollouts_of_prompts_recorded_before_tails(name, request, tmp_path):
    """A trace whose rollouts lack the tail (recorded before it) gets them all again, the same as
    a new recording's, and keeps everything else."""
    import dataclasses
    import shutil

    from simlab.trace.io import update_trace

    trace = request.getfixturevalue(name)
    out = tmp_path / "t"
    shutil.copytree(trace.path, out)
    rollouts = trace.rollouts
    old = rollouts[(rollouts.step > 0) & (rollouts.prompt_id == 0)]  # prompt 1 keeps its tail: left alone
    update_trace(dataclasses.replace(trace, rollouts=pd.concat([old, rollouts[rollouts.prompt_id != 0]])), out)
    kw = SELFSPEC if name == "selfspec" else {"target": "smollm2", "draft": "smollm2", "temperature": 0.8, "rollout": 4}
    record(_config(out, **kw, resume=True))
    after = read_trace(out)
    key = ["prompt_id", "layer", "pos", "step"]
    pd.testing.assert_frame_equal(after.rollouts.sort_values(key).reset_index(drop=True),
                                  rollouts.sort_values(key).reset_index(drop=True), check_dtype=False)
    assert after.manifest.extra["rollouts_rerecorded"]["prompts"] == 1
    assert after.positions.equals(trace.positions) and after.latency.equals(trace.latency)


def test_a_reprobe_that_keeps_the_rollouts_changes_only_the_latencies(selfspec, tmp_path):
    """`simlab record --resume --reprobe --keep-rollouts` (what `simlab live --reprobe` runs): a
    trace whose prompt 0 lacks its tail keeps its rollouts as they are (prompts_before_tails names
    that prompt, before and after), latencies measured again; a new rollout length cannot be kept so."""
    import dataclasses
    import shutil

    from simlab.cli import main
    from simlab.record.recorder import prompts_before_tails
    from simlab.trace.io import update_trace

    out = tmp_path / "t"
    shutil.copytree(selfspec.path, out)
    rollouts = selfspec.rollouts
    stripped = pd.concat([rollouts[(rollouts.step > 0) & (rollouts.prompt_id == 0)], rollouts[rollouts.prompt_id != 0]])
    update_trace(dataclasses.replace(selfspec, rollouts=stripped), out)
    assert prompts_before_tails(selfspec) == [] and prompts_before_tails(read_trace(out)) == [0]
    main(["record", "--target", "smollm2", "--exit-layers", "22-29", "--draft-layer", "24", "--rollout", "4",
          "--prompts", "humaneval:2", "--max-new-tokens", str(TOKENS), "--latency-probe", PROBE, "--out", str(out),
          "--resume", "--reprobe", "--keep-rollouts", "--quiet"])
    after = read_trace(out)
    key = ["prompt_id", "layer", "pos", "step"]
    pd.testing.assert_frame_equal(after.rollouts.sort_values(key).reset_index(drop=True),
                                  stripped.sort_values(key).reset_index(drop=True), check_dtype=False)
    assert prompts_before_tails(after) == [0] and "rollouts_rerecorded" not in after.manifest.extra
    assert after.positions.equals(selfspec.positions) and not after.latency.equals(selfspec.latency)
    with pytest.raises(SimlabError, match="cannot keep"):
        record(_config(out, **{**SELFSPEC, "rollout": 6}, resume=True, rollouts_again=False))


def test_resume_with_another_rollout_length_records_every_prompts_rollouts_again_at_it(selfspec, tmp_path):
    """--rollout 6 on a trace of 4: each rollout grows by two steps, its first four unchanged."""
    import shutil

    out = tmp_path / "t"
    shutil.copytree(selfspec.path, out)
    result = record(_config(out, **{**SELFSPEC, "rollout": 6}, resume=True))
    after = read_trace(out)
    assert result.recorded == 0 and after.manifest.rollout_len == 6
    assert after.manifest.extra["rollout_len_before"] == 4
    assert after.manifest.extra["rollouts_rerecorded"]["prompts"] == len(selfspec.prompts)
    steps = after.rollouts.groupby(["prompt_id", "pos"])["step"].agg(["min", "max"])
    assert set(map(tuple, steps.to_numpy().tolist())) == {(1, 6), (0, 5)}
    key = ["prompt_id", "pos", "step"]
    longer = after.rollouts.merge(selfspec.rollouts[key], on=key)  # the steps the shorter rollouts have
    pd.testing.assert_frame_equal(longer.sort_values(key).reset_index(drop=True)[["token"]],
                                  selfspec.rollouts.sort_values(key).reset_index(drop=True)[["token"]])
    again = record(_config(out, **{**SELFSPEC, "rollout": None}, resume=True))  # the trace's length: nothing to redo
    assert again.recorded == 0 and read_trace(out).manifest.extra["rollouts_rerecorded"]["prompts"] == len(
        selfspec.prompts)


def _no_cut():
    from contextlib import nullcontext

    return nullcontext()


def test_trace_manifest_and_latency_samples(selfspec, sampled):
    m = sampled.manifest
    assert (m.kind, m.target_model, m.draft_model, m.dataset) == ("recorded", "smollm2", "smollm2", "humaneval:2")
    assert m.hardware.endswith(f"{os.cpu_count()} cores") and m.device == "cpu" and m.dtype == "float32"
    assert m.eos_token_ids == [2] and m.max_new_tokens == TOKENS and m.rollout_len == 4
    assert {"torch", "transformers"} <= set(m.libraries) and m.created
    assert m.extra["chat_template"] and 0 <= m.extra["agreement"] <= 1
    assert m.extra["cost"]["ratio_with_rollouts"] >= m.extra["cost"]["ratio_without_rollouts"] > 1
    lat = sampled.latency
    assert set(lat.op) == {"draft_step", "target_forward"} and set(lat.corun) == {False, True}
    assert sorted(lat[lat.op == "target_forward"].k.unique()) == [1, 2]
    assert TableLatency.from_samples(lat).has_corun

    pairs = lat[lat.batch == 2]  # the batch axis: two sequences per forward, solo and co-running
    assert sorted(pairs[pairs.op == "target_forward"].k.unique()) == [1, 2] and set(pairs.corun) == {False, True}
    assert set(TableLatency.from_samples(lat).batches) == {2}

    s = selfspec.manifest
    assert (s.draft_model, s.draft_layer, s.n_layers, s.exit_layers) == ("smollm2[:24]", 24, 30, list(range(22, 30)))
    steps = selfspec.latency[selfspec.latency.op == "draft_step"]
    assert sorted(steps.layer.unique()) == list(range(22, 30))
    # co-running: the drafting exit layer beside the target (as live parallel rounds run them), no other layer
    corun = selfspec.latency[selfspec.latency.corun]
    assert set(corun[corun.op == "draft_step"].layer) == {24} and set(corun.batch) == {1}
    assert sorted(corun[corun.op == "target_forward"].k.unique()) == [1, 2]
    assert (24, True) in TableLatency.from_samples(selfspec.latency).draft  # priced from its own samples
    assert set(steps[steps.batch == 2].layer) == {24}  # batched draft steps: the drafting exit layer


def test_a_self_speculative_probe_times_the_exit_head_its_shadow_tokens_run(selfspec, sampled, model):
    """With exit layers the probe times, by default, the exit head (final norm, LM head, top-1)
    over k = 1-9, 17, 32 rows, once per repeat, at context 0 (it reads no cache); a pair without
    exit layers has no shadow tokens, and no such samples."""
    from simlab.record.forward import exit_logits, shadow_tokens
    from simlab.record.latency import ProbePlan, probe_latency

    heads = selfspec.latency[selfspec.latency.op == "exit_head"]
    assert sorted(heads.k) == [*range(1, 10), 17, 32]
    assert set(heads.context_len) == {0} and set(heads.layer) == {-1} and set(heads.batch) == {1}
    assert not heads.corun.any()
    assert selfspec.manifest.extra["latency_probe"]["exit_heads"] == [*range(1, 10), 17, 32]
    assert "exit_head" not in set(sampled.latency.op)
    assert 0 < TableLatency.from_samples(selfspec.latency, draft_layer=24).exit_head(12) < 1
    # what is timed is what a shadow read runs: exit layer 22's tokens through the shared function
    with torch.inference_mode():
        hidden = model(input_ids=torch.tensor([[1, 2, 3, 4]]), output_hidden_states=True).hidden_states
        top, tokens = shadow_tokens(model, hidden[22][0])
        assert torch.equal(tokens, exit_logits(model, tuple(h[0] for h in hidden), 22).argmax(-1))
    assert ProbePlan.parse("").exit_heads == () and ProbePlan.parse("exit_head=none", exits=True).exit_heads == ()
    assert ProbePlan.parse("batch=2,4", exits=True).exit_heads == ()  # a batch-axis re-probe keeps them
    with pytest.raises(SimlabError, match="batch=1"):
        ProbePlan.parse("batch=2;exit_head=3")
    with pytest.raises(SimlabError, match="exit-head axis"):
        probe_latency(model, model, [], ProbePlan.parse("k=1;ctx=8;repeats=1;exit_head=2"), model.config.vocab_size)


def test_a_batch_axis_reprobe_keeps_the_single_sequence_samples(selfspec, tmp_path):
    """``--resume --reprobe`` with a probe that leaves batch 1 out measures only the batch axis."""
    import shutil

    out = tmp_path / "t"
    shutil.copytree(selfspec.path, out)
    record(_config(out, **SELFSPEC, resume=True, reprobe=True, latency_probe="batch=4;batch_k=3;ctx=32;repeats=1"))
    after = read_trace(out)
    pd.testing.assert_frame_equal(after.latency[after.latency.batch < 4].reset_index(drop=True),
                                  selfspec.latency[selfspec.latency.batch < 4].reset_index(drop=True), check_dtype=False)
    new = after.latency[after.latency.batch == 4]
    assert sorted(zip(new.op, new.k)) == [("draft_step", 1), ("target_forward", 3)]
    assert after.manifest.extra["batch_probe"]["batches"] == [4]
    assert after.manifest.extra["latency_probe"] == selfspec.manifest.extra["latency_probe"]
    assert after.positions.equals(selfspec.positions)


def test_a_trace_from_other_hardware_is_reprobed_here_and_says_where_its_tokens_came_from(selfspec, tmp_path):
    """``--resume`` refuses a trace of other hardware; ``--resume --reprobe`` measures its latencies
    here (what ``simlab live`` does with a shipped trace) and keeps every recorded position."""
    out = with_hardware(selfspec.path, tmp_path / "t", "Some Other CPU, 64 cores")
    with pytest.raises(SimlabError, match="hardware="):
        record(_config(out, **SELFSPEC, resume=True))
    with pytest.raises(SimlabError, match="put batch=1 among"):  # the kept batch-1 series would be the other CPU's
        record(_config(out, **SELFSPEC, resume=True, reprobe=True, latency_probe="k=1;ctx=32;repeats=1;batch=2;batch_k=1"))
    record(_config(out, **SELFSPEC, resume=True, reprobe=True, latency_probe="k=1;ctx=32;repeats=1;batch=1;batch_k=1"))
    after = read_trace(out)
    assert after.manifest.hardware == selfspec.manifest.hardware  # this machine's name
    assert after.manifest.extra["tokens_recorded_on"] == "Some Other CPU, 64 cores"
    assert after.positions.equals(selfspec.positions)
    assert sorted(after.latency[after.latency.op == "target_forward"].k.unique()) == [1]  # the new probe's


def test_a_new_trace_needs_the_single_sequence_probe(smollm2, tmp_path):
    with pytest.raises(SimlabError, match="batch=1"):
        record(_config(tmp_path / "t", **SELFSPEC, latency_probe="batch=2"))


def test_different_vocabularies_are_refused_before_any_model_runs(smollm2, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    other = tmp_path / "other-vocab"
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    tokenizer.add_tokens(["<simlab-extra-token>"])
    tokenizer.save_pretrained(other)
    for name in ("config.json", "model.safetensors"):
        (other / name).symlink_to(smollm2 / name)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the vocabularies were compared")

    monkeypatch.setattr(recorder, "load_model", no_model)
    with pytest.raises(SimlabError, match="different vocabularies"):
        record(_config(tmp_path / "t", target="smollm2", draft=str(other)))


@pytest.mark.parametrize("kill", ["after the first prompt", *kill_moments(seed=15, n=1, low=2.0, high=25.0)])
def test_killed_recording_loads_and_resumes(smollm2, selfspec, tmp_path, kill):
    """SIGKILL once a prompt is committed, or at a random moment (loading, probing, mid-commit):
    what is left loads whole (or is not there), and --resume finishes the same trace."""
    out = tmp_path / "killed"
    args = ["--target", "smollm2", "--exit-layers", "22-29", "--draft-layer", "24", "--rollout", "4"]
    cmd = [sys.executable, "-m", "simlab", "record", *args, "--prompts", "humaneval:4",
           "--max-new-tokens", str(TOKENS), "--latency-probe", PROBE, "--out", str(out), "--quiet"]  # fmt: skip
    if isinstance(kill, float):
        run_killed(cmd, kill)
    else:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 300
            while not _has_prompts(out):
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "the recording committed no prompt in time"
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
    killed = read_trace(out, allow_empty=True) if out.exists() else None
    done = killed.n_prompts if killed else 0
    if not isinstance(kill, float):
        assert 1 <= done < 4
    if killed is not None:
        with pytest.raises(SimlabError, match="pass --resume"):
            record(_config(out, **SELFSPEC, prompts="humaneval:4"))
        with pytest.raises(SimlabError, match="rollout_len=4, this run has 0"):
            record(_config(out, **{**SELFSPEC, "rollout": 0}, prompts="humaneval:4", resume=True))
    result = record(_config(out, **SELFSPEC, prompts="humaneval:4", resume=True))
    assert (result.recorded, result.total) == (4 - done, 4)

    resumed = read_trace(out)
    if killed is not None:
        assert resumed.latency.equals(killed.latency)
    for pid in selfspec.prompts.prompt_id:
        assert _prompt(resumed, pid) == _prompt(selfspec, pid)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def _has_prompts(out: Path) -> bool:
    try:
        return read_trace(out).n_prompts > 0
    except SimlabError:
        return False


def test_probe_times_the_forward_a_verification_runs(smollm2):
    """A k-token probe forward computes the logits of all k positions, as verifying reads them,
    and leaves the KV cache at its context length for the next call."""
    from simlab.models.load import load_model, resolve
    from simlab.record.latency import _Stepper

    model = load_model(resolve("smollm2"), "cpu", "float32")
    with torch.inference_mode():
        stepper = _Stepper(model, 20, model.config.vocab_size, torch.Generator().manual_seed(0))
        for k in (1, 5):
            assert stepper(k).shape[:2] == (1, k)
            assert stepper.cache.get_seq_length() == 20


def _path(parents, node: int) -> list[int]:
    """``node`` and its ancestors, root side first."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def test_the_probe_times_tree_forwards_under_the_live_decoders_mask(smollm2):
    """The tree axis times what tree decoding runs: the target's verification of k tokens and the
    draft's expansion of k nodes, each under the mask and position ids the live decoder builds.
    Every row of such a forward is the logits of a plain forward over that node's own path (the
    mask is applied: siblings fed beside it are not seen), and the cache is back at its context
    length after each call."""
    from simlab.models.load import load_model, resolve
    from simlab.record.latency import _expansion, _Stepper, probe_tree
    from simlab.trees.attention import verify_inputs

    model = load_model(resolve("smollm2"), "cpu", "float32")
    ctx, k, vocab = 12, 6, model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    again = torch.Generator().set_state(gen.get_state())  # draws the stepper's random tokens again
    parents, depths = probe_tree(k - 1)
    assert (parents, depths) == ((-1, -1, 0, 0, 1), (1, 1, 2, 2, 2))

    def plain(ids: list[int]) -> torch.Tensor:
        return model(input_ids=torch.tensor([ids])).logits[0, -1]

    with torch.inference_mode():
        stepper = _Stepper(model, ctx, vocab, gen)
        prompt = torch.randint(0, vocab, (1, ctx), generator=again)[0].tolist()
        logits = stepper(k, verify_inputs(ctx, 1, parents, depths, torch.float32, "cpu"))[0]
        fed = torch.randint(0, vocab, (1, k), generator=again)[0].tolist()
        assert logits.shape[0] == k and stepper.cache.get_seq_length() == ctx
        assert torch.allclose(logits[0], plain(prompt + fed[:1]), atol=1e-4)
        for node in range(k - 1):
            path = [fed[1 + n] for n in _path(parents, node)]
            assert torch.allclose(logits[1 + node], plain(prompt + fed[:1] + path), atol=1e-4), node
        logits = stepper(k, _expansion(k, ctx, torch.float32, "cpu"))[0]  # k children of the committed prefix
        fed = torch.randint(0, vocab, (1, k), generator=again)[0].tolist()
        assert stepper.cache.get_seq_length() == ctx
        for j in range(k):
            assert torch.allclose(logits[j], plain(prompt + fed[j:j + 1]), atol=1e-4), j


def test_the_probes_tree_axis_is_recorded_per_drafter_solo_and_co_running(smollm2):
    """``tree=3``: rows of op target_tree (the target) and draft_tree (the drafter: a draft model,
    co-running too, or the drafting exit layer of a self-speculative pair) at k = 3; the axis is
    the default where the recording stores trees, and needs the single-sequence series."""
    from simlab.models.load import load_model, resolve
    from simlab.record.latency import ProbePlan, probe_latency

    assert ProbePlan.parse("").trees == () and ProbePlan.parse("tree=none", trees=True).trees == ()
    assert ProbePlan.parse("", trees=True).trees == (1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 32, 64)
    assert ProbePlan.parse("batch=2,4", trees=True).trees == ()  # a batch-axis re-probe leaves trees alone
    with pytest.raises(SimlabError, match="batch=1"):
        ProbePlan.parse("batch=2;tree=4")
    model = load_model(resolve("smollm2"), "cpu", "float32")
    plan = ProbePlan.parse("k=3;ctx=12;repeats=1;batch=1;tree=3")
    selfspec = probe_latency(model, None, [24], plan, model.config.vocab_size, draft_layer=24)
    assert sorted(zip(selfspec.op, selfspec.k, selfspec.layer, selfspec.corun)) == [
        ("draft_step", 1, 24, False), ("draft_step", 1, 24, True), ("draft_tree", 3, 24, False),
        ("target_forward", 3, -1, False), ("target_forward", 3, -1, True), ("target_tree", 3, -1, False)]
    pair = probe_latency(model, model, [], plan, model.config.vocab_size)
    trees = pair[pair.op.isin(["target_tree", "draft_tree"])]
    assert sorted(zip(trees.op, trees.layer, trees.corun)) == [
        ("draft_tree", -1, False), ("draft_tree", -1, True), ("target_tree", -1, False), ("target_tree", -1, True)]
    with pytest.raises(SimlabError, match="tree expansions need"):
        probe_latency(model, None, [], plan, model.config.vocab_size)

"""The live batched decoder on SmolLM2 (self-speculative, exit layer 24, as the shipped trace):
every request of a batch decodes exactly what it would alone, and makes the target calls the
serving simulator predicts for it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="live decoding needs the models extra (torch)")
pytest.importorskip("transformers", reason="live decoding needs the models extra (transformers)")

from simlab.cli import main  # noqa: E402
from simlab.common.locations import ROOT  # noqa: E402
from simlab.live.batched import BatchedDecoder  # noqa: E402
from simlab.live.executor import LiveExecutor  # noqa: E402
from simlab.live.padded_cache import PaddedCache  # noqa: E402
from simlab.live.serve import check, reprobe  # noqa: E402
from simlab.models.early_exit import early_exit_draft  # noqa: E402
from simlab.models.load import load_model, resolve  # noqa: E402
from simlab.policies import make_policy  # noqa: E402
from simlab.sim.run import Simulator  # noqa: E402
from simlab.trace.io import read_trace  # noqa: E402
from tests.helpers import with_hardware  # noqa: E402

pytestmark = pytest.mark.slow

TRACE = ROOT / "traces" / "smollm2-selfspec"
TOKENS = 10


@pytest.fixture(scope="module")
def executor():
    target = load_model(resolve("smollm2"), "cpu", "float32")
    return LiveExecutor(early_exit_draft(target, 24), target, [2])


@pytest.fixture(scope="module")
def trace():
    return read_trace(TRACE)


def test_padded_rows_compute_what_each_sequence_computes_alone(executor):
    model = executor.target_model
    prompts = [list(range(100, 100 + n)) for n in (17, 9, 4)]
    cache, _ = PaddedCache.prefill(model, prompts)
    feeds = [[5, 6, 7], [8], []]
    logits = cache.feed(feeds)
    cache.keep([18, 10, 4])  # row 0 drops two of its three new tokens; row 2 fed nothing
    assert cache.n == [18, 10, 4] and cache.mask.shape[1] == 18
    after = cache.feed([[11], [12, 13], [14]])
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            if feeds[i]:
                alone = model(input_ids=torch.tensor([prompt + feeds[i]])).logits[0, len(prompt):]
                assert torch.allclose(logits[i], alone, atol=1e-3)
        for i, (prompt, kept, new) in enumerate(zip(prompts, ([5], [8], []), ([11], [12, 13], [14]))):
            alone = model(input_ids=torch.tensor([prompt + kept + new])).logits[0, -len(new):]
            assert torch.allclose(after[i], alone, atol=1e-3)
    cache.select([2, 0])
    assert cache.n == [5, 19] and cache.mask.shape[1] == 19


@pytest.mark.parametrize("batch", [2, 4])
def test_each_request_of_a_batch_decodes_its_single_request_generate(executor, trace, batch):
    """Prompts of different lengths (the trace's: 134 to 179 tokens), greedy SD with gamma 4."""
    rows = trace.prompts.sort_values("prompt_id").head(batch)
    prompts = [(int(p.prompt_id), list(p.prompt_token_ids)) for p in rows.itertuples()]
    assert len({len(ids) for _, ids in prompts}) == batch
    ctx = Simulator(trace).context()
    run = BatchedDecoder(executor).run([make_policy("sd", ctx, gamma=4) for _ in prompts], prompts, TOKENS)
    with torch.inference_mode():
        for (pid, ids), request in zip(prompts, run.requests):
            want = executor.target_model.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False)
            assert request.tokens == want[0, len(ids):].tolist()
            assert request.counts.target_calls < TOKENS  # drafts were accepted: this was speculation


def test_plain_decoding_of_a_batch_runs_no_draft_forward_not_even_a_prefill(executor, trace):
    """``ad`` draws no draft: the serving simulator prices its prefill as the target's alone."""
    prompts = [(int(p.prompt_id), list(p.prompt_token_ids)) for p in trace.prompts.head(2).itertuples()]
    drafts = []
    hook = executor.draft_model.register_forward_hook(lambda *_: drafts.append(1))
    try:
        run = BatchedDecoder(executor).run([make_policy("ad", Simulator(trace).context()) for _ in prompts],
                                           prompts, TOKENS)
    finally:
        hook.remove()
    assert drafts == []
    assert [r.counts.target_calls for r in run.requests] == [TOKENS - 1] * 2
    with torch.inference_mode():
        for (_, ids), request in zip(prompts, run.requests):
            want = executor.target_model.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False)
            assert request.tokens == want[0, len(ids):].tolist()


def test_target_calls_per_request_equal_the_serving_simulators(executor, trace):
    """...after an uncounted warm-up decode of the batch: the log's first line, with forwards of the
    target before it; the frame holds the measured decodes only."""
    forwards, lines = [], []
    hook = executor.target_model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        frame = check(trace, executor, "sd", {"gamma": 3}, batch=3, budget=TOKENS, repeats=1,
                      log=lambda line: lines.append((line, len(forwards))))
    finally:
        hook.remove()
    assert lines[0][0].startswith("B=3 warm-up (not counted): sd") and lines[0][1] > 0
    assert [line.split(":")[0] for line, _ in lines[1:]] == ["B=3 sd #1", "B=3 ad #1"]
    assert list(frame.policy) == ["sd", "ad"]
    assert frame.lossless.all() and frame.target_calls_equal.all()
    assert frame.set_index("policy").target_calls["ad"] == 3 * (TOKENS - 1)


def test_serve_live_refuses_arrivals_in_one_line(tmp_path, capsys):
    times = tmp_path / "t.txt"
    times.write_text("0\n")
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--live", "--arrivals", str(times), "--trace", str(TRACE)])
    assert exc.value.code == 2 and "--arrivals" in capsys.readouterr().err


def test_serve_live_waits_like_the_latency_probe_it_is_compared_with(monkeypatch, capsys):
    """``record``'s probe runs with OpenMP threads waiting passively; a decode that lets them spin
    is another program (simlab/common/openmp.py), so ``serve --live`` sets the same policy first."""
    import os

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with pytest.raises(SystemExit):
        main(["serve", "--live", "--repeats", "0", "--trace", str(TRACE)])
    assert "--repeats" in capsys.readouterr().err
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


@pytest.mark.parametrize("elsewhere", [True, False])
def test_serve_live_says_when_its_prediction_is_priced_on_other_hardware(tmp_path, capsys, elsewhere):
    from simlab.record.machine import hardware_name

    copy = with_hardware(TRACE, tmp_path / "t", "Some Other CPU, 64 cores" if elsewhere else hardware_name("cpu"))
    main(["serve", "--live", "--trace", str(copy), "--max-batch", "1", "--live-tokens", "2"])
    err = capsys.readouterr().err
    assert ("measured on Some Other CPU, 64 cores" in err) == elsewhere
    assert ("re-probe a copy" in err) == elsewhere


@pytest.mark.parametrize("batch", [1, 3])
def test_reprobe_times_the_forwards_of_the_batch_it_is_asked_for(executor, trace, batch):
    """The target over each k of the spec and the exit-layer draft's step, at that batch size and
    context, once per repeat; nothing else (no co-running, trees or exit heads)."""
    samples, other = reprobe(trace, executor, batch, "k=1,3;ctx=40;repeats=2")
    points = sorted(samples[["op", "k", "layer", "batch", "context_len"]].itertuples(index=False, name=None))
    want = [("draft_step", 1, 24, batch, 40), ("target_forward", 1, -1, batch, 40), ("target_forward", 3, -1, batch, 40)]
    assert points == sorted(want * 2)
    assert (samples.seconds > 0).all() and not samples.corun.any()
    assert other is None or 0 <= other <= 1


def test_serve_live_reprobe_refuses_bad_input_before_loading_models(capsys):
    for args, said in ((["--live", "--reprobe", "k=0"], "k, ctx"), (["--reprobe", "k=1-5"], "add --live"),
                       (["--live", "--reprobe", "k=1-5", "--latency", str(TRACE / "manifest.json")], "drop --latency")):
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--trace", str(TRACE), *args])
        assert exc.value.code == 2 and said in capsys.readouterr().err

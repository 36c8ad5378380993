"""vLLM itself, predicted by simlab: a real SmolLM2 self-speculative decode, counted step by step.

Needs vLLM's environment (``simlab vllm install``, which .ci/run runs: about 3 minutes once, cached
under $SIMLAB_CACHE/engines) and SmolLM2. Records a small trace with vLLM (two prompts, 24 tokens,
the path run 8 tokens past each end), then predicts ``simlab vllm run`` with K = 3 and runs it, each
prompt alone and both at once: every request's per-step drafted and accepted counts and vLLM's own
counters must be the prediction's, including each request's last step, which drafts past
``max_tokens`` and counts what it accepts there. The run is interrupted once (Ctrl-C after its first
batch) and resumed. vLLM's ``ngram`` proposer on the same prompts: its counts, step by step, are
the ``ngram`` policy's with ``vllm_end``; its ``suffix`` proposer likewise (``simlab vllm install
--with suffix``, which .ci/run runs too). ``vllm serve`` under a burst: its /metrics counters are
the prediction's, and a server killed mid-run keeps what was measured. A model vLLM cannot load is refused in one line.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import pandas as pd
import pytest

pytest.importorskip("transformers", reason="the trace's signals need the models extra")

from simlab.cli import main  # noqa: E402
from simlab.common.errors import SimlabError  # noqa: E402
from simlab.engines.vllm.install import locate, suffix_path  # noqa: E402
from simlab.models import install  # noqa: E402
from simlab.sim.run import Simulator  # noqa: E402
from simlab.trace.io import read_trace  # noqa: E402
from tests.helpers import simlab_cmd  # noqa: E402
from tests.test_bad_inputs import run_cli  # noqa: E402

pytestmark = pytest.mark.slow

try:
    locate()
    MISSING = None
except SimlabError as exc:
    MISSING = str(exc)
if MISSING:
    pytestmark = [pytestmark, pytest.mark.skip(reason=MISSING)]

K, TOKENS = 3, 24


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    install("smollm2")
    out = tmp_path_factory.mktemp("vllm") / "trace"
    main(["vllm", "record", "--out", str(out), "--prompts", "humaneval:2", "--max-new-tokens", str(TOKENS),
          "--k", str(K), "--batch", "1,2", "--probe-steps", "3", "--rollout", "4", "--quiet"])
    return out


def test_the_trace_holds_the_path_past_each_end_and_vllms_steps(trace):
    t = read_trace(trace)
    assert t.manifest.extra["engine"] == "vllm"
    assert t.past_end.groupby("prompt_id")["pos"].count().tolist() == [8, 8]
    assert (t.positions["draft_token"] == t.positions["target_token"]).all()  # SmolLM2 drafting for itself
    ops = set(t.latency["op"])
    assert {"draft_step", "target_forward", "target_step"} <= ops
    assert set(t.latency.loc[t.latency["op"] == "target_forward", "k"]) == {K + 1}
    assert {1, 2} <= set(t.latency["batch"])


def test_resuming_a_finished_recording_keeps_what_it_measured(trace):
    # every job's results come from disk: nothing is measured again, so nothing measured is replaced
    before = read_trace(trace).manifest
    main(["vllm", "record", "--out", str(trace), "--prompts", "humaneval:2", "--max-new-tokens", str(TOKENS),
          "--k", str(K), "--batch", "1,2", "--probe-steps", "3", "--rollout", "4", "--quiet", "--resume"])
    after = read_trace(trace).manifest
    assert after.created == before.created
    assert after.extra["probe"]["other_cpu"] == before.extra["probe"]["other_cpu"] is not None
    assert after.extra["generate_other_cpu"] == before.extra["generate_other_cpu"] is not None
    assert before.extra["wall_seconds"] <= after.extra["wall_seconds"] < before.extra["wall_seconds"] + 30


def test_vllm_counts_equal_the_prediction_step_by_step_and_resume_after_ctrl_c(trace, tmp_path):
    out = tmp_path / "run"
    cmd = simlab_cmd("vllm", "run", "--trace", trace, "--out", out, "--k", K, "--batch", "1,2", "--repeats", "1",
                     "--quiet")
    first = out / "runs" / "speculative-r0.jsonl"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    while proc.poll() is None and not (first.exists() and '"type": "batch"' in first.read_text()):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    kept = [line for line in first.read_text().splitlines() if '"type": "batch"' in line]
    assert 1 <= len(kept) < 3  # interrupted after its first batch, before the last
    prediction = json.loads((out / "prediction.json").read_text())
    main([str(a) for a in cmd[3:]])
    assert json.loads((out / "prediction.json").read_text()) == prediction  # made once, before the first run
    again = [line for line in first.read_text().splitlines() if '"type": "batch"' in line]
    assert again[: len(kept)] == kept and len(again) == 3  # resumed: the batches measured before stay as they were
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 4 and summary["requests_all_steps_equal"] == 4, summary
    assert summary["vllm_counters_equal_prediction"], summary
    assert summary["tokens_equal_plain"] == 4  # speculation changed no token
    requests = pd.read_csv(out / "requests.csv")
    assert (requests["output_tokens_measured"] == TOKENS).all()


def _lookup_run(trace, out, *options):
    """``simlab vllm run`` of a draft-free method on the trace's two prompts, predicted first
    (``--predict-only``: nothing of vLLM's runs), then measured: its prediction and summary."""
    args = [str(a) for a in ("vllm", "run", "--trace", trace, "--out", out, *options, "--repeats", "1", "--quiet")]
    main([*args, "--predict-only"])
    prediction = json.loads((out / "prediction.json").read_text())
    assert not (out / "runs").exists() and "--predict-only" not in prediction["command"]
    main(args)
    assert json.loads((out / "prediction.json").read_text()) == prediction
    return prediction, json.loads((out / "summary.json").read_text())


def test_vllm_ngram_counts_equal_the_prediction_step_by_step(trace, tmp_path):
    """vLLM's prompt lookup (K = 3, n-grams of 1-2 tokens): every step of every request, the steps whose
    lookup found nothing (no draft scheduled, absent from vLLM's per-step lists) included, and vLLM's
    counters equal the ngram policy's with vLLM's end of a request, each prompt alone and both at once."""
    prediction, summary = _lookup_run(trace, tmp_path / "ngram", "--method", "ngram", "--k", K,
                                      "--prompt-lookup-min", "1", "--prompt-lookup-max", "2", "--batch", "1,2")
    steps = [tuple(s) for p in prediction["prompts"].values() for s in p["steps"]]
    assert (0, 0) in steps and any(d for d, _ in steps)  # steps without a proposal and steps with one
    assert prediction["speculative_config"] == {"method": "ngram", "num_speculative_tokens": K,
                                                "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    assert summary["requests"] == 4 and summary["requests_all_steps_equal"] == 4, summary
    assert summary["step_log_equals_per_step_lists"] == 4, summary
    assert summary["vllm_counters_equal_prediction"], summary
    assert summary["tokens_equal_plain"] == 4 and summary["tokens_equal_trace"] == 4, summary


def test_vllm_suffix_counts_equal_the_prediction_step_by_step(trace, tmp_path):
    """vLLM's suffix decoding (Arctic Inference's cache, `simlab vllm install --with suffix`), K = 3,
    the prompts one after another on one engine: every step and the counters are the suffix
    policy's with vLLM's end, the second prompt drafting from the first's response too."""
    try:
        suffix_path(locate())
    except SimlabError as exc:
        pytest.skip(str(exc))
    prediction, summary = _lookup_run(trace, tmp_path / "suffix", "--method", "suffix", "--k", K)
    assert prediction["speculative_config"]["suffix_decoding_max_tree_depth"] == 24  # vLLM's default
    assert summary["requests"] == 2 and summary["requests_all_steps_equal"] == 2, summary
    assert summary["step_log_equals_per_step_lists"] == 2 and summary["vllm_counters_equal_prediction"], summary
    assert summary["tokens_equal_plain"] == 2, summary


def _server_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_vllm_serve_under_a_burst_counts_what_the_prediction_says_and_resumes_after_the_server_dies(trace, tmp_path,
                                                                                                    capsys):
    """A burst of 3 requests (prompts 0, 1, 0) into a server of 2 sequences: vLLM's /metrics counters
    over the burst equal the sum of the requests' predicted steps; the plain server is killed while
    it starts or serves, which is one line and keeps the speculative run; the same command resumes."""
    out = tmp_path / "serve"
    args = ["vllm", "serve", "--trace", trace, "--out", out, "--k", K, "--requests", "3", "--max-num-seqs", "2",
            "--quiet"]
    proc = subprocess.Popen(simlab_cmd(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    spec = out / "runs" / "speculative-r0.json"
    while proc.poll() is None and not spec.exists():
        time.sleep(0.5)
    while proc.poll() is None and not _server_pids():  # the plain server's turn
        time.sleep(0.2)
    for pid in _server_pids():
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 2 and err.startswith("simlab: error: vllm serve ") and err.count("\n") == 1, err
    kept = spec.read_text()
    prediction = json.loads((out / "prediction.json").read_text())
    assert prediction["counters"]["num_drafts"] > 0 and prediction["request_prompts"] == [0, 1, 0]
    code, printed, err = run_cli(capsys, *args)
    assert code == 0, err
    assert spec.read_text() == kept  # what was measured before the server died stays as it was
    assert json.loads((out / "prediction.json").read_text()) == prediction  # made once, before the first run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counters_equal_in_every_run"], summary
    assert summary["tokens_equal_plain"] == 3 == summary["answers_compared_with_plain"]
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == 6 and (requests["tokens_measured"] == TOKENS).all()
    assert (requests["ttft_s_measured"] > 0).all() and (requests["e2e_s_measured"] > requests["ttft_s_measured"]).all()
    assert "vLLM's counters equal the prediction" in printed


def test_the_last_step_counts_acceptances_past_max_tokens(trace):
    """The rule the vllm policy adds to vanilla SD: without it the accepted count comes out short."""
    sim = Simulator(read_trace(trace))
    vllm = sim.run("vllm", {"num_speculative_tokens": K}, with_cost=False).summary
    sd = sim.run("sd", {"gamma": K}, with_cost=False).summary
    assert vllm.accepted > sd.accepted and vllm.drafted > sd.drafted


def test_a_model_vllm_cannot_load_is_refused_in_one_line(tmp_path, capsys):
    model = install("smollm2")[0].path
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])  # cut short
    code, _, err = run_cli(capsys, "vllm", "record", "--out", tmp_path / "t", "--target", broken, "--draft", broken,
                           "--prompts", "humaneval:1", "--max-new-tokens", "4", "--quiet")
    assert code == 2 and err.startswith("simlab: error: vLLM could not start: ") and err.count("\n") == 1, err

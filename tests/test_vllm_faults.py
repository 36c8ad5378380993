"""``simlab vllm`` refuses bad input in one line before it starts vLLM (no vLLM needed here).

The cases that need vLLM itself (a model it cannot load, an interrupted run) are in
tests/test_vllm_real.py.
"""

import json
import shutil
import sys

import pandas as pd
import pytest

pytest.importorskip("transformers", reason="the tokenizer checks need the models extra")

from simlab.common.locations import TRACES  # noqa: E402
from simlab.engines.vllm import install as vllm_install  # noqa: E402
from simlab.models import install  # noqa: E402
from tests.helpers import put_table  # noqa: E402
from tests.test_bad_inputs import run_cli  # noqa: E402


def one_line(err: str) -> bool:
    return err.startswith("simlab: error: ") and err.count("\n") == 1


@pytest.fixture(scope="module")
def smollm2_trace(tmp_path_factory):
    """The shipped SmolLM2 trace as if its draft were the full SmolLM2 (what vLLM would run)."""
    install("smollm2")
    out = tmp_path_factory.mktemp("faults") / "smollm2"
    shutil.copytree(TRACES / "smollm2-selfspec", out, ignore=shutil.ignore_patterns("layers.parquet"))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.update(draft_model="smollm2", draft_layer=-1, exit_layers=[], rollout_layers=[])
    (out / "manifest.json").write_text(json.dumps(manifest))
    rollouts = pd.read_parquet(out / "rollouts.parquet")
    return put_table(out, "rollouts", rollouts[rollouts["layer"] == -1])


def test_vllm_missing_names_the_install_command(smollm2_trace, tmp_path, capsys, monkeypatch):
    models = tmp_path / "cache" / "models"
    models.parent.mkdir()
    models.symlink_to(install("smollm2")[0].path.parent)  # the model stays installed, vLLM is not
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(vllm_install.PYTHON_ENV, raising=False)
    code, _, err = run_cli(capsys, "vllm", "run", "--trace", smollm2_trace, "--out", tmp_path / "run")
    assert code == 2 and one_line(err) and "`simlab vllm install`" in err, err
    assert not (tmp_path / "run" / "prediction.json").exists()  # nothing written before vLLM was found


def test_a_python_without_vllm_is_refused(smollm2_trace, tmp_path, capsys):
    code, _, err = run_cli(capsys, "vllm", "run", "--trace", smollm2_trace, "--out", tmp_path / "run",
                           "--python", sys.executable)
    assert code == 2 and one_line(err) and "cannot import vLLM" in err, err


def test_a_trace_of_another_tokenizer_is_refused(smollm2_trace, tmp_path, capsys):
    qwen = tmp_path / "qwen"
    shutil.copytree(TRACES / "qwen-coder-humaneval", qwen)
    manifest = json.loads((qwen / "manifest.json").read_text())
    manifest.update(target_model="smollm2", draft_model="smollm2")
    (qwen / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli(capsys, "vllm", "run", "--trace", qwen, "--out", tmp_path / "run")
    assert code == 2 and one_line(err) and "tokenized by another tokenizer than 'smollm2'" in err, err


def test_a_self_speculative_trace_is_refused(tmp_path, capsys):
    code, _, err = run_cli(capsys, "vllm", "run", "--trace", TRACES / "smollm2-selfspec", "--out", tmp_path / "r")
    assert code == 2 and one_line(err) and "self-speculative" in err, err


@pytest.mark.parametrize("args, fragment", [
    (["--k", "9", "--tail", "8"], "--tail 8 is shorter than the probe's K 9"),
    (["--k", "1"], "needs a K of 2 or more"),
    (["--max-new-tokens", "0"], "--max-new-tokens and --tail must be >= 1"),
    (["--batch", "0"], "--batch values must be >= 1"),
    (["--target", "nonexistent-model"], "no model 'nonexistent-model'"),
])
def test_record_refuses_bad_options(tmp_path, capsys, args, fragment):
    code, _, err = run_cli(capsys, "vllm", "record", "--out", tmp_path / "t", *args)
    assert code == 2 and one_line(err) and fragment in err, err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--rate", "0"], "--rate must be a finite number > 0"),
    (["--requests", "0"], "--requests must be >= 1"),
    (["--max-num-seqs", "0"], "--max-num-seqs and --max-num-batched-tokens must be >= 1"),
    (["--k", "0"], "--k and --repeats must be >= 1"),
])
def test_serve_refuses_bad_options_before_a_model_loads(smollm2_trace, tmp_path, capsys, args, fragment):
    code, _, err = run_cli(capsys, "vllm", "serve", "--trace", smollm2_trace, "--out", tmp_path / "s", *args)
    assert code == 2 and one_line(err) and fragment in err, err
    assert not (tmp_path / "s").exists()


def test_serve_refuses_a_port_in_use(smollm2_trace, tmp_path, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, _, err = run_cli(capsys, "vllm", "serve", "--trace", smollm2_trace, "--out", tmp_path / "s",
                               "--port", port)
    assert code == 2 and one_line(err) and f"port {port} on 127.0.0.1 is in use" in err, err


@pytest.mark.parametrize("args, fragment", [
    (["--method", "eagle"], "--method must be one of draft_model, ngram, suffix, got 'eagle'"),
    (["--method", "ngram", "--prompt-lookup-min", "4", "--prompt-lookup-max", "2"],
     "vLLM would refuse prompt_lookup_min=4, prompt_lookup_max=2"),
    (["--prompt-lookup-max", "3"], "--prompt-lookup-min/--prompt-lookup-max are ngram's settings, not draft_model's"),
    (["--method", "ngram", "--suffix-max-tree-depth", "8"], "the --suffix-* options are suffix's settings, not ngram's"),
    (["--method", "suffix", "--suffix-min-token-prob", "1.5"], "suffix_decoding_min_token_prob=1.5 (in [0, 1])"),
    (["--method", "suffix", "--batch", "1,2"], "--method suffix runs one prompt at a time (--batch 1)"),
    (["--method", "ngram", "--k", "0"], "--k (num_speculative_tokens) must be >= 1, got 0"),
])
def test_run_refuses_bad_method_options_before_anything_is_written(smollm2_trace, tmp_path, capsys, args, fragment):
    code, _, err = run_cli(capsys, "vllm", "run", "--trace", smollm2_trace, "--out", tmp_path / "r", *args)
    assert code == 2 and one_line(err) and fragment in err, err
    assert not (tmp_path / "r").exists()


def test_install_refuses_an_unknown_extra(capsys):
    code, _, err = run_cli(capsys, "vllm", "install", "--with", "eagle")
    assert code == 2 and one_line(err) and "--with takes suffix, got eagle" in err, err


def test_live_refuses_a_lookup_policy_with_vllms_end(capsys):
    code, _, err = run_cli(capsys, "live", "--policy", "ngram", "--param", "vllm_end=true", "--target", "smollm2",
                           "--draft", "smollm2", "--prompts", "humaneval:1", "--max-new-tokens", "4")
    assert code == 2 and one_line(err) and "check it on vLLM with `simlab vllm run --method ngram`" in err, err

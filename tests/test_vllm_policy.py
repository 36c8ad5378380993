"""The vllm policy against an independent replay of vLLM's rule, and the trace past its ends.

The rule (docs/policies/vllm.md, from vLLM 0.32.0's scheduler and rejection sampler): the
prefill emits position 0; every step drafts K whatever remains, accepts while the draft equals
the target (past the prompt's end too: vLLM verifies against the target's own continuation), and
the request stops once its output reaches max_tokens or its end token, cut there.
"""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.common.locations import ROOT
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace, write_trace
from simlab.trace.past_end import extended
from tests.helpers import hand_trace


def vllm_steps(bits: str, end: int, k: int, max_tokens: int = 0) -> tuple[list[tuple[int, int]], int]:
    """vLLM's (drafted, accepted) per step and output tokens, from the match bits of the path run on
    past the prompt's end (bits[t] == "1": the draft's token at t is the target's)."""
    stop = min(end, max_tokens) if max_tokens else end
    steps, c = [], 1
    while c < stop:
        a = 0
        while a < k and bits[c + a] == "1":
            a += 1
        steps.append((k, a))
        c += a + 1
    return steps, min(c, stop)


def past_end_trace(patterns: list[str]):
    """Hand trace whose patterns hold '|' where the prompt ends: what follows is past_end.parquet."""
    whole = hand_trace([p.replace("|", "") for p in patterns])
    ends = {pid: p.index("|") for pid, p in enumerate(patterns)}
    pos = whole.positions
    own = pos["pos"] < pos["prompt_id"].map(ends)
    prompts = whole.prompts.assign(n_tokens=whole.prompts["prompt_id"].map(ends))
    return whole.__class__(manifest=whole.manifest, prompts=prompts, positions=pos[own].reset_index(drop=True),
                           rollouts=whole.rollouts, latency=whole.latency,
                           past_end=pos[~own].reset_index(drop=True))


def simulated_steps(sim: Simulator, pid: int, params: dict) -> tuple[list[tuple[int, int]], int]:
    res = sim.run("vllm", params, timeline_prompt=pid, with_cost=False)
    verify = [s for s in res.timeline if s.device == "target"]
    tokens = int(res.per_prompt.set_index("prompt_id").loc[pid, "tokens"])
    return [(s.args["tokens"] - 1, s.args["accepted"]) for s in verify], tokens + 1


def test_the_last_step_drafts_k_and_counts_acceptances_past_the_end():
    # 4 tokens of its own, then the target's continuation, all matched: the round from position 1
    # drafts K=4 (sd drafts the 2 the budget leaves) and vLLM counts all 4 accepted
    sim = Simulator(past_end_trace(["1111|1111"]))
    assert simulated_steps(sim, 0, {"num_speculative_tokens": 4}) == ([(4, 4)], 4)
    sd = sim.run("sd", {"gamma": 4}, with_cost=False).summary
    assert (sd.drafted, sd.accepted) == (2, 2)
    vllm = sim.run("vllm", {"num_speculative_tokens": 4}, with_cost=False).summary
    assert (vllm.num_drafts, vllm.drafted, vllm.accepted, vllm.tokens) == (1, 4, 4, 3)
    assert vllm.acceptance_per_position == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("seed", range(12))
def test_every_step_equals_the_independent_replay(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 7))
    patterns = []
    for _ in range(3):
        end = int(rng.integers(2, 30))
        bits = "".join("1" if rng.random() < 0.8 else "0" for _ in range(end + k))
        patterns.append(bits[:end] + "|" + bits[end:])
    max_tokens = int(rng.integers(0, 30)) if seed % 2 else 0
    trace = past_end_trace(patterns)
    trace.manifest.max_new_tokens = 30
    sim = Simulator(trace)
    params = {"num_speculative_tokens": k, "max_tokens": max_tokens}
    for pid, pattern in enumerate(patterns):
        want = vllm_steps(pattern.replace("|", ""), pattern.index("|"), k, max_tokens)
        assert simulated_steps(sim, pid, params) == want, (pattern, k, max_tokens)
    summary = sim.run("vllm", params, with_cost=False).summary
    wanted = [vllm_steps(p.replace("|", ""), p.index("|"), k, max_tokens) for p in patterns]
    assert summary.accepted == sum(a for steps, _ in wanted for _, a in steps)
    assert summary.num_drafts == sum(len(steps) for steps, _ in wanted)
    assert summary.tokens == sum(tokens - 1 for _, tokens in wanted)


def test_without_past_end_rows_acceptances_there_are_rejections(capsys):
    """A trace not recorded by vllm record: placeholders never match, so accepted is a lower bound."""
    with_rows = past_end_trace(["1111111|1111", "101|0111"])
    without = replace(with_rows, past_end=None)
    full = Simulator(with_rows).run("vllm", {"num_speculative_tokens": 3}, with_cost=False).summary
    bound = Simulator(without).run("vllm", {"num_speculative_tokens": 3}, with_cost=False).summary
    assert "counted as rejections" in capsys.readouterr().err
    assert (bound.num_drafts, bound.drafted, bound.tokens) == (full.num_drafts, full.drafted, full.tokens)
    assert bound.accepted < full.accepted


def test_no_other_policy_reads_the_rows_past_the_end():
    with_rows = past_end_trace(["1101111011|1111", "1111111|0111"])
    without = replace(with_rows, past_end=None)
    for policy, params in (("sd", {"gamma": 3}), ("hf-heuristic", {}), ("svip", {}), ("pearl", {})):
        a = Simulator(with_rows).run(policy, params).summary.to_dict()
        b = Simulator(without).run(policy, params).summary.to_dict()
        assert a == b, policy


def test_max_tokens_past_the_trace_budget_is_refused():
    trace = past_end_trace(["1111|1111"])
    trace.manifest.max_new_tokens = 4
    with pytest.raises(SimlabError, match="exceeds the trace's budget"):
        Simulator(trace).run("vllm", {"num_speculative_tokens": 2, "max_tokens": 5})


def test_the_extended_replay_keeps_each_prompts_own_end():
    trace = past_end_trace(["11011|110", "1|10"])
    ext = extended(trace, 4)
    assert ext.padded == 2  # 3 and 2 rows past the ends, 4 asked
    assert ext.trace.prompts["end"].tolist() == [5, 1]
    assert ext.trace.prompts["n_tokens"].tolist() == [9, 5]
    pos = ext.trace.positions
    assert pos.groupby("prompt_id")["pos"].max().tolist() == [8, 4]
    placeholders = pos[pos["target_token"] < 0]
    assert len(placeholders) == 3 and (placeholders["draft_token"] != placeholders["target_token"]).all()


def test_past_end_rows_are_written_read_and_checked(tmp_path):
    trace = past_end_trace(["1111|1111", "10|01"])
    write_trace(trace, tmp_path / "t")
    back = read_trace(tmp_path / "t")
    pd.testing.assert_frame_equal(back.past_end.reset_index(drop=True), trace.past_end.astype(back.past_end.dtypes))
    bad = trace.past_end.copy()
    bad.loc[bad.index[0], "pos"] = 7  # prompt 0's first row past its end (4) must be position 4
    write_trace(replace(trace, past_end=bad), tmp_path / "bad")
    with pytest.raises(SimlabError, match="past_end.parquet must continue each prompt's path"):
        read_trace(tmp_path / "bad")


def test_simulate_and_sweep_write_vllms_speculative_config(capsys):
    from simlab.common.locations import TRACES
    from tests.test_bad_inputs import run_cli

    trace = TRACES / "qwen-coder-humaneval"
    code, out, _ = run_cli(capsys, "simulate", "--trace", trace, "--policy", "vllm", "--param",
                           "num_speculative_tokens=3", "--json")
    config = json.loads(out)["speculative_config"]
    assert code == 0 and config["method"] == "draft_model" and config["num_speculative_tokens"] == 3
    assert config["model"].endswith("qwen2.5-coder-0.5b")
    code, out, _ = run_cli(capsys, "simulate", "--trace", trace, "--policy", "svip", "--json")
    assert code == 0 and "speculative_config" not in json.loads(out)
    code, out, _ = run_cli(capsys, "sweep", "--trace", trace, "--policy", "sd:gamma=1..6", "--policy", "svip",
                           "--workers", "1", "--no-cache")
    best = max(range(1, 7), key=lambda g: Simulator(read_trace(trace)).run("sd", {"gamma": g}).summary.speedup)
    assert code == 0 and f'the fastest fixed-K row, sd(gamma={best}),' in out
    assert f'"num_speculative_tokens": {best}}}' in out


def test_a_self_speculative_trace_gets_no_speculative_config(capsys):
    # its draft is the target's first 24 layers: no model vLLM's draft_model speculation can load
    from simlab.common.locations import TRACES
    from tests.test_bad_inputs import run_cli

    trace = TRACES / "smollm2-selfspec"
    code, out, _ = run_cli(capsys, "simulate", "--trace", trace, "--policy", "sd", "--json")
    assert code == 0 and "speculative_config" not in json.loads(out)
    code, out, _ = run_cli(capsys, "sweep", "--trace", trace, "--policy", "sd:gamma=1..3", "--workers", "1", "--no-cache")
    assert code == 0 and "--speculative-config" not in out


def vllm_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM 0.32.0's ``_find_longest_matched_ngram_and_propose_tokens`` (v1/spec_decode/ngram_proposer.py),
    line for line in plain Python (max_model_len never binds here): KMP over the reversed context."""
    total = len(tokens)
    if total < min_n:
        return []
    rev = tokens[::-1]
    lps = [0] * max_n
    longest = position = prev = 0
    i = 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start:start + min(k, total - start)]


@pytest.mark.parametrize("k, min_n, max_n, max_tokens", [(4, 5, 5, 0), (3, 1, 3, 0), (6, 2, 2, 50)])
def test_ngram_with_vllm_end_is_vllms_ngram_step_by_step(k, min_n, max_n, max_tokens):
    """The ngram policy with vllm_end on vLLM's SmolLM2 trace (its path run 8 tokens past each end)
    against vLLM's own lookup and scheduler rule replayed here: a proposal after every step from
    the prompt and the tokens out so far, never cut at the end; an empty one is a (0, 0) step; the
    request stops at its end or max_tokens."""
    trace = read_trace(ROOT / "results" / "vllm" / "traces" / "smollm2-humaneval-vllm")
    sim = Simulator(trace)
    params = {"num_tokens": k, "ngram_min": min_n, "ngram_max": max_n, "vllm_end": True, "max_tokens": max_tokens}
    rows = pd.concat([trace.positions, trace.past_end]).sort_values(["prompt_id", "pos"])
    for pid, prompt in trace.prompts.set_index("prompt_id").iterrows():
        path = rows.loc[rows["prompt_id"] == pid, "target_token"].tolist()
        end = min(int(prompt["n_tokens"]), max_tokens) if max_tokens else int(prompt["n_tokens"])
        context, steps, c = [int(t) for t in prompt["prompt_token_ids"]], [], 1
        while c < end:
            draft = vllm_ngram(context + path[:c], min_n, max_n, k)
            a = 0
            while a < len(draft) and draft[a] == path[c + a]:
                a += 1
            steps.append((len(draft), a))
            c += a + 1
        res = sim.run("ngram", params, timeline_prompt=int(pid), with_cost=False)
        got = [(s.args["tokens"] - 1, s.args["accepted"]) for s in res.timeline if s.device == "target"]
        assert got == steps, pid
        assert int(res.per_prompt.set_index("prompt_id").loc[pid, "tokens"]) + 1 == end


def test_without_vllm_end_ngram_stays_within_the_budget_and_max_tokens_needs_it():
    trace = read_trace(ROOT / "results" / "vllm" / "traces" / "smollm2-humaneval-vllm")
    sim = Simulator(trace)
    plain = sim.run("ngram", {"num_tokens": 6, "ngram_min": 1, "ngram_max": 2}, with_cost=False).summary
    vllm = sim.run("ngram", {"num_tokens": 6, "ngram_min": 1, "ngram_max": 2, "vllm_end": True},
                   with_cost=False).summary
    assert vllm.drafted > plain.drafted  # the last steps propose past the budget
    with pytest.raises(SimlabError, match="max_tokens is vLLM's end of a request; set vllm_end=true"):
        sim.run("ngram", {"max_tokens": 50}, with_cost=False)

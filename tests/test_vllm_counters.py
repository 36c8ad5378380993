"""vLLM's counters per prompt and in total, the parallel-round convention, and tables written by
an older simlab."""

import re
from pathlib import Path

import pandas as pd
import pytest

from simlab.common.metrics import SUMMARY_KEYS
from simlab.common.table_file import read_frame, write_frame
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.replay import TraceReplay
from tests.helpers import EveryRoundParallel, hand_trace

METRICS_DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def test_per_prompt_drafts_add_up_to_the_total():
    # prompt 0: rounds at 1, 4, 8, 9, 10 (6 accepted, see test_replay); prompt 1 (12 positions): 1..3 and
    # 5..7 all accepted, then 9, 10 (a round drafts at most n - c - 1) -> 3 + 3 + 2 accepted
    res = Simulator(hand_trace(["1" + "11011110010", "1" * 12])).run("sd", {"gamma": 3}, with_cost=False)
    assert list(res.per_prompt["num_drafts"]) == [5, 3]
    assert res.summary.num_drafts == 8 and res.summary.accepted == 6 + 8
    assert res.summary.mean_acceptance_length == pytest.approx(1 + 14 / 8)
    per_prompt_mal = 1 + res.per_prompt["accepted"] / res.per_prompt["num_drafts"]
    assert list(res.per_prompt["mean_acceptance_length"]) == pytest.approx(list(per_prompt_mal))


def test_a_parallel_round_is_one_draft():
    """Every parallel round checks at least its first new draft, so each is one of vLLM's drafts."""
    trace = hand_trace(["1" + "11011110010", "1" + "110" * 4])
    sim = Simulator(trace)
    run = SimExecutor(sim.latency).run(TraceReplay(trace), EveryRoundParallel(sim.context()))
    for prompt in run.prompts:
        assert prompt.counts.num_drafts == prompt.counts.parallel_rounds == prompt.counts.target_calls > 0


def test_acceptance_per_position_sums_to_accepted_per_draft():
    res = Simulator(hand_trace(["1" + "11011110010", "1" + "0111011111"])).run("hf-heuristic", {"gamma": 2},
                                                                                  with_cost=False)
    s = res.summary
    assert sum(s.acceptance_per_position) == pytest.approx(s.mean_acceptance_length - 1)
    assert all(a >= b for a, b in zip(s.acceptance_per_position, s.acceptance_per_position[1:]))


def test_list_columns_and_old_column_names_read_back(tmp_path):
    table = pd.DataFrame({"policy": ["sd"], "mean_accept_len": [2.5], "acceptance_per_position": [[0.9, 0.5]]})
    for suffix in (".csv", ".parquet"):
        back = read_frame(write_frame(table, tmp_path / f"t{suffix}"))
        assert "mean_accept_len" not in back.columns and back["tokens_per_target_call"].iat[0] == 2.5
        assert list(back["acceptance_per_position"].iat[0]) == [0.9, 0.5]


def test_the_metrics_page_documents_every_key():
    section = METRICS_DOC.read_text()
    documented = set(re.findall(r"`([a-z_]+)`", section))
    assert {*SUMMARY_KEYS, "acceptance_per_position"} <= documented

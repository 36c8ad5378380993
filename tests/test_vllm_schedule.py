"""vLLM's dynamic speculation table (``num_speculative_tokens_per_batch_size``) out of ``simlab serve
tune`` and into ``simlab serve --gamma-by-batch``: by hand, and against vLLM's own validation and
lookup where vLLM's environment is installed (``simlab vllm install``)."""

import json
import subprocess

import pytest

from simlab.common.errors import SimlabError
from simlab.policies.vllm import SCHEDULE_KEY, check_schedule, schedule_config, schedule_of, schedule_pairs
from simlab.serve.batch_policy import GammaByBatch, gamma_by_batch_pairs


def test_a_tuned_table_becomes_one_range_per_run_of_equal_k():
    # tuned at 1, 2, 4, 8, 16: K 5 holds for batch sizes 1-3, 3 for 4-7, none from 8 on (16's range carried on)
    best = {1: 5, 2: 5, 4: 3, 8: 0, 16: 0}
    assert schedule_of(best) == [[1, 3, 5], [4, 7, 3], [8, 16, 0]]
    config = schedule_config(best, "/models/draft")
    assert config == {"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 5,
                      SCHEDULE_KEY: [[1, 3, 5], [4, 7, 3], [8, 16, 0]]}
    assert schedule_config({1: 0, 4: 0}, "d") is None  # no batch size drafts: no speculation at all
    # a table tuned from batch size 2 up: vLLM needs a range from 1, which takes the first K
    assert schedule_of({2: 4, 4: 2}) == [[1, 3, 4], [4, 4, 2]]


def test_the_config_reads_back_as_the_same_caps_at_every_batch_size():
    best = {1: 5, 2: 5, 4: 3, 8: 0, 16: 0}
    table = GammaByBatch.parse(gamma_by_batch_pairs(json.dumps(schedule_config(best, "d"))))
    tuned = GammaByBatch.parse(",".join(f"{b}:{g}" for b, g in best.items()))
    for b in range(1, 40):
        assert table.cap([None] * b, None) == tuned.cap([None] * b, None), b


def test_a_gap_carries_the_previous_k_and_every_k_is_capped_at_num_speculative_tokens():
    # vLLM's own example in build_dynamic_sd_schedule_lookup: [(1, 16, 3), (32, 128, 2)] maps 17-31 to K = 3
    pairs = schedule_pairs({"num_speculative_tokens": 3, SCHEDULE_KEY: [[32, 128, 2], [1, 16, 3]]})
    assert pairs == [(1, 3), (32, 2)]
    table = GammaByBatch(tuple(pairs))
    assert [table.cap([None] * b, None) for b in (1, 16, 17, 31, 32, 500)] == [3, 3, 3, 3, 2, 2]
    assert schedule_pairs({"num_speculative_tokens": 2, SCHEDULE_KEY: [[1, 4, 6]]}) == [(1, 2)]


BAD = [
    ({SCHEDULE_KEY: "1-4:3"}, "must be a non-empty list of (range_start, range_end, num_speculative_tokens) entries."),
    ({SCHEDULE_KEY: []}, "must not be empty."),
    ({SCHEDULE_KEY: [[1, 4]]}, "entry must be a 3-item sequence"),
    ({SCHEDULE_KEY: [[0, 4, 3]]}, "Batch-size range (0, 4) must be positive."),
    ({SCHEDULE_KEY: [[1, 4, 3], [8, 5, 2]]}, "Batch-size range start must be <= end for (8, 5, 2)."),
    ({SCHEDULE_KEY: [[1, 4, -1]]}, "values must be >= 0."),
    ({SCHEDULE_KEY: [[1, 8, 3], [4, 16, 2]]}, "Batch-size ranges must be non-overlapping and sorted."),
    ({SCHEDULE_KEY: [[2, 8, 3]]}, "The first batch-size range must start at 1"),
]


@pytest.mark.parametrize("config, words", BAD)
def test_a_table_vllm_would_refuse_is_refused_first_in_its_words(config, words):
    with pytest.raises(SimlabError, match="vLLM would refuse") as err:
        gamma_by_batch_pairs(json.dumps({"num_speculative_tokens": 4, **config}))
    assert words in str(err.value)


def test_serve_reads_a_vllm_config_file_and_refuses_a_bad_one_in_one_line(tmp_path, capsys):
    from tests.test_bad_inputs import run_cli

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"method": "draft_model", "num_speculative_tokens": 4, SCHEDULE_KEY: [[1, 2, 4], [3, 8, 0]]}))
    bad.write_text(json.dumps({"num_speculative_tokens": 4, SCHEDULE_KEY: [[2, 8, 3]]}))
    code, out, err = run_cli(capsys, "serve", "--policy", "sd", "--gamma", "4", "--requests", "4", "--rate", "4",
                             "--gamma-by-batch", good, "--json")
    assert code == 0, err
    assert json.loads(out)["batch_policy"] == "table"
    code, _, err = run_cli(capsys, "serve", "--policy", "sd", "--requests", "4", "--gamma-by-batch", bad)
    assert code == 2 and err.count("\n") == 1 and "The first batch-size range must start at 1" in err, err


def _vllm_python():
    from simlab.engines.vllm.install import locate

    try:
        return locate()
    except SimlabError as exc:
        pytest.skip(str(exc))


VLLM_CHECK = """
import json, sys
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup, validate_and_normalize_dynamic_sd_schedule
out = []
for table in json.loads(sys.argv[1]):
    try:
        out.append({"ok": [list(e) for e in validate_and_normalize_dynamic_sd_schedule(table)],
                    "lookup": build_dynamic_sd_schedule_lookup(table, 40, 4)})
    except ValueError as exc:
        out.append({"error": str(exc)})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_rules_are_vllms_own():
    """Every table above, and some good ones, through vLLM's own validation and lookup: the same
    refusals, word for word, and the same K at every batch size up to max_num_seqs = 40 (K = 4)."""
    good = [[[1, 16, 3], [32, 128, 2]], [[1, 3, 5], [4, 7, 3], [8, 16, 0]], [[4, 8, 1], [1, 3, 2]], [[1, 1, 0]]]
    tables = good + [c[SCHEDULE_KEY] for c, _ in BAD]
    run = subprocess.run([_vllm_python(), "-c", VLLM_CHECK, json.dumps(tables)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    for table, answer in zip(tables, theirs):
        if "error" in answer:
            with pytest.raises(SimlabError) as err:
                check_schedule(table)
            assert str(err.value).endswith(answer["error"]), (table, answer)
        else:
            assert [list(e) for e in check_schedule(table)] == answer["ok"]
            caps = GammaByBatch(tuple(schedule_pairs({"num_speculative_tokens": 4, SCHEDULE_KEY: table})))
            assert [caps.cap([None] * b, None) for b in range(1, 41)] == answer["lookup"][1:], table


def test_serve_tune_writes_its_table_as_vllms_config_for_a_pair_and_none_for_a_self_speculative_trace(tmp_path, capsys):
    from simlab.common.locations import TRACES
    from tests.test_bad_inputs import run_cli

    out = tmp_path / "tuned.json"
    code, printed, err = run_cli(capsys, "serve", "tune", "--trace", TRACES / "qwen-coder-humaneval", "--batch", "1,2,4",
                                 "--max-gamma", "3", "--requests-per-slot", "1", "-o", out)
    assert code == 0, err
    data = json.loads(out.read_text())
    best = {int(b): g for b, g in data["gamma_by_batch"].items()}
    config = data["vllm_speculative_config"]
    if max(best.values()) == 0:
        assert config is None
    else:
        assert config[SCHEDULE_KEY] == schedule_of(best) and config["num_speculative_tokens"] == max(best.values())
        assert "--speculative-config" in printed
    code, _, err = run_cli(capsys, "serve", "tune", "--trace", TRACES / "smollm2-selfspec", "--batch", "1,2",
                           "--max-gamma", "2", "--requests-per-slot", "1", "-o", tmp_path / "self.json")
    assert code == 0, err
    assert "vllm_speculative_config" not in json.loads((tmp_path / "self.json").read_text())

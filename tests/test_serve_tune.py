"""`simlab serve tune`: the best draft length per batch size, found by serving saturated batches
with serve's own engine, and the JSON file `serve --gamma-by-batch` reads back."""

import json

import pandas as pd
import pytest

from simlab.cli import main
from simlab.common.errors import SimlabError
from simlab.serve.batch_policy import TABLE_FORMAT, gamma_by_batch_pairs
from simlab.serve.run import ServeConfig, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.serve.tune import REQUESTS_PER_SLOT, tune
from simlab.sim.run import Simulator
from tests.helpers import hand_trace, latency_table
from tests.test_serve import SHIPPED

ALL_ACCEPTED = ["1" * 41]  # the prefill's token and 40 decoded ones, every draft accepted


def sim_with(draft: float, verify: dict[int, float]) -> Simulator:
    return Simulator(hand_trace(ALL_ACCEPTED, latency=latency_table(draft=draft, verify=verify)))


def test_tune_switches_speculation_off_where_drafting_costs_more_than_it_saves():
    # a draft step (5 s) costs more than the verification it could save (about 1 s)
    tuned = tune(sim_with(5.0, {k: 1 + 0.01 * k for k in range(1, 200)}), [1, 2, 4], max_gamma=4, progress=False)
    assert tuned.best == {1: 0, 2: 0, 4: 0}
    assert tuned.speedup == {1: 1.0, 2: 1.0, 4: 1.0}
    assert tuned.table() == "1:0,2:0,4:0"


def test_tune_drafts_the_longest_length_where_drafting_is_nearly_free():
    tuned = tune(sim_with(1e-4, {k: 1 + 1e-4 * k for k in range(1, 200)}), [1, 4], max_gamma=5, progress=False)
    assert tuned.best == {1: 5, 4: 5}


def test_tune_follows_a_verification_cost_cliff_down_as_the_batch_grows():
    # verifying up to 4 tokens costs 1 s, more costs 10 s; the batch's tokens are B * (γ + 1)
    # (the token-count rule of an unbatched table), so the longest draft under the cliff is
    # γ = 3 alone, 1 at B = 2 and none at B = 4
    sim = sim_with(0.01, {k: 1.0 if k <= 4 else 10.0 for k in range(1, 200)})
    tuned = tune(sim, [1, 2, 4], max_gamma=6, progress=False)
    assert tuned.best == {1: 3, 2: 1, 4: 0}
    # alone, each of the 4 requests: a prefill of 10 tokens (10 s, the draft's prefill 1% more),
    # then 10 rounds of 3 drafts (0.03 s) and a 4-token verification (1 s), against 40 one-token
    # verifications (1 s each) without speculation
    prefill = 10 * 1.01
    assert tuned.speedup[1] == pytest.approx((prefill + 40 * 1.0) / (prefill + 10 * 1.03), rel=1e-12)
    assert len(tuned.tokens_per_s[4]) == 7 and tuned.speedup[4] == 1.0


@pytest.mark.parametrize("draft", [1e-12, 0.1])
def test_no_speculation_in_tune_decodes_as_ad_but_still_prefills_the_draft(draft):
    """γ = 0 is the speculating server with drafting switched off: ``ad``'s plain steps, but the
    draft it keeps loaded (for the batch sizes that draft) still prefills each prompt; ``ad``,
    a server without a draft, does not. With a draft all but free the two are the same run."""
    sim = sim_with(draft, {k: 1 + 0.1 * k for k in range(1, 200)})
    tuned = tune(sim, [1, 3], max_gamma=2, progress=False)
    for b in (1, 3):
        run = serve_once(sim, [0.0] * (REQUESTS_PER_SLOT * b), ServeConfig(scheduler=Scheduler(b)), "ad", {})
        ad = run.summary["throughput_tokens_per_s"]
        assert tuned.tokens_per_s[b][0] == pytest.approx(ad, rel=1e-9) if draft < 1e-9 else tuned.tokens_per_s[b][0] < ad


def serve_json(args, capsys) -> dict:
    main(["serve", "--trace", str(SHIPPED), "--rate", "0.05", "--requests", "12", "--gamma", "6", "--json", *args])
    return json.loads(capsys.readouterr().out)


def test_the_tuned_json_round_trips_into_serve_gamma_by_batch(tmp_path, capsys):
    out = tmp_path / "gamma.json"
    main(["serve", "tune", "--trace", str(SHIPPED), "--batch", "1,2,4", "--max-gamma", "3", "--requests-per-slot", "1",
          "-o", str(out)])
    captured = capsys.readouterr()
    text = captured.out
    assert "extrapolated" in captured.err  # the shipped trace's CPU samples price batches by the token-count rule
    data = json.loads(out.read_text())
    assert data["requests_per_slot"] == 1 and data["max_gamma"] == 3 and data["policy"] == "sd"
    assert data["objective"].startswith("tokens/s of a saturated batch")  # what "best" maximised
    assert data["trace"] == str(SHIPPED) and data["format"] == TABLE_FORMAT and data["pair"] == {"draft": "qwen2.5-coder-0.5b", "target": "qwen2.5-coder-1.5b"}
    assert list(data["gamma_by_batch"]) == ["1", "2", "4"] and all(0 <= g <= 3 for g in data["gamma_by_batch"].values())
    assert all(len(v) == 4 for v in data["tokens_per_s_by_batch"].values())
    pairs = ",".join(f"{b}:{g}" for b, g in data["gamma_by_batch"].items())
    assert pairs in text and gamma_by_batch_pairs(str(out)) == pairs
    from_file = serve_json(["--gamma-by-batch", str(out)], capsys)
    assert from_file == serve_json(["--gamma-by-batch", pairs], capsys)
    assert from_file["batch_policy"] == "table"


@pytest.mark.parametrize("args,needle", [
    (["--batch", "2,1"], "--batch"), (["--batch", "0"], "--batch"), (["--batch", "x"], "--batch"),
    (["--max-gamma", "0"], "--max-gamma"), (["--requests-per-slot", "0"], "--requests-per-slot"),
    (["--token-budget", "0"], "--token-budget"),
])
def test_bad_tune_input_fails_in_one_line_before_the_trace_is_read(args, needle, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "tune", "-o", str(tmp_path / "g.json"), "--trace", str(tmp_path / "no-such-trace"), *args])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and needle in err


def test_tune_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "g.json"
    out.write_text("{}")
    with pytest.raises(SystemExit):
        main(["serve", "tune", "-o", str(out), "--trace", str(tmp_path / "no-such-trace")])
    assert "--force" in capsys.readouterr().err


@pytest.mark.parametrize("content,needle", [
    ({"format": "other", "version": 1}, "is not a 'simlab-gamma-by-batch' file"),
    ({"format": TABLE_FORMAT, "version": 1}, "non-empty \"gamma_by_batch\""),
    ({"format": TABLE_FORMAT, "version": 1, "gamma_by_batch": {}}, "non-empty \"gamma_by_batch\""),
    ({"format": TABLE_FORMAT, "version": 1, "gamma_by_batch": {"1": 4.5}}, "maps batch sizes to draft lengths"),
    ({"format": TABLE_FORMAT, "version": 1, "gamma_by_batch": {"one": 4}}, "maps batch sizes to draft lengths"),
])
def test_bad_gamma_by_batch_files_fail_in_one_line(content, needle, tmp_path):
    path = tmp_path / "gamma.json"
    path.write_text(json.dumps(content))
    with pytest.raises(SimlabError, match=needle) as err:
        gamma_by_batch_pairs(str(path))
    assert str(err.value).startswith(f"--gamma-by-batch file {path}")  # the flag and the file it read


def test_gamma_by_batch_pairs_are_read_as_pairs_or_from_a_file_in_batch_order(tmp_path):
    assert gamma_by_batch_pairs("1:6,4:0") == "1:6,4:0"
    path = tmp_path / "by-hand.json"
    path.write_text(json.dumps({"format": TABLE_FORMAT, "version": 1, "gamma_by_batch": {"16": 0, "1": 6, "4": 3}}))
    assert gamma_by_batch_pairs(str(path)) == "1:6,4:3,16:0"  # numeric order, not the file's or the strings'
    with pytest.raises(SimlabError, match="not found: nothing.json"):
        gamma_by_batch_pairs("nothing.json")


def test_tune_prices_batches_from_a_roofline_profile_without_a_warning(tmp_path, capsys):
    from simlab.common.locations import ROOT
    from simlab.latency.batch import ROOFLINE_RULE

    profile = ROOT / "calibrate" / "roofline" / "qwen2.5-coder-0.5b-1.5b-h100.json"
    out = tmp_path / "gamma.json"
    main(["serve", "tune", "--trace", str(SHIPPED), "--latency", str(profile), "--batch", "1,8", "--max-gamma", "2",
          "--requests-per-slot", "1", "--json", "-o", str(out)])
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert printed == json.loads(out.read_text())
    assert printed["latency_rule"] == ROOFLINE_RULE and not printed["batch_latency_extrapolated"]
    assert "warning" not in captured.err and printed["latency"] != "qwen-coder-humaneval samples"


def test_the_progress_bar_counts_every_batch_size_and_draft_length_served(capsys):
    # 2 batch sizes x draft lengths 0..1: 4 serve runs, and the bar ends full at 4/4
    tune(sim_with(0.1, {k: 1 + 0.1 * k for k in range(1, 200)}), [1, 2], max_gamma=1, requests_per_slot=1, progress=True)
    last = capsys.readouterr().err.rstrip().split("\r")[-1]
    assert last.startswith("serve tune: 100%") and " 4/4 " in last


def test_a_tune_beyond_the_measured_batch_sizes_says_so():
    # batches of 1 and 2 measured: tuning B = 8 prices batches beyond twice the largest, B = 2 does not
    single = latency_table(draft=0.01, verify={k: 1 + 0.01 * k for k in range(1, 200)})
    samples = pd.concat([single.assign(batch=1), single.assign(seconds=single["seconds"] * 1.5, batch=2)],
                        ignore_index=True)
    sim = Simulator(hand_trace(ALL_ACCEPTED, latency=samples))
    assert not tune(sim, [1, 2], max_gamma=1, requests_per_slot=1, progress=False).extrapolated
    tuned = tune(sim, [8], max_gamma=1, requests_per_slot=1, progress=False)
    assert tuned.extrapolated and tuned.latency_rule.endswith("batches beyond the measured ones extrapolated linearly")


def test_under_vllms_scheduler_a_k_of_0_pays_the_drafts_first_pass_and_speedups_are_over_the_plain_server():
    from simlab.common.locations import ROOT
    from simlab.serve.vllm_scheduler import VllmScheduler
    from simlab.trace.io import read_trace

    sim = Simulator(read_trace(ROOT / "results" / "vllm" / "traces" / "smollm2-humaneval-vllm"))
    tuned = tune(sim, [1, 2], max_gamma=3, requests_per_slot=2, progress=False, scheduler="vllm")
    for b in (1, 2):
        assert tuned.tokens_per_s[b][0] < tuned.plain_tokens_per_s[b]  # K = 0: the first pass, and no draft
        assert tuned.speedup[b] == pytest.approx(tuned.tokens_per_s[b][tuned.best[b]] / tuned.plain_tokens_per_s[b])
    # a table of one K is the server of that K
    params = {"num_speculative_tokens": 3}
    fixed = serve_once(sim, [0.0] * 4, ServeConfig("vllm", params, VllmScheduler(2)), "vllm", params)
    assert tuned.tokens_per_s[2][3] == pytest.approx(fixed.summary["throughput_tokens_per_s"], rel=1e-12)
    data = tuned.to_json(sim, "smollm2")
    assert data["scheduler"] == "vllm" and data["policy"] == "vllm" and set(data["plain_tokens_per_s_by_batch"]) == {"1", "2"}

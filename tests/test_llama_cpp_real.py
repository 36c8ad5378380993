"""llama.cpp built from the package index, predicted by simlab: a real speculative run's counters.

Builds llama.cpp from the llama-cpp-python sdist (cached under the simlab cache: about 4
minutes on a quiet 2-core machine the first time, nothing after), records a SmolLM2 trace with
it, then runs the real llama-speculative-simple (SmolLM2 drafting for itself) and asserts that
the drafts it verified and accepted are the llama-cpp policy's prediction, prompt by prompt.
"""

from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("transformers", reason="the chat template of the prompts needs the models extra")

from simlab.cli import main  # noqa: E402
from simlab.live import llama_cpp as compare  # noqa: E402
from simlab.models import install  # noqa: E402
from simlab.trace.io import read_trace  # noqa: E402

pytestmark = pytest.mark.slow

N_PREDICT, DRAFT_MAX = 32, 4


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    install("smollm2")
    out = tmp_path_factory.mktemp("llama-cpp") / "trace"
    # N + D + 2 positions: the last round may start at N + 1 and draft D (docs/llama-cpp.md)
    main(["llama-cpp", "record", "--out", str(out), "--prompts", "humaneval:2",
          "--max-new-tokens", str(N_PREDICT + DRAFT_MAX + 2), "--rollout", str(DRAFT_MAX), "--quiet"])
    return out


def test_build_sets_up_every_binary_the_commands_run_llama_server_included(capsys):
    """`simlab llama-cpp build` (what .ci/run and a user run once) builds llama-server too, so that
    `llama-cpp serve` does not build it in its first run (4 minutes of this suite's, before)."""
    main(["llama-cpp", "build"])
    built = [Path(line) for line in capsys.readouterr().out.split()]
    assert [p.name for p in built] == ["llama-speculative-simple", "simlab-llama-trace", "llama-server"]
    assert all(p.is_file() for p in built)


def _run(trace, tmp_path, p_min: float, draft_min: int) -> pd.DataFrame:
    out = tmp_path / f"p{p_min}-m{draft_min}.csv"
    main(["llama-cpp", "run", "--trace", str(trace), "-n", str(N_PREDICT), "--draft-max", str(DRAFT_MAX),
          "--p-min", str(p_min), "--draft-min", str(draft_min), "--out", str(out), "--quiet"])
    return pd.read_csv(out)


@pytest.mark.parametrize(("p_min", "draft_min"), [(0.0, 0), (0.9, 0), (0.9, 2)])
def test_llama_cpp_counts_equal_the_prediction(trace, tmp_path, p_min, draft_min):
    table = _run(trace, tmp_path, p_min, draft_min)
    assert len(table) == 2
    for counter in ("n_drafted", "n_accept", "n_predict"):
        assert table[f"measured_{counter}"].tolist() == table[f"predicted_{counter}"].tolist(), counter
    assert (table["measured_n_predict"] > N_PREDICT).all()  # speculative-simple overshoots -n
    if p_min:  # confidence stops shortened some drafts: fewer verified than D per round
        rounds = table["measured_n_predict"] - table["measured_n_accept"]
        assert (table["measured_n_drafted"] < DRAFT_MAX * rounds).any()
    if draft_min:  # the binary discarded short drafts: the rule without them predicts other counts
        without = compare.predict(read_trace(trace), N_PREDICT, DRAFT_MAX, p_min, 0).set_index("prompt_id")
        measured = table.set_index("prompt_id")["measured_n_drafted"].sort_index()
        assert (measured != without["predicted_n_drafted"].sort_index()).any()


def test_llama_server_under_spread_arrivals_makes_the_predicted_counts(trace, tmp_path, capsys):
    """The same server under a Poisson schedule (4 requests a second, 3 requests into 2 slots:
    the later ones arrive while others decode and are prefilled beside them, or wait for a slot):
    every request's counts are the prediction's, each request's TTFT and end-to-end latency are
    measured and predicted, and the run's means are compared (``--json``)."""
    import json

    out = tmp_path / "arrivals.csv"
    main(["llama-cpp", "serve", "--trace", str(trace), "--batch", "2", "-n", "24", "--draft-max", str(DRAFT_MAX),
          "--p-min", "0.7", "--repeats", "1", "--rate", "4", "--requests", "3", "--out", str(out), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["arrivals"] == {"poisson_rate": 4.0, "requests": 3, "seed": 0}
    [run] = summary["bursts"]
    assert run["requests_matching_counts"] == "3/3" and run["requests_on_the_traces_path"] == "3/3"
    assert run["measured_ttft_mean_s"] > 0 and run["predicted_ttft_mean_s"] > 0
    table = pd.read_csv(out)
    assert table["prompt_id"].tolist() == [0, 1, 0]  # request i replays prompt i mod N
    assert (table["measured_e2e_s"] > table["measured_ttft_s"]).all()
    assert (table["predicted_e2e_s"] > table["predicted_ttft_s"]).all()


def test_the_batch_probe_times_two_sequences_decoded_together():
    """The trace tool's batch axis on SmolLM2 (tiny: one context, k = 1, 2, one repeat): the
    forwards of two sequences at once get rows of batch 2, each a positive time, and every batch
    size its plain decoding step (``target_step``) beside the verifications; one sequence also
    its prefills."""
    from simlab.engines.llama_cpp import build as llama_cpp
    from simlab.engines.llama_cpp.args import ModelPair
    from simlab.engines.llama_cpp.record import EnginePrompt, Probe, reprobe
    from simlab.models.install import gguf_file

    install("smollm2")
    gguf = gguf_file("smollm2")
    probe = Probe(ks=(1,), contexts=(32,), repeats=1, batches=(1, 2), batch_ks=(1, 2))
    lat = reprobe(llama_cpp.build_trace_tool().binary, ModelPair(gguf, gguf, 2), EnginePrompt(0, "p", "def add(a, b):"),
                  probe)
    rows = sorted(zip(lat["batch"], lat["op"], lat["k"], lat["context_len"]))
    # a prompt's prefill (the target's and the draft's) is timed for one sequence only
    assert rows == [(1, "draft_prefill", 1, 32), (1, "draft_step", 1, 32), (1, "target_forward", 1, 32),
                    (1, "target_prefill", 1, 32), (1, "target_step", 1, 32),
                    (2, "draft_step", 1, 32), (2, "target_forward", 1, 32), (2, "target_forward", 2, 32),
                    (2, "target_step", 1, 32)]
    assert (lat["seconds"] > 0).all()


def test_a_reprobe_gives_a_trace_from_before_the_plain_step_its_steps(trace, tmp_path, capsys, monkeypatch):
    """A trace whose latencies lack llama.cpp's plain decoding step (recorded before the tool
    timed it) warns that its speedups come out high; ``record --out T --reprobe`` times T's steps
    with the real tool, the step among them, and keeps its tokens."""
    import shutil
    from dataclasses import replace

    from simlab.trace.io import write_trace

    old = read_trace(trace)
    monkeypatch.setattr("simlab.sim.executor._warned", set())  # the warning is printed once per process
    path = tmp_path / "before-target-step"
    shutil.copytree(trace, path)
    write_trace(replace(old, latency=old.latency[old.latency["op"] != "target_step"]), path)
    simulate = ["simulate", "--trace", str(path), "--policy", "llama-cpp"]
    main(simulate)
    assert "no plain decoding steps" in capsys.readouterr().err
    main(["llama-cpp", "record", "--out", str(path), "--reprobe"])
    new = read_trace(path)
    pd.testing.assert_frame_equal(new.positions, old.positions)
    assert set(new.latency["op"]) == {"draft_step", "target_forward", "target_step", "target_prefill", "draft_prefill"}
    assert (new.latency["seconds"] > 0).all() and new.manifest.extra["reprobe"]["probe_seconds"] > 0
    capsys.readouterr()
    main(simulate)
    assert "no plain decoding steps" not in capsys.readouterr().err


def test_llama_server_slots_make_the_predicted_counts(trace, tmp_path):
    """A real llama-server with two slots, one burst of the trace's two prompts decoded together
    (SmolLM2 drafting for itself, p-min 0.7 so the two slots' drafts end at different lengths):
    every request's tokens, verified drafts and accepted drafts are serve's prediction; and with
    ``--baseline`` a server of the target alone makes the tokens predicted by ``ad``. The
    threshold is 0.07 or more from every confidence of these prompts' first 26 positions:
    llama.cpp's batched forwards need not be bit-identical to one sequence's, and at p-min 0.9
    HumanEval/0 (a confidence of 0.8935 at position 13) drafted one token more than predicted in
    a batch of two and exactly as predicted alone (2026-11-25)."""
    out, logs = tmp_path / "serve.csv", tmp_path / "logs"
    main(["llama-cpp", "serve", "--trace", str(trace), "--batch", "2", "-n", "24", "--draft-max", str(DRAFT_MAX),
          "--p-min", "0.7", "--repeats", "1", "--out", str(out), "--server-logs", str(logs), "--baseline"])
    log = (logs / "b2-r1.log").read_text()
    from simlab.models.install import gguf_file

    gguf = str(gguf_file("smollm2"))
    assert "SmolLM2" in log and gguf not in log  # the server's log, kept without this machine's paths
    frame = pd.read_csv(out)
    plain, table = frame[frame["policy"] == "ad"], frame[frame["policy"] == "llama-cpp"]
    assert len(plain) == 2 and (plain["measured_tokens"] == plain["predicted_tokens"]).all()
    assert (plain["measured_drafted"] == 0).all() and (plain["diverged_at"] == -1).all()
    assert (logs / "ad-b2-r1.log").exists()  # the plain server's own log, beside the speculative one's
    assert len(table) == 2 and (table["batch"] == 2).all()
    for counter in ("tokens", "drafted", "accepted"):
        assert table[f"measured_{counter}"].tolist() == table[f"predicted_{counter}"].tolist(), counter
    assert (table["measured_tokens"] == 24).all() and (table["stop_type"] == "limit").all()
    assert (table["diverged_at"] == -1).all()  # the server's tokens are the trace's greedy path
    rounds = table["measured_tokens"] - 1 - table["measured_accepted"]
    assert (table["measured_drafted"] < DRAFT_MAX * rounds).any()  # confidence stops shortened drafts

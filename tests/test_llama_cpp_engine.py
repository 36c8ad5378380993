"""llama.cpp as an engine, without building it: reading its counters and the trace tool's rows."""

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.engines.llama_cpp import run as llama_run
from simlab.engines.llama_cpp import record as llama_record
from simlab.engines.llama_cpp.args import ModelPair, drafting_args
from simlab.live import llama_cpp as compare
from simlab.trace.schema import TABLES

# The tail of a llama-speculative-simple log, as speculative-simple.cpp's LOG_INF lines print it.
LOG = """
encoded   57 tokens in    0.212 seconds, speed:  268.868 t/s
decoded   66 tokens in    1.734 seconds, speed:   38.062 t/s

n_draft   = 3
n_predict = 66
n_drafted = 51
n_accept  = 49
accept    = 96.078%
"""


def test_the_counters_of_a_speculative_simple_log_are_read():
    assert llama_run.parse(LOG) == llama_run.EngineRun(n_predict=66, n_drafted=51, n_accept=49,
                                                       decode_seconds=1.734, tokens_per_s=38.062)


def test_a_log_without_a_counter_is_one_clear_error():
    with pytest.raises(SimlabError, match="printed no n_accept"):
        llama_run.parse(LOG.replace("n_accept ", "n_acc "))


def test_both_programs_get_the_same_model_arguments_and_only_the_binary_the_rules():
    pair = ModelPair("t.gguf", "d.gguf", 2)
    args = pair.args("hi", 10)
    assert args[:4] == ["-m", "t.gguf", "-md", "d.gguf"] and "--temp" in args and args[args.index("-n") + 1] == "10"
    assert drafting_args(4, 0, 0.5) == ["--spec-draft-n-max", "4", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0.5"]


ROWS = "\n".join([
    "P\t0\t7\t7\t1\t0\t1\t1\t1\t1",
    "P\t1\t5\t9\t0.625\t1.5\t0.25\t0.75\t0.125\t0.5",
    "R\t1\t1\t11\t0.5\t2.25",
    "H\t40\t2\tlength",
    "L\ttarget_forward\t3\t128\t0\t0.0125\t1",
    "L\tdraft_step\t1\t512\t2\t0.004\t4",
])


def test_the_trace_tools_rows_become_trace_tables_with_the_schemas_columns():
    tables = llama_record.parse_rows(ROWS, llama_record.EnginePrompt(3, "humaneval/HumanEval/0", "text"))
    for name, df in tables.items():
        assert list(df.columns) == list(TABLES[name])
    pos = tables["positions"].iloc[1]
    assert (pos.prompt_id, pos.pos, pos.target_token, pos.draft_token) == (3, 1, 5, 9)
    assert (pos.draft_conf, pos.q_target, pos.p_draft) == pytest.approx((0.625, 0.25, 0.125))
    assert tables["prompts"].iloc[0][["prompt_len", "n_tokens", "stop"]].tolist() == [40, 2, "length"]
    assert tables["rollouts"].iloc[0][["pos", "step", "token"]].tolist() == [1, 1, 11]
    lat = tables["latency"]
    assert lat[["op", "k", "context_len", "layer", "repeat", "batch"]].values.tolist() == [
        ["target_forward", 3, 128, -1, 0, 1], ["draft_step", 1, 512, -1, 2, 4]]
    assert lat["seconds"].tolist() == pytest.approx([0.0125, 0.004]) and not lat["corun"].any()


def test_a_batch_probes_rows_keep_their_batch_size_and_hold_no_path():
    lat = llama_record.parse_latency("L\ttarget_forward\t2\t64\t0\t0.25\t2\nL\tdraft_step\t1\t64\t0\t0.125\t2")
    assert lat[["op", "k", "batch"]].values.tolist() == [["target_forward", 2, 2], ["draft_step", 1, 2]]
    with pytest.raises(SimlabError, match="path in a batch probe"):
        llama_record.parse_latency(ROWS)
    with pytest.raises(SimlabError, match="without its batch size"):
        llama_record.parse_latency("L\ttarget_forward\t2\t64\t0\t0.25")


def _fake_tool(calls: list[list[str]]):
    """subprocess.run standing in for the trace tool: rows that echo the BATCH and KS it was given."""
    def run(cmd, **kwargs):
        calls.append(cmd)
        out, ks, contexts, batch = cmd[1], cmd[3].split(","), cmd[4].split(","), cmd[6]
        rows = ["L\ttarget_forward\t%s\t%s\t0\t0.5\t%s" % (k, c, batch) for c in contexts for k in ks]
        rows += ["L\tdraft_step\t1\t%s\t0\t0.25\t%s" % (c, batch) for c in contexts]
        if batch == "1":
            rows += ["P\t0\t7\t7\t1\t0\t1\t1\t1\t1", "H\t4\t1\tlength"]
        Path(out).write_text("\n".join(rows))
        return subprocess.CompletedProcess(cmd, 0, "", "")
    return run


def test_a_reprobe_with_batches_runs_the_tool_once_per_batch_size_with_its_slots(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(llama_record.subprocess, "run", _fake_tool(calls))
    probe = llama_record.Probe(ks=(1, 2, 3), contexts=(128, 300), repeats=1, batches=(1, 2, 4), batch_ks=(1, 5))
    lat = llama_record.reprobe(Path("tool"), ModelPair("t.gguf", "d.gguf", 2), llama_record.EnginePrompt(0, "x", "t"),
                               probe)
    assert [cmd[6] for cmd in calls] == ["1", "2", "4"]  # BATCH
    assert [cmd[3] for cmd in calls] == ["1,2,3", "1,5", "1,5"]  # the batch probe's own ks
    assert "-np" not in calls[0]
    for cmd, b in zip(calls[1:], (2, 4)):
        assert cmd[cmd.index("-np") + 1] == str(b)
        assert int(cmd[cmd.index("-c") + 1]) >= b * (300 + 5)  # every sequence's cells: -c / -np
    counts = lat.groupby(["batch", "op"]).size().to_dict()
    assert counts == {(1, "draft_step"): 2, (1, "target_forward"): 6, (2, "draft_step"): 2,
                      (2, "target_forward"): 4, (4, "draft_step"): 2, (4, "target_forward"): 4}
    assert list(lat.columns) == list(TABLES["latency"])


def test_a_probe_without_a_batch_axis_runs_the_tool_once(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(llama_record.subprocess, "run", _fake_tool(calls))
    lat = llama_record.reprobe(Path("tool"), ModelPair("t.gguf", "d.gguf", 2), llama_record.EnginePrompt(0, "x", "t"),
                               llama_record.Probe(ks=(1,), contexts=(8,), repeats=1))
    assert len(calls) == 1 and set(lat["batch"]) == {1}
    with pytest.raises(SimlabError, match=">= 1"):
        llama_record.Probe(batches=(0, 2))


def test_the_batch_option_reads_sizes_and_refuses_nonsense():
    from simlab.cli.llama_cpp import _batches

    assert _batches("1,2,4,8") == (1, 2, 4, 8) and _batches("1-2") == (1, 2)
    for bad in ("0,2", "two", ""):
        with pytest.raises(SimlabError, match="--batch"):
            _batches(bad)


def test_an_unknown_row_or_a_missing_prompt_row_is_refused():
    prompt = llama_record.EnginePrompt(0, "x", "t")
    with pytest.raises(SimlabError, match="unknown row"):
        llama_record.parse_rows("Q\t1", prompt)
    with pytest.raises(SimlabError, match="no prompt row"):
        llama_record.parse_rows("P\t0\t7\t7\t1\t0\t1\t1\t1\t1", prompt)


def test_measured_and_predicted_are_matched_per_prompt_and_summed():
    measured = pd.DataFrame({"prompt_id": [0, 1], "source": ["a", "b"], "measured_n_drafted": [9, 6],
                             "measured_n_accept": [9, 2], "measured_n_predict": [12, 10],
                             "measured_decode_s": [1.0, 2.0], "measured_tokens_per_s": [12.0, 5.0]})
    predicted = pd.DataFrame({"prompt_id": [1, 0], "predicted_n_drafted": [6, 9], "predicted_n_accept": [3, 9],
                              "predicted_n_predict": [10, 12], "predicted_decode_s": [2.5, 1.0],
                              "predicted_tokens_per_s": [4.0, 12.0]})
    table = compare.compare(predicted, measured)
    assert table["match_n_accept"].tolist() == [True, False]
    assert table["error_tokens_per_s"].tolist() == pytest.approx([0.0, -0.2])
    s = compare.summary(table)
    assert (s["measured_n_accept"], s["predicted_n_accept"], s["prompts_matching_n_accept"]) == (11, 12, 1)
    assert s["error_tokens_per_s"] == pytest.approx((22 / 3.5) / (22 / 3.0) - 1, abs=1e-4)


def test_the_prediction_counts_verified_drafts_as_llama_cpp_does_not_the_dropped_one():
    from tests.helpers import hand_trace

    # test_policies' p_min case: rounds (1, 2 tokens, 1 accepted) after a dropped second draft,
    # (3, 4, 3), (7, 1, 0): five drafted, four verified (n_drafted), four accepted
    trace = hand_trace(["1" * 8], conf=[[0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.9, 0.9]])
    row = compare.predict(trace, n_predict=0, draft_max=3, p_min=0.5).iloc[0]
    assert (row.predicted_n_drafted, row.predicted_n_accept, row.predicted_n_predict) == (4, 4, 7)
    # --draft-min 2 (test_policies' draft_min case): the one-token draft at 1 and the empty one at
    # 2 are discarded, so only the round at 3 adds to n_drafted
    row = compare.predict(trace, n_predict=0, draft_max=3, p_min=0.5, draft_min=2).iloc[0]
    assert (row.predicted_n_drafted, row.predicted_n_accept, row.predicted_n_predict) == (3, 3, 7)


def test_a_split_gguf_is_joined_once_under_its_full_name_and_checked(tmp_path, monkeypatch):
    import hashlib
    import importlib

    from simlab.models.catalog import ModelSpec, PackagedFile

    install = importlib.import_module("simlab.models.install")

    parts = [tmp_path / "a.bin", tmp_path / "b.bin"]
    parts[0].write_bytes(b"GGUF-first-")
    parts[1].write_bytes(b"second")
    spec = ModelSpec("tiny-0.5b", "two parts", (PackagedFile("p1==1", "p1", "a.bin"), PackagedFile("p2==1", "p2", "b.bin")),
                     hashlib.sha256(b"GGUF-first-second").hexdigest(), (2,))
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(install.CATALOG, spec.name, spec)
    monkeypatch.setattr(install, "_pip_install", lambda *a: None)
    monkeypatch.setattr(install, "_locate", lambda part: tmp_path / part.pattern)
    gguf = install.gguf_file("tiny-0.5b")
    assert gguf == tmp_path / "cache" / "models" / "tiny-0.5b.gguf" and gguf.read_bytes() == b"GGUF-first-second"
    parts[0].unlink()  # joined once: the parts are not read again
    assert install.gguf_file("tiny-0.5b") == gguf
    gguf.write_bytes(b"tampered")
    with pytest.raises(SimlabError, match="sha256"):
        install.gguf_file("tiny-0.5b")


def test_serve_tells_a_llama_cpp_trace_without_batches_to_record_them_with_its_own_recorder():
    from types import SimpleNamespace

    from simlab.cli.serve import batch_probe_hint

    assert "simlab llama-cpp record --out TRACE --reprobe --batch" in batch_probe_hint(SimpleNamespace(extra={"engine": "llama.cpp"}))
    assert "--keep-rollouts" in batch_probe_hint(SimpleNamespace(extra={}))


def test_a_reprobe_keeps_the_traces_tokens_and_replaces_its_steps(tmp_path, monkeypatch, capsys):
    """``llama-cpp record --out T --reprobe``: T's steps timed again (here by a stand-in tool) and
    kept in T, its prompts and positions unchanged, the manifest saying where the tokens were
    recorded and how the steps were probed; without ``--batch`` the batch sizes T already has."""
    from dataclasses import replace

    from simlab.cli import llama_cpp as cli
    from simlab.cli import main
    from simlab.record.machine import hardware_name
    from simlab.trace.io import read_trace, write_trace
    from tests.helpers import hand_trace

    calls: list[list[str]] = []
    monkeypatch.setattr(llama_record.subprocess, "run", _fake_tool(calls))
    monkeypatch.setattr(cli, "_tools", lambda jobs: (Path("speculative-simple"), Path("tool")))
    monkeypatch.setattr(cli, "_pair", lambda target, draft, threads: ModelPair("t.gguf", "d.gguf", threads))
    old = hand_trace(["1101111111", "1111111111"])
    old = replace(old, manifest=replace(old.manifest, hardware="elsewhere", extra={"engine": "llama.cpp"}))
    path = write_trace(old, tmp_path / "trace")

    args = ["llama-cpp", "record", "--out", str(path), "--reprobe", "--batch", "1,2"]
    monkeypatch.setattr("sys.argv", ["simlab", *args])  # the command the manifest keeps
    main(args)
    new = read_trace(path)
    for name in ("prompts", "positions"):
        pd.testing.assert_frame_equal(new.table(name), old.table(name), check_dtype=False)
    assert sorted(set(zip(new.latency["batch"], new.latency["op"]))) == [
        (1, "draft_step"), (1, "target_forward"), (2, "draft_step"), (2, "target_forward")]
    assert (new.latency["seconds"] == 0.5).sum() == 2 * 9 * 2  # the tool's rows: 9 ks x 2 contexts, twice
    m = new.manifest
    assert m.hardware == hardware_name("cpu") and m.extra["tokens_recorded_on"] == "elsewhere"
    assert m.extra["reprobe"]["probe"]["batches"] == [1, 2] and m.extra["resumed"] == [f"simlab llama-cpp record --out {path} --reprobe --batch 1,2"]
    assert [cmd[6] for cmd in calls] == ["1", "2"]  # BATCH, as asked
    assert "its prompts and tokens unchanged" in capsys.readouterr().out

    calls.clear()
    main(["llama-cpp", "record", "--out", str(path), "--reprobe"])
    assert [cmd[6] for cmd in calls] == ["1", "2"]  # the trace's own batch sizes
    assert read_trace(path).manifest.extra["tokens_recorded_on"] == "elsewhere"  # not this machine, twice re-probed

    plain = write_trace(hand_trace(["1111"]), tmp_path / "hf")
    with pytest.raises(SystemExit) as exit_:
        main(["llama-cpp", "record", "--out", str(plain), "--reprobe"])
    assert exit_.value.code == 2 and "not recorded with llama.cpp" in capsys.readouterr().err

"""The commands as a user runs them: real subprocesses, real files."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from simlab.analytic import closed_form as analytic
from simlab.common.metrics import PLAIN
from simlab.common.metrics import SUMMARY_KEYS
from simlab.trace.io import read_trace
from tests.helpers import put_table

JSON_KEYS = {*SUMMARY_KEYS, "acceptance_per_position"}


def simlab(*args, check=True, env=None):
    proc = subprocess.run([sys.executable, "-m", "simlab", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"simlab {args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "iid"
    simlab("synth", "--kind", "iid", "--alpha", "0.8", "--c", "0.1", "--prompts", "4", "--tokens", "300", "--out", out)
    return out


def test_simulate_json_has_the_documented_keys(synthetic):
    out = json.loads(simlab("simulate", "--trace", synthetic, "--policy", "sd", "--gamma", "5", "--json").stdout)
    assert JSON_KEYS <= set(out)
    assert out["policy"] == "sd" and out["params"]["gamma"] == 5 and out["trace_kind"] == "synthetic"
    assert out["tokens"] == 4 * 299
    # Leviathan et al.'s closed form at the trace's own acceptance rate (0.81 on this seed):
    # S = (1 - α^6) / ((1 - α)(5c + 1)) = 2.52. Within 2%: the acceptances of 1,196 positions are
    # only roughly i.i.d., and each prompt's last round is cut by its end (measured: 0.7% off).
    positions = read_trace(synthetic).positions
    alpha = (positions.draft_token == positions.target_token).mean()
    assert out["speedup"] == pytest.approx(analytic.speedup(alpha, 0.1, 5), rel=0.02)


def test_simulate_prints_a_table_with_every_metric_in_plain_words_and_what_each_means(synthetic):
    text = simlab("simulate", "--trace", synthetic, "--policy", "sd", "--gamma", "3", env={"COLUMNS": "200"}).stdout
    lines = [" ".join(line.split()) for line in text.splitlines()]
    for key in SUMMARY_KEYS:
        label, meaning = PLAIN[key]
        assert any(line.startswith(f"│ {label} │") for line in lines), label  # its row
        assert any(line.startswith(f"{label} {meaning.split()[0]}") for line in lines), label  # what it is, below
    assert "SYNTHETIC" in text


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_simulate_writes_per_prompt_results(synthetic, tmp_path, suffix):
    out = tmp_path / f"per_prompt{suffix}"
    simlab("simulate", "--trace", synthetic, "--policy", "oracle", "--out", out)
    df = pd.read_csv(out) if suffix == ".csv" else pd.read_parquet(out)
    assert list(df.prompt_id) == [0, 1, 2, 3]
    assert set(SUMMARY_KEYS) <= set(df.columns)


def test_simulate_seed_reproducible(synthetic):
    a = simlab("simulate", "--trace", synthetic, "--seed", "3", "--json").stdout
    b = simlab("simulate", "--trace", synthetic, "--seed", "3", "--json").stdout
    assert a == b


def test_timeline_is_chrome_trace_json(synthetic, tmp_path):
    out = tmp_path / "timeline.json"
    simlab("simulate", "--trace", synthetic, "--gamma", "4", "--timeline", out)
    events = json.loads(out.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in slices} == {0, 1}
    assert all(e["dur"] > 0 for e in slices)


def one_line_error(proc, *fragments):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err


def test_missing_trace_is_one_line(tmp_path):
    one_line_error(simlab("simulate", "--trace", tmp_path / "missing", check=False), "trace not found")


def test_corrupt_trace_is_one_line(synthetic, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(synthetic, bad)
    (bad / "positions.parquet").write_bytes(b"garbage")
    one_line_error(simlab("simulate", "--trace", bad, check=False), "positions.parquet does not match its sha256")


def test_negative_latency_is_one_line(synthetic, tmp_path):
    import shutil

    bad = tmp_path / "neg"
    shutil.copytree(synthetic, bad)
    lat = pd.read_parquet(bad / "latency.parquet")
    lat.loc[0, "seconds"] = -1.0
    put_table(bad, "latency", lat)
    one_line_error(simlab("simulate", "--trace", bad, check=False), "negative")


def test_unknown_policy_is_one_line(synthetic):
    one_line_error(simlab("simulate", "--trace", synthetic, "--policy", "nope", check=False), "unknown policy 'nope'")


def test_gamma_below_one_is_one_line(synthetic):
    one_line_error(simlab("simulate", "--trace", synthetic, "--gamma", "0", check=False), "gamma must be an integer >= 1")


def test_parameter_the_policy_lacks_is_one_line(synthetic):
    one_line_error(simlab("simulate", "--trace", synthetic, "--policy", "ad", "--gamma", "3", check=False),
                   "policy 'ad' has no parameter")


def test_latency_profile_overrides_the_trace_samples(synthetic, tmp_path):
    from simlab.latency.model import TableLatency, save_profile

    lat = TableLatency.from_samples(pd.read_parquet(synthetic / "latency.parquet"))
    # the same profile with a 10x slower draft: SD must get slower
    prof = lat.to_profile()
    for d in prof["draft_step"]:
        d["seconds"] = [s * 10 for s in d["seconds"]]
    slow = TableLatency.from_profile(prof)
    save_profile(slow, tmp_path / "slow.json")
    base = json.loads(simlab("simulate", "--trace", synthetic, "--json").stdout)
    slowed = json.loads(simlab("simulate", "--trace", synthetic, "--latency", tmp_path / "slow.json", "--json").stdout)
    assert slowed["speedup"] < base["speedup"]
    assert slowed["target_calls"] == base["target_calls"]


def test_analytic_json():
    out = json.loads(simlab("analytic", "--alpha", "0.8", "--c", "0.1", "--gamma", "5", "--json").stdout)
    assert out["expected_tokens"] == pytest.approx((1 - 0.8**6) / 0.2)
    assert out["speedup"] == pytest.approx(out["expected_tokens"] / 1.5)
    assert out["optimal_gamma"] >= 1


def test_analytic_bad_alpha_is_one_line():
    one_line_error(simlab("analytic", "--alpha", "1.5", check=False), "alpha must be in [0, 1]")


@pytest.mark.parametrize("kind", ["markov", "table"])
def test_synth_other_kinds(tmp_path, kind):
    extra = []
    if kind == "table":
        csv = tmp_path / "table.csv"
        csv.write_text("conf_low,conf_high,count,accepted\n0.0,0.5,100,30\n0.5,1.0,300,270\n1.0,1.0,600,598\n")
        extra = ["--table", csv]
    out = tmp_path / kind
    simlab("synth", "--kind", kind, "--prompts", "2", "--tokens", "500", "--out", out, *extra)
    res = json.loads(simlab("simulate", "--trace", out, "--json").stdout)
    assert res["tokens"] == 2 * 499


def test_synth_table_without_csv_is_one_line(tmp_path):
    one_line_error(simlab("synth", "--kind", "table", "--out", tmp_path / "x", check=False), "--kind table needs --table")


def test_help_on_every_command():
    for cmd in ("simulate", "synth", "analytic"):
        text = simlab(cmd, "--help").stdout
        assert "Usage" in text and "--" in text

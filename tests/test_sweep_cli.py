"""`simlab sweep` and `simlab plot` as a user runs them: real subprocesses, real files."""

import json
import os
import signal
import subprocess
import sys
import time

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from simlab.common.table_file import read_frame
from simlab.plots import save
from simlab.plots.frontier import frontier_figure
from simlab.plots.live import live_figure
from simlab.plots.mapping import mapping_figure, trace_mapping
from simlab.plots.sensitivity import sensitivity_figure
from simlab.plots.timeline import timeline_figure
from simlab.sim.timeline import read_chrome_trace
from simlab.trace.io import read_trace, write_trace
from simlab.trace.synth import SynthSpec, synth_trace
from tests.test_cli import one_line_error, simlab


def draws(path, expected, tmp_path) -> bool:
    """Whether the PNG at ``path`` (written by the CLI) has the pixels of the figure
    ``expected`` (built by the library from the same data), and is not blank: the command
    plotted what it was given, not merely some valid file."""
    pixels = mpimg.imread(path)
    want = mpimg.imread(save(expected, tmp_path / f"expected-{path.name}"))
    return pixels.shape == want.shape and np.array_equal(pixels, want) and pixels[..., :3].std() > 0.05


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "iid"
    write_trace(synth_trace(SynthSpec(alpha=0.8, c=0.1, prompts=3, tokens=150, seed=2), command="test"), out)
    return out


@pytest.fixture(scope="module")
def results(trace_dir, tmp_path_factory):
    """One sweep, shared by the plot tests."""
    out = tmp_path_factory.mktemp("sweep") / "results.parquet"
    cache = out.parent / "cache"
    proc = simlab("sweep", "--trace", trace_dir, "--policy", "sd:gamma=1..6", "--policy", "oracle:max_draft=2..8:2",
                  "--policy", "ad", "--out", out, "--cache", cache, "--workers", "2")
    return out, cache, proc.stdout


def test_sweep_prints_the_table_and_writes_every_metric(results):
    out, _, stdout = results
    table = pd.read_parquet(out)
    assert len(table) == 6 + 4 + 1
    assert {"policy", "label", "gamma", "max_draft", "speedup", "cost", "mat", "target_calls", "pareto",
            "reference_gamma", "reference_speedup", "trace", "latency", "seed", "topology"} <= set(table.columns)
    for label in table["label"]:
        assert label in stdout
    starred = [line for line in stdout.splitlines() if line.startswith("│ ★")]
    assert len(starred) == table["pareto"].sum() >= 1
    assert "11 configurations: 0 from the cache, 11 simulated" in stdout
    assert f"wrote {out}" in stdout


def test_plot_acceptance_reads_the_sweep_table(results, tmp_path):
    out, _, _ = results
    csv = tmp_path / "results.csv"
    pd.read_parquet(out).to_csv(csv, index=False)  # lists as Python reprs: read_frame must cope
    for table in (out, csv):
        simlab("plot", "acceptance", table, "-o", tmp_path / "acceptance.png", "--policy", "sd")
        assert (tmp_path / "acceptance.png").stat().st_size > 0


def test_sweep_table_fits_80_columns(trace_dir, tmp_path):
    # a subprocess's Rich console is 80 columns wide: no label may be cut (…) or wrapped
    proc = simlab("sweep", "--trace", trace_dir, "--policy", "spide:tau=0.6,0.7", "--policy", "dv",
                  "--policy", "hf-confidence:max_draft=4", "--cache", tmp_path / "cache", "--workers", "1")
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│")]
    for label in ("spide(tau=0.6)", "spide(tau=0.7)", "dv", "hf-confidence(max_draft=4)"):
        assert any(f" {label} " in row for row in rows), label
    assert "…" not in proc.stdout and max(len(line) for line in proc.stdout.splitlines()) <= 80


def test_sweep_rerun_reads_the_cache_and_writes_csv(results, trace_dir, tmp_path):
    out, cache, _ = results
    csv = tmp_path / "again.csv"
    proc = simlab("sweep", "--trace", trace_dir, "--policy", "sd:gamma=1..6", "--out", csv, "--cache", cache)
    assert "6 configurations: 6 from the cache, 0 simulated" in proc.stdout
    first = pd.read_parquet(out).set_index("label")
    again = pd.read_csv(csv).set_index("label")
    assert (again["speedup"] == first.loc[again.index, "speedup"]).all()


def test_grid_file(trace_dir, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('[[policy]]\nname = "sd"\ngamma = [2, 4]\n\n[[policy]]\nname = "oracle"\nmax_draft = "3..4"\n')
    proc = simlab("sweep", "--trace", trace_dir, "--grid", grid, "--no-cache", "--workers", "1")
    for label in ("sd(gamma=2)", "sd(gamma=4)", "oracle(max_draft=3)", "oracle(max_draft=4)"):
        assert label in proc.stdout
    assert "4 configurations" in proc.stdout


@pytest.mark.parametrize("args, fragment", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--policy", "sd:gamma=1..x"], "bad range '1..x'"),
    (["--policy", "sd:gamma=0"], "gamma must be an integer >= 1"),
    (["--policy", "sd:tau=0.5"], "policy 'sd' has no parameter(s) ['tau']"),
    ([], "empty grid"),
    (["--policy", "sd", "--out", "results.xlsx"], "--out must end in .csv or .parquet"),
])
def test_bad_sweeps_are_one_line(trace_dir, tmp_path, args, fragment):
    proc = simlab("sweep", "--trace", trace_dir, "--cache", tmp_path / "cache", *args, check=False)
    one_line_error(proc, fragment)
    assert not (tmp_path / "cache").exists()


def test_ctrl_c_keeps_finished_rows_and_a_rerun_resumes(tmp_path):
    trace = tmp_path / "long"
    write_trace(synth_trace(SynthSpec(prompts=2, tokens=1500, seed=0), command="test"), trace)
    cache = tmp_path / "cache"
    args = [sys.executable, "-m", "simlab", "sweep", "--trace", str(trace), "--policy", "oracle:max_draft=20..80",
            "--cache", str(cache)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    store = None
    while time.monotonic() < deadline and proc.poll() is None:
        stores = list(cache.glob("*.jsonl")) if cache.exists() else []
        if stores and len(stores[0].read_text().splitlines()) >= 2:
            store = stores[0]
            break
        time.sleep(0.05)
    assert store is not None, "the sweep wrote no rows"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    done = [json.loads(line) for line in store.read_text().splitlines()]
    assert 2 <= len(done) < 61
    assert f"configurations done; they are kept in {store}" in stderr and "Traceback" not in stderr
    finished = ",".join(str(row["params"]["max_draft"]) for row in done)
    rerun = simlab("sweep", "--trace", trace, "--policy", f"oracle:max_draft={finished}", "--cache", cache)
    assert f"{len(done)} configurations: {len(done)} from the cache, 0 simulated" in rerun.stdout


# -- plot commands -----------------------------------------------------------------------------

def test_plot_frontier_and_tau(results, tmp_path):
    out, _, _ = results
    simlab("plot", "frontier", out, "-o", tmp_path / "frontier.png", "--title", "F")
    assert draws(tmp_path / "frontier.png", frontier_figure(read_frame(out), "F"), tmp_path)
    simlab("plot", "tau", out, "--param", "gamma", "-o", tmp_path / "gamma.png", "--title", "G")
    assert draws(tmp_path / "gamma.png", sensitivity_figure(read_frame(out), "gamma", title="G"), tmp_path)
    simlab("plot", "tau", out, "--param", "gamma", "-o", tmp_path / "gamma.svg")
    assert b"<svg" in (tmp_path / "gamma.svg").read_bytes()[:400]
    one_line_error(simlab("plot", "tau", out, "-o", tmp_path / "tau.png", check=False), "no parameter 'tau'")
    one_line_error(simlab("plot", "frontier", tmp_path / "missing.parquet", "-o", tmp_path / "f.png", check=False),
                   "table not found")


def test_plot_mapping_of_a_trace_and_of_a_published_table(trace_dir, tmp_path):
    simlab("plot", "mapping", trace_dir, "-o", tmp_path / "mapping.png", "--title", "M")
    assert draws(tmp_path / "mapping.png", mapping_figure(trace_mapping(read_trace(trace_dir)), "M"), tmp_path)
    published = os.path.join(os.path.dirname(__file__), "..", "calibrate", "mapping", "spide-fig4-deepseek-1.3b-33b.csv")
    simlab("plot", "mapping", published, "-o", tmp_path / "fig4.pdf")
    assert (tmp_path / "fig4.pdf").read_bytes()[:4] == b"%PDF"


def test_plot_timeline_of_a_simulation(trace_dir, tmp_path):
    timeline = tmp_path / "timeline.json"
    simlab("simulate", "--trace", trace_dir, "--policy", "sd", "--gamma", "4", "--timeline", timeline)
    simlab("plot", "timeline", timeline, "-o", tmp_path / "timeline.png", "--to-ms", "200", "--title", "T")
    expected = timeline_figure(read_chrome_trace(timeline)[1], "T", None, 0.2)
    assert draws(tmp_path / "timeline.png", expected, tmp_path)
    one_line_error(simlab("plot", "timeline", trace_dir / "manifest.json", "-o", tmp_path / "t.png", check=False),
                   "is not a Chrome trace JSON file")


def test_plot_live(tmp_path):
    table = tmp_path / "live.csv"
    pd.DataFrame({"prompt_id": [0, 1], "measured_tokens_per_s": [2.0, 3.0],
                  "predicted_tokens_per_s": [2.2, 2.9]}).to_csv(table, index=False)
    simlab("plot", "live", table, "-o", tmp_path / "live.png", "--title", "L")
    assert draws(tmp_path / "live.png", live_figure(pd.read_csv(table), "tokens_per_s", "L"), tmp_path)
    one_line_error(simlab("plot", "live", table, "--metric", "speedup", "-o", tmp_path / "l.png", check=False),
                   "lacks columns ['measured_speedup', 'predicted_speedup']")

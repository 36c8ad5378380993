"""The README's figures about committed results, read from the README and checked against the
data they come from (``results/live/``), so that the two cannot drift apart.

A figure matches when the data, rounded as the README rounds it (to the digits it shows),
gives it: "1.43×" holds for 1.425 ≤ x < 1.435, "5.3%" for 5.25% ≤ x < 5.35%. A README sentence
that no longer reads as the patterns below fails the test too: change the test with the text.
"""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
LIVE = ROOT / "results" / "live"
# The README's live table names runs by policy; the files are results/live/qwen-<policy>.*
RUNS = {"sd": "qwen-sd", "pearl": "qwen-pearl", "spide": "qwen-spide"}
NUMBER = r"[−+-]?\d+(?:\.\d+)?"


def run_data(policy: str) -> tuple[dict, pd.DataFrame]:
    name = RUNS[policy]
    return json.loads((LIVE / f"{name}.json").read_text()), pd.read_csv(LIVE / f"{name}.csv")


def shows(text: str, value: float, scale: float = 1.0) -> bool:
    """Whether ``value`` (a ratio) rounds to the number written in ``text`` ("1.43×", "−0.9%",
    "16%"); ``scale`` 100 for percentages."""
    written = text.replace("−", "-").rstrip("×%")
    decimals = len(written.split(".")[1]) if "." in written else 0
    return round(value * scale, decimals) == pytest.approx(float(written))


def table_rows() -> dict[str, list[str]]:
    """The Qwen live table: policy -> its cells (the SmolLM2 table further down names them too)."""
    rows = {}
    for line in README.split("### Every live policy on SmolLM2")[0].splitlines():
        m = re.match(r"\| `(\w+)`[^|]*\|(.*)\|\s*$", line)
        if m and m.group(1) in RUNS:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_the_readme_has_the_live_table_for_every_committed_run():
    assert set(table_rows()) == set(RUNS)


@pytest.mark.parametrize("policy", sorted(RUNS))
def test_live_table_row_matches_the_committed_run(policy):
    summary, table = run_data(policy)
    prompts, measured, predicted, errors, spread, calls, lossless = table_rows()[policy]
    assert int(prompts) == summary["prompts"] == len(table)
    assert shows(measured, summary["measured_speedup"])
    assert shows(predicted, summary["predicted_speedup"])
    speedup_error, tps_error = errors.split(" / ")
    assert shows(speedup_error, table["error_speedup"].abs().median(), 100)
    assert shows(tps_error, table["error_tokens_per_s"].abs().median(), 100)
    assert shows(spread, table["measured_ad_spread"].median(), 100)
    same_calls = int((table["measured_target_calls"] == table["predicted_target_calls"]).sum())
    assert calls == f"{same_calls}/{len(table)}" == f"{len(table)}/{len(table)}"
    assert lossless == f"{int(table['lossless'].sum())}/{len(table)}"


def test_overall_speedup_errors_match_the_runs():
    sentence = re.search(r"The 5% aim holds for the overall speedups \(([^)]*)\)", README).group(1)
    stated = dict(re.findall(rf"`(\w+)` ({NUMBER}%)", sentence))
    assert set(stated) == set(RUNS)
    for policy, text in stated.items():
        summary, _ = run_data(policy)
        assert shows(text, summary["predicted_speedup"] / summary["measured_speedup"] - 1, 100), policy


def test_baseline_drift_figures_match_the_runs():
    # "differed by a median 16% during the `sd` run (up to 54%) and 8% during `pearl`'s"
    m = re.search(rf"a median ({NUMBER}%) during the `sd` run \(up to ({NUMBER}%)\) and ({NUMBER}%) during `pearl`'s",
                  README)
    _, sd = run_data("sd")
    _, pearl = run_data("pearl")
    assert shows(m.group(1), sd["measured_ad_spread"].median(), 100)
    assert shows(m.group(2), sd["measured_ad_spread"].max(), 100)
    assert shows(m.group(3), pearl["measured_ad_spread"].median(), 100)


def test_hugging_face_comparison_matches_the_sd_run():
    # "the same 169 target calls, and simlab's decoder was 1.13× its speed (prefill included)"
    m = re.search(rf"the same (\d+) target calls, and\s+simlab's decoder was ({NUMBER}×) its speed", README)
    summary, table = run_data("sd")
    assert int(m.group(1)) == summary["hf_target_calls"] == table["hf_target_calls"].sum() \
        == table["simlab_target_calls"].sum() == summary["measured_target_calls"]
    assert table["same_tokens"].all()
    assert shows(m.group(2), summary["simlab_vs_hf"])
    assert summary["simlab_vs_hf"] == pytest.approx(summary["simlab_tokens_per_s_incl_prefill"]
                                                    / summary["hf_tokens_per_s"])


def test_the_readme_shows_every_live_policy_on_smollm2_as_the_runs_give_it():
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_table", LIVE / "smollm2-all" / "table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.table()
    assert table in README
    assert table.count("\n| `") == 16  # every policy that decodes live: all but the oracle and the trees
    trees = module.table(LIVE / "smollm2-tree")
    assert trees in README
    assert trees.count("\n| `") == 3  # tree-static, eagle2, ags-tree
    assert module.table(LIVE / "qwen-tree") in README


def test_every_live_run_has_equal_target_calls_in_simulation_and_live():
    for csv in sorted([*LIVE.glob("*.csv"), *LIVE.glob("smollm2-all/*.csv"), *LIVE.glob("smollm2-tree/*.csv"),
                              *LIVE.glob("qwen-tree/*.csv")]):
        table = pd.read_csv(csv)
        assert (table["measured_target_calls"] == table["predicted_target_calls"]).all(), csv.name
        assert table["lossless"].all(), csv.name


@pytest.mark.slow
def test_closed_form_agreement_figure_matches_the_simulation():
    # "tokens per round and speedup agree within 1% (largest error seen 0.33%)": the grid of
    # tests/test_closed_form.py, every γ, both quantities.
    from simlab import analytic
    from simlab.sim.run import Simulator
    from simlab.trace.synth import SynthSpec, synth_trace, synthetic_latency
    from tests.test_closed_form import ALPHAS, CS, GAMMAS, TOKENS

    m = re.search(rf"agree within 1% \(largest error seen ({NUMBER}%)\)", README)
    worst = 0.0
    for alpha in ALPHAS:
        trace = synth_trace(SynthSpec(alpha=alpha, prompts=5, tokens=TOKENS // 5, rollout=0, seed=7), command="test")
        measured = (trace.positions.draft_token == trace.positions.target_token).mean()
        for c in CS:
            for slope in (0.0, 0.1):
                trace.latency = synthetic_latency(SynthSpec(c=c, verify_slope=slope, tokens=TOKENS // 5))
                sim = Simulator(trace)
                for gamma in GAMMAS:
                    s = sim.run("sd", {"gamma": gamma}, with_cost=False).summary
                    worst = max(worst,
                                abs(s.tokens / s.target_calls / analytic.expected_tokens(measured, gamma) - 1),
                                abs(s.speedup / analytic.speedup(measured, c, gamma, slope) - 1))
    assert shows(m.group(1), worst, 100)

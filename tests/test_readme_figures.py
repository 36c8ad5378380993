"""The figures about committed results, read from the README's table of checks and from the
results/*/README.md and docs/ pages they moved to, and checked against the data they come from,
so that the two cannot drift apart.

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
# The figures moved from the README to where their runs are (issue 43): each text is read where it now lives.
LIVE_README = (LIVE / "README.md").read_text()
BENCHMARKS = (ROOT / "docs" / "benchmarks.md").read_text()
SERVE_LIVE_README = (ROOT / "results" / "serve-live" / "README.md").read_text()
LLAMA_SERVER_README = (ROOT / "results" / "llama-server" / "README.md").read_text()
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
    for line in LIVE_README.split("### Every live policy on SmolLM2")[0].splitlines():
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
    sentence = re.search(r"The 5% aim holds for the overall speedups \(([^)]*)\)", LIVE_README).group(1)
    stated = dict(re.findall(rf"`(\w+)` ({NUMBER}%)", sentence))
    assert set(stated) == set(RUNS)
    for policy, text in stated.items():
        summary, _ = run_data(policy)
        assert shows(text, summary["predicted_speedup"] / summary["measured_speedup"] - 1, 100), policy


def test_baseline_drift_figures_match_the_runs():
    # "differed by a median 16% during the `sd` run (up to 54%) and 8% during `pearl`'s"
    m = re.search(rf"a median ({NUMBER}%) during the `sd` run \(up to ({NUMBER}%)\) and ({NUMBER}%) during `pearl`'s",
                  LIVE_README)
    _, sd = run_data("sd")
    _, pearl = run_data("pearl")
    assert shows(m.group(1), sd["measured_ad_spread"].median(), 100)
    assert shows(m.group(2), sd["measured_ad_spread"].max(), 100)
    assert shows(m.group(3), pearl["measured_ad_spread"].median(), 100)


def test_hugging_face_comparison_matches_the_sd_run():
    # "the same 169 target calls, and simlab's decoder was 1.13× its speed (prefill included)"
    m = re.search(rf"the same (\d+) target calls, and\s+simlab's decoder was ({NUMBER}×) its speed", LIVE_README)
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
    assert table in LIVE_README
    assert table.count("\n| `") == 16  # every policy that decodes live: all but the oracle and the trees
    trees = module.table(LIVE / "smollm2-tree")
    assert trees in LIVE_README
    assert trees.count("\n| `") == 3  # tree-static, eagle2, ags-tree
    assert module.table(LIVE / "qwen-tree") in LIVE_README
    qwen = module.table(LIVE / "qwen-all")
    assert qwen in LIVE_README
    assert module.forwards_table(LIVE / "qwen-all") in LIVE_README  # where the time went, from the decode logs
    assert qwen.count("\n| `") == len(list((LIVE / "qwen-all").glob("*.json")))
    assert module.table(LIVE / "qwen-tails") in LIVE_README  # decoded again, predicted from the trace with tails
    assert module.table(LIVE / "qwen-probe") in LIVE_README  # priced from forwards timed in the decoding process


def test_the_readme_tails_table_is_the_replay_of_the_committed_decodes():
    """The committed Qwen decodes replayed on their trace with tails (results/live/tails_check.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tails_check", LIVE / "tails_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    section = LIVE_README.split("| policy | overall error, as predicted | replayed with tails |")[1].split("\n\n")[0]
    rows = re.findall(r"\| `([\w-]+)` \| (\S+) \| (\S+) \| (\S+) → (\S+) \| (\d+) → (\d+) \|", section)
    assert len(rows) == 8
    for policy, *cells in rows:
        got = module.check(LIVE / "qwen-all", policy)
        want = [got[k] for k in ("overall committed", "overall replayed", "median committed", "median replayed",
                                 ">10% committed", ">10% replayed")]
        assert [c.replace("−", "-") for c in cells] == [str(w) for w in want], policy


def test_every_live_run_has_equal_target_calls_in_simulation_and_live():
    for csv in sorted([*LIVE.glob("*.csv"), *LIVE.glob("smollm2-all/*.csv"), *LIVE.glob("smollm2-tree/*.csv"),
                              *LIVE.glob("qwen-tree/*.csv"), *LIVE.glob("qwen-all/*.csv"),
                              *LIVE.glob("qwen-tails/*.csv"), *LIVE.glob("qwen-probe/*.csv"),
                              *LIVE.glob("qwen-reprobe/*.csv"), *LIVE.glob("qwen-probe-repeat/*.csv")]):
        if csv.name.endswith(".latency.csv"):  # live --probe's samples, not a results table
            continue
        table = pd.read_csv(csv)
        assert (table["measured_target_calls"] == table["predicted_target_calls"]).all(), csv.name
        assert table["lossless"].all(), csv.name


def test_the_repeated_spide_run_is_stated_as_measured():
    """The second quiet `spide` run (results/live/qwen-probe-repeat/) beside the first, in the LIVE_README."""
    run = json.loads((LIVE / "qwen-probe-repeat" / "spide.json").read_text())
    stated = (f"{run['measured_speedup']:.3f}× measured, {run['predicted_speedup']:.3f}× predicted: "
              f"{run['error_speedup']:+.1%} overall, median per prompt {run['median_abs_error_speedup']:.1%} (speedup) / "
              f"{run['median_abs_error_tokens_per_s']:.1%} (tok/s)")
    assert stated.replace("-", "−") in " ".join(LIVE_README.split())


def test_the_readme_reprobe_table_is_the_committed_runs():
    """LIVE_README's table of results/live/qwen-reprobe/, re-priced and priced from the first probe
    alone, computed from each run's files (first_probe_only.py); one row per run there."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_probe_only", LIVE / "qwen-reprobe" / "first_probe_only.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    section = LIVE_README.split("| policy | re-probes |")[1].split("\n\n")[0]
    shown = section.splitlines()[2:]
    runs = sorted(p.stem for p in (LIVE / "qwen-reprobe").glob("*.json"))
    assert sorted(shown) == sorted(module.markdown_row(policy, module.compared(policy)[1]) for policy in runs)


@pytest.mark.slow
def test_closed_form_agreement_figure_matches_the_simulation():
    # "tokens per round and speedup agree within 1% (largest error seen 0.33%)": the grid of
    # tests/test_closed_form.py, every γ, both quantities.
    from simlab.analytic import closed_form as analytic
    from simlab.sim.run import Simulator
    from simlab.trace.synth import SynthSpec, synth_trace, synthetic_latency
    from tests.test_closed_form import ALPHAS, CS, GAMMAS, TOKENS

    m = re.search(rf"agree within 1% \(largest error seen ({NUMBER}%)\)", BENCHMARKS)
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


LLAMA = ROOT / "results" / "llama-cpp"
LLAMA_README = (LLAMA / "README.md").read_text()


def table_cells(text: str, first: str) -> list[list[str]]:
    """The rows of the markdown table in ``text`` whose header starts with ``first``, as cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def pair(text: str) -> tuple[str, str]:
    measured, predicted = text.split(" / ")
    return measured, predicted


def test_llama_cpp_results_table_matches_every_committed_run():
    rows = table_cells(LLAMA_README, "run")
    assert {r[0].strip("`") for r in rows} == {p.stem for p in LLAMA.glob("*.json")}
    for name, pair_prompts, flags, drafted, accepted, tokens, exact, speed, median in rows:
        run = json.loads((LLAMA / f"{name.strip('`')}.json").read_text())
        assert pair_prompts.endswith(f", {run['prompts']}")
        expected_flags = f"{run['draft_max']}, {run['p_min']}"
        if run.get("draft_min"):
            expected_flags += f", `--draft-min {run['draft_min']}`"
        assert flags == expected_flags
        for cell, key in ((drafted, "n_drafted"), (accepted, "n_accept"), (tokens, "n_predict")):
            assert pair(cell) == (str(run[f"measured_{key}"]), str(run[f"predicted_{key}"])), (name, key)
        every = min(run[f"prompts_matching_{k}"] for k in ("n_drafted", "n_accept", "n_predict"))
        assert exact == f"{every}/{run['prompts']}" == f"{run['prompts']}/{run['prompts']}"
        m = re.fullmatch(rf"({NUMBER}) / ({NUMBER}) \(({NUMBER}%)\)", speed)
        assert shows(m.group(1), run["measured_tokens_per_s"]) and shows(m.group(2), run["predicted_tokens_per_s"])
        assert shows(m.group(3), run["error_tokens_per_s"], 100)
        assert shows(median, run["median_abs_error_tokens_per_s"], 100)
        table = pd.read_csv(LLAMA / f"{name.strip('`')}.csv")
        assert table["measured_n_drafted"].sum() == run["measured_n_drafted"]
        assert run["error_tokens_per_s"] == pytest.approx(run["predicted_tokens_per_s"] / run["measured_tokens_per_s"] - 1,
                                                          abs=1e-3)


def test_the_readme_llama_cpp_table_is_the_re_probed_runs():
    """The summary table (moved from the README) shows the re-probed runs of results/llama-cpp/README.md, in its order."""
    reprobed = [r for r in table_cells(LLAMA_README, "run") if r[0].endswith("-reprobe`")]
    shown = table_cells(LLAMA_README.split("### llama.cpp predicted")[1], "pair")
    assert len(shown) == len(reprobed)
    for readme_row, row in zip(shown, reprobed):
        _, _, flags, drafted, accepted, _, exact, speed, median = row
        assert [c.rstrip("¹") for c in readme_row[1:]] == [flags, drafted, accepted, exact, speed, median]


SERVE_LIVE = ROOT / "results" / "serve-live" / "quiet"


@pytest.mark.parametrize("run, section, batches", [
    ("quiet", "### Second run", [1, 2, 4, 8]), ("qwen", "## The Qwen pair", [1, 2, 4, 8]),
    ("qwen-reprobe", "### First run (`qwen-reprobe/`", [1, 2, 4, 8]),
    ("qwen-reprobe-2", "### Second run (`qwen-reprobe-2/`", [1, 2, 4, 8]),
    ("qwen-reprobe-b16", "### B = 16 (`qwen-reprobe-b16/`", [16]),
    ("smollm2-reprobe", "### SmolLM2 re-probed", [1, 2, 4, 8])])
def test_serve_live_tables_match_the_committed_decodes(run, section, batches):
    """results/serve-live/README.md's tables (the second quiet SmolLM2 run, the Qwen pair's runs
    probed beforehand and re-probed in the decoding process, SmolLM2 re-probed) from their b*.csv."""
    text = (SERVE_LIVE.parent / "README.md").read_text().split(section)[1]
    rows = table_cells(text, "B")
    assert [int(r[0]) for r in rows] == batches
    for b, sd, sd_err, ad, ad_err, sd_tpot, ad_tpot, ratio, checks in rows:
        runs = pd.read_csv(SERVE_LIVE.parent / run / f"b{b}.csv")
        for policy, cell, err, tpot in (("sd", sd, sd_err, sd_tpot), ("ad", ad, ad_err, ad_tpot)):
            rows_ = runs[runs.policy == policy]
            m = re.fullmatch(rf"({NUMBER}) \(({NUMBER})–({NUMBER})\) / ({NUMBER})", cell)
            measured = rows_.measured_tokens_per_s.median()
            predicted = rows_.predicted_tokens_per_s.iloc[0]
            assert shows(m.group(1), measured) and shows(m.group(4), predicted), (b, policy)
            assert shows(m.group(2), rows_.measured_tokens_per_s.min()) and shows(m.group(3), rows_.measured_tokens_per_s.max())
            assert shows(err, predicted / measured - 1, 100), (b, policy)
            measured_ms, predicted_ms = pair(tpot)
            assert shows(measured_ms, rows_.measured_tpot_s.median() * 1000)
            assert shows(predicted_ms, rows_.predicted_tpot_s.iloc[0] * 1000)
        sd_rows, ad_rows = runs[runs.policy == "sd"], runs[runs.policy == "ad"]
        measured_ratio, predicted_ratio = pair(ratio)
        assert shows(measured_ratio, sd_rows.measured_tokens_per_s.median() / ad_rows.measured_tokens_per_s.median())
        assert shows(predicted_ratio, sd_rows.predicted_tokens_per_s.iloc[0] / ad_rows.predicted_tokens_per_s.iloc[0])
        n = len(runs)
        assert checks == f"{int(runs.lossless.sum())}/{n}, {int(runs.target_calls_equal.sum())}/{n}" == f"{n}/{n}, {n}/{n}"


def within(text: str, value: float) -> bool:
    """Whether "within ``text``%" holds for ``value`` (a ratio), rounded to the digits ``text`` shows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return round(value * 100, decimals) <= float(text)


def test_the_readme_serve_live_sentence_matches_the_committed_decodes():
    m = re.search(rf"`sd`'s tokens/s within ({NUMBER})% of the\s+prediction at B = 1, 2, 4 and 8, `ad`'s within "
                  rf"({NUMBER})% at B = 1 and ({NUMBER})–({NUMBER})% faster than predicted at\s+B = 2–8", SERVE_LIVE_README)
    errors = {}
    ratios = {}
    for b in (1, 2, 4, 8):
        runs = pd.read_csv(SERVE_LIVE / f"b{b}.csv")
        med = runs.groupby("policy").measured_tokens_per_s.median()
        pred = runs.groupby("policy").predicted_tokens_per_s.first()
        errors[b] = pred / med - 1
        ratios[b] = (med["sd"] / med["ad"], pred["sd"] / pred["ad"])
    assert within(m.group(1), max(abs(e["sd"]) for e in errors.values()))
    assert within(m.group(2), abs(errors[1]["ad"]))
    faster = [-errors[b]["ad"] for b in (2, 4, 8)]
    assert shows(m.group(3), min(faster), 100) and shows(m.group(4), max(faster), 100)
    m = re.search(rf"measured \(({NUMBER})–({NUMBER})× of `ad`\) and\s+predicted \(({NUMBER})–({NUMBER})×\)", SERVE_LIVE_README)
    assert shows(m.group(1), min(r[0] for r in ratios.values())) and shows(m.group(2), max(r[0] for r in ratios.values()))
    assert shows(m.group(3), min(r[1] for r in ratios.values())) and shows(m.group(4), max(r[1] for r in ratios.values()))


SERVE_LOAD = ROOT / "results" / "serve-load"
SERVE_LOAD_README = (SERVE_LOAD / "README.md").read_text()
TUNED = {"qwen-coder, trace's CPU samples": "gamma-qwen-coder-cpu.json",
         "qwen-coder, H100 roofline": "gamma-qwen-coder-h100-roofline.json",
         "smollm2-selfspec": "gamma-smollm2-cpu.json"}


def tuned_cells(name: str) -> list[str]:
    """A tune file's best γ per batch size as the tables write it: "5 (1.31x)", or "0" alone for
    a file whose γ is 0 at every size."""
    tune = json.loads((SERVE_LOAD / name).read_text())
    gammas, speedups = tune["gamma_by_batch"], tune["speedup_by_batch"]
    if not any(gammas.values()):
        return [str(g) for g in gammas.values()]
    return [f"{gammas[b]} ({speedups[b]:.2f}x)" for b in gammas]


def test_serve_tune_tables_match_the_committed_tune_files():
    results_rows = {r[0]: r[1:] for r in table_cells(SERVE_LOAD_README, "B")}
    assert len(results_rows) == len(TUNED)
    for label, cells in results_rows.items():
        name = next(file for prefix, file in TUNED.items() if label.startswith(prefix))
        assert [c for c in cells if c] == tuned_cells(name), label
    # the README's first serving table repeats the two Qwen rows
    shown = table_cells(SERVE_LOAD_README.split("best γ\n(tokens/s speedup over no speculation) per batch size")[1], "B")
    assert [r[1:] for r in shown] == [tuned_cells(TUNED["qwen-coder, trace's CPU samples"]),
                                      tuned_cells(TUNED["qwen-coder, H100 roofline"])]


RATES = {"`ad` (no SD)": ("rates-sd4.csv", "ad"), "`ad`": ("rates-sd4.csv", "ad"), "`sd` γ=4": ("rates-sd4.csv", "sd"),
         "`sd` + tuned table": ("rates-tuned.csv", "sd"), "`sd` + SmartSpec ≤ 8": ("rates-smartspec.csv", "sd")}


def rate_rows(label: str) -> pd.DataFrame:
    name, policy = RATES[label]
    table = pd.read_csv(SERVE_LOAD / name)
    return table[table.policy == policy].set_index("rate_per_s")


def test_serve_rate_table_matches_the_committed_rate_sweeps():
    rows = table_cells(SERVE_LOAD_README, "rate (req/s)")
    header = SERVE_LOAD_README.split("| rate (req/s) |")[1].splitlines()[0]
    rates = [float(r) for r in header.strip(" |").split("|")]
    assert len(rows) == 8  # goodput and TPOT p50 of four policies
    for label, *cells in rows:
        data = rate_rows(label.removesuffix(" goodput").removesuffix(" TPOT p50"))
        assert list(data.index) == rates
        for rate, cell in zip(rates, cells):
            value = data.goodput_requests_per_s[rate] if label.endswith("goodput") else data.tpot_p50_s[rate] * 1000
            assert shows(cell, value), (label, rate)


def test_the_readme_goodput_sentence_matches_the_rate_sweeps():
    m = re.search(rf"goodput ({NUMBER}) requests/s\s+without speculation against ({NUMBER}) with `sd` γ=4 and ({NUMBER})\s+"
                  rf"with the tuned table at ({NUMBER})\s+requests/s \(TPOT p50 (\d+), (\d+) and (\d+) ms\)", SERVE_LOAD_README)
    rate = float(m.group(4))
    for i, label in enumerate(("`ad` (no SD)", "`sd` γ=4", "`sd` + tuned table")):
        row = rate_rows(label).loc[rate]
        assert shows(m.group(1 + i), row.goodput_requests_per_s), label
        assert shows(m.group(5 + i), row.tpot_p50_s * 1000), label


LLAMA_SERVER = ROOT / "results" / "llama-server"


def llama_server_runs(name: str, policy: str = "llama-cpp") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run ``name``'s bursts (its JSON) and requests (its CSV) of one server kind: the speculative
    one (``llama-cpp``) or, in a run with ``--baseline``, the plain one (``ad``); runs made before
    ``--baseline`` name no policy and are all speculative."""
    bursts = pd.DataFrame(json.loads((LLAMA_SERVER / f"{name}.json").read_text())["bursts"])
    requests = pd.read_csv(LLAMA_SERVER / f"{name}.csv")
    if "policy" in bursts:
        bursts, requests = bursts[bursts.policy == policy], requests[requests.policy == policy]
    return bursts, requests


def llama_server_rows(name: str) -> list[list[str]]:
    """The table rows results/llama-server/ and the README show for run ``name``, from its
    committed JSON (per burst) and CSV (per request)."""
    bursts, requests = llama_server_runs(name)
    rows = []
    for b, g in bursts.groupby("batch"):
        r = requests[requests.batch == b]
        exact = int(r[["match_tokens", "match_drafted", "match_accepted"]].all(axis=1).sum())
        rows.append([str(b), ", ".join(f"{x:.2f}" for x in g.measured_tokens_per_s),
                     f"{g.predicted_tokens_per_s.iloc[0]:.2f}", ", ".join(f"{100 * x:+.1f}%" for x in g.error_tokens_per_s),
                     f"{exact}/{len(r)}", f"{int((r.diverged_at == -1).sum())}/{len(r)}", f"{g.other_cpu.max():.0%}"])
    return rows


def llama_server_speedup_rows(name: str) -> list[list[str]]:
    """The speedup table of a ``--baseline`` run: per B, the measured speedup of each round, the
    predicted one and their errors; the plain server's tokens/s likewise, and its requests whose
    counts were exact."""
    speedups = pd.DataFrame(json.loads((LLAMA_SERVER / f"{name}.json").read_text())["speedups"])
    bursts, requests = llama_server_runs(name, "ad")
    rows = []
    for b, g in speedups.groupby("batch"):
        plain, r = bursts[bursts.batch == b], requests[requests.batch == b]
        exact = int(r[["match_tokens", "match_drafted", "match_accepted"]].all(axis=1).sum())
        rows.append([str(b), ", ".join(f"{x:.3f}×" for x in g.measured_speedup), f"{g.predicted_speedup.iloc[0]:.3f}×",
                     ", ".join(f"{100 * x:+.1f}%" for x in g.error_speedup),
                     ", ".join(f"{x:.2f}" for x in plain.measured_tokens_per_s), f"{plain.predicted_tokens_per_s.iloc[0]:.2f}",
                     ", ".join(f"{100 * x:+.1f}%" for x in plain.error_tokens_per_s), f"{exact}/{len(r)}"])
    return rows


@pytest.mark.parametrize("name, text, section", [
    ("qwen-d4-p0.0-baseline", "results", "## The speedup over plain decoding"),
    ("qwen-d4-p0.0-baseline", "readme", "**The speedup over llama.cpp's plain decoding**"),
    ("qwen-d4-p0.0-kept", "results", "## Priced from the latencies kept in the trace"),
])
def test_llama_server_speedup_tables_match_the_committed_run(name, text, section):
    source = (LLAMA_SERVER / "README.md").read_text() if text == "results" else LLAMA_SERVER_README
    assert table_cells(source.split(section)[1], "B") == llama_server_speedup_rows(name)


@pytest.mark.parametrize("name, text, section", [
    ("qwen-d4-p0.0-baseline", "results", "and the speculative bursts, as in the tables above:"),
    ("qwen-d4-p0.0-kept", "results", "and the speculative bursts:"),
    ("qwen-d4-p0.0", "results", "## The Qwen2.5-Coder pair"),
    ("qwen-d4-p0.0-first", "results", "The same command 26 minutes earlier"),
    ("smollm2-d4-p0.0", "results", "## SmolLM2-135M drafting for itself"),
    ("qwen-d4-p0.0", "readme", "### llama-server with parallel slots predicted"),
])
def test_llama_server_tables_match_the_committed_runs(name, text, section):
    source = (LLAMA_SERVER / "README.md").read_text() if text == "results" else LLAMA_SERVER_README
    assert table_cells(source.split(section)[1], "B") == llama_server_rows(name)


# ---- the README's table of how well the predictions hold ---------------------------------------

def live_check(*folders: str) -> tuple[str, str]:
    """Target calls equal / prompts, and the range of the overall speedup errors, over every run
    (one JSON per policy) of the folders under results/live/."""
    runs = [json.loads(p.read_text()) for f in folders for p in sorted((LIVE / f).glob("*.json"))]
    errors = [r["error_speedup"] for r in runs]
    return f"{sum(r['target_calls_equal'] for r in runs)}/{sum(r['prompts'] for r in runs)}", spread(errors)


def spread(errors) -> str:
    return f"{min(errors):+.1%} to {max(errors):+.1%}".replace("+-", "-")


def llama_cpp_check() -> tuple[str, str]:
    """Prompts whose drafted, accepted and generated counts are all exact, over the re-probed runs
    and those priced from the latencies kept in the traces; the range of their tokens/s errors."""
    runs = [json.loads(p.read_text()) for p in sorted(LLAMA.glob("*.json")) if p.stem.endswith(("-reprobe", "-kept"))]
    exact = sum(min(r[f"prompts_matching_{k}"] for k in ("n_drafted", "n_accept", "n_predict")) for r in runs)
    return f"{exact}/{sum(r['prompts'] for r in runs)}", spread([r["error_tokens_per_s"] for r in runs])


def llama_server_check() -> tuple[str, str]:
    bursts = pd.DataFrame(json.loads((LLAMA_SERVER / "qwen-d4-p0.0.json").read_text())["bursts"])
    matched = [tuple(map(int, c.split("/"))) for c in bursts["requests_matching_counts"]]
    return f"{sum(a for a, _ in matched)}/{sum(b for _, b in matched)}", spread(bursts["error_tokens_per_s"])


def serve_live_check() -> tuple[str, str]:
    """Requests lossless with the simulated target calls, and the range of the tokens/s errors
    (prediction against the median repeat) of sd and ad at each batch size, re-probed."""
    errors, ok, n = [], 0, 0
    for csv in sorted((ROOT / "results" / "serve-live" / "qwen-reprobe-2").glob("b[0-9]*.csv")):
        if csv.name.endswith(".latency.csv"):
            continue
        runs = pd.read_csv(csv)
        errors += [g.predicted_tokens_per_s.iloc[0] / g.measured_tokens_per_s.median() - 1 for _, g in runs.groupby("policy")]
        ok, n = ok + int((runs.target_calls_equal & runs.lossless).sum()), n + len(runs)
    return f"{ok}/{n}", spread(errors)


def vllm_check(run: str) -> tuple[str, str]:
    """Requests of a ``simlab vllm run`` (every repeat, each prompt alone and several at once) whose
    every step drafted and accepted what the prediction said; the range of the tokens/s errors
    (prediction against measurement) of the runs of one prompt at a time."""
    req = pd.read_csv(ROOT / "results" / "vllm" / run / "requests.csv")
    alone = req[req["tokens_per_s_measured"].notna()]
    return (f"{int(req['steps_all_equal'].sum())}/{len(req)}",
            spread(alone["tokens_per_s_predicted"] / alone["tokens_per_s_measured"] - 1))


def vllm_serve_check(*runs: str, kinds: tuple[str, ...] = ("speculative",)) -> tuple[str, str]:
    """Runs of ``simlab vllm serve`` with speculation (of ``kinds``: the fixed-K server, and the
    table server where it ran) whose /metrics counters equal the prediction; the range of their
    throughput errors (prediction against measurement)."""
    rows = [r for run in runs for r in json.loads((ROOT / "results" / "vllm" / run / "summary.json").read_text())["runs"]
            if r["kind"] in kinds]
    errors = [r["throughput_tokens_per_s_predicted"] / r["throughput_tokens_per_s_measured"] - 1 for r in rows]
    return f"{sum(r['counters_equal_prediction'] for r in rows)}/{len(rows)}", spread(errors)


def vllm_synthetic_check(run: str) -> tuple[str, str]:
    """Runs of ``simlab vllm serve --synthetic-acceptance-rates`` with speculation whose /metrics
    counters are within 3 standard deviations of their expectation; the range of their throughput
    errors (prediction, the mean over imposed profiles, against measurement)."""
    rows = [r for r in json.loads((ROOT / "results" / "vllm" / run / "summary.json").read_text())["runs"]
            if r["kind"] == "speculative"]
    errors = [r["throughput_tokens_per_s_predicted"] / r["throughput_tokens_per_s_measured"] - 1 for r in rows]
    return f"{sum(r['counters_against_expectation']['within'] for r in rows)}/{len(rows)}", spread(errors)


CHECKS = {  # the evidence link of a row -> its figures
    "results/live/smollm2-all": lambda: live_check("smollm2-all"),
    "results/live/qwen-all": lambda: live_check("qwen-all"),
    "results/live/qwen-probe": lambda: live_check("qwen-probe"),
    "results/live/qwen-reprobe": lambda: live_check("qwen-reprobe"),
    "results/live/README.md#draft-trees-decoded-live-smollm2-tree-qwen-tree": lambda: live_check("smollm2-tree", "qwen-tree"),
    "results/llama-cpp": llama_cpp_check,
    "results/llama-server": llama_server_check,
    "results/serve-live": serve_live_check,
    "results/vllm/qwen-k4": lambda: vllm_check("qwen-k4"),
    "results/vllm/qwen-k4-quiet": lambda: vllm_check("qwen-k4-quiet"),
    "results/vllm/smollm2-k4": lambda: vllm_check("smollm2-k4"),
    "results/vllm/smollm2-k4-quiet": lambda: vllm_check("smollm2-k4-quiet"),
    "results/vllm/README.md#smollm2-serve-burst4-smollm2-serve-rate05-vllm-serve-under-load":
        lambda: vllm_serve_check("smollm2-serve-burst4", "smollm2-serve-rate05"),
    "results/vllm/README.md#smollm2-serve-burst4-vsched-smollm2-serve-rate05-vsched-predicted-with-vllms-scheduler":
        lambda: vllm_serve_check("smollm2-serve-burst4-vsched"),
    "results/vllm/README.md#smollm2-serve-burst4-avx512-trace-and-run-on-one-machine-vllms-scheduler-predicting":
        lambda: vllm_serve_check("smollm2-serve-burst4-avx512"),
    "results/vllm/README.md#smollm2-serve-table-the-labs-k-by-batch-size-table-on-vllm-serve-beside-fixed-k-and-no-speculation":
        lambda: vllm_serve_check("smollm2-serve-table/burst4", "smollm2-serve-table/rate05", kinds=("speculative", "table")),
    "results/vllm/README.md#smollm2-serve-table24-the-same-servers-the-traces-batched-steps-timed-24-times":
        lambda: vllm_serve_check("smollm2-serve-table24/burst4", "smollm2-serve-table24/rate05",
                                 kinds=("speculative", "table")),
    "results/vllm/README.md#smollm2-serve-table-k14-the-tables-k-timed-too---k-14-priced-from-its-own-steps":
        lambda: vllm_serve_check("smollm2-serve-table-k14/burst4", kinds=("speculative", "table")),
    "results/vllm/smollm2-serve-synthetic-high": lambda: vllm_synthetic_check("smollm2-serve-synthetic-high"),
    "results/vllm/smollm2-serve-synthetic-medium": lambda: vllm_synthetic_check("smollm2-serve-synthetic-medium"),
    "results/vllm/smollm2-serve-synthetic-low": lambda: vllm_synthetic_check("smollm2-serve-synthetic-low"),
    "results/vllm/smollm2-serve-synthetic-medium-k14": lambda: vllm_synthetic_check("smollm2-serve-synthetic-medium-k14"),
    "results/vllm/smollm2-ngram": lambda: vllm_check("smollm2-ngram"),
    "results/vllm/smollm2-suffix": lambda: vllm_check("smollm2-suffix"),
    "results/vllm/qwen-edit-ngram": lambda: vllm_check("qwen-edit-ngram"),
    "results/vllm/qwen-edit-suffix": lambda: vllm_check("qwen-edit-suffix"),
}


def test_the_readme_table_of_checks_is_computed_from_the_committed_runs():
    rows = table_cells(README.split("## How well the predictions hold")[1], "check")
    assert len(rows) == len(CHECKS)
    for check, what, counts, error, evidence in rows:
        link = re.fullmatch(r"\[[^]]+\]\(([^)]+)\)", evidence).group(1)
        assert (counts, error) == CHECKS[link](), check

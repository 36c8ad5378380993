"""Serving over request rates (`simlab serve --rate R1,R2,...`) and its plot: one serve run per
rate on one time-scaled arrival draw, monotone where queueing theory says it must be."""

import io
import json
import sys

import numpy as np
import pandas as pd
import pytest

from simlab.cli import main
from simlab.common.errors import SimlabError
from simlab.plots.serving import rates_figure
from simlab.serve.metrics import Slo
from simlab.serve.rates import parse_rates, rate_sweep, series_label
from simlab.serve.run import ServeConfig, serve, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.serve.workload import poisson_arrivals
from simlab.sim.run import Simulator
from tests.helpers import hand_trace, latency_table
from tests.test_serve import SHIPPED, alone

RATES = [0.01, 0.05, 0.2, 1.0, 1e6]
REQUESTS = 12


@pytest.fixture(scope="module")
def sim():
    patterns = ["1" + "1101" * 5, "1" + "10" * 12, "1" + "1" * 30]
    return Simulator(hand_trace(patterns, latency=latency_table(draft=0.1, verify={k: 1 + 0.1 * k for k in range(1, 200)})))


def one_server(**kwargs):
    return ServeConfig("sd", {"gamma": 3}, Scheduler(max_batch=1), **kwargs)


def test_each_rate_replays_the_same_draw_time_scaled():
    assert np.allclose(np.array(poisson_arrivals(4.0, 50, 3)) * 4, poisson_arrivals(1.0, 50, 3), rtol=1e-12, atol=0)


def test_one_server_queues_more_as_the_rate_grows_and_never_decodes_slower(sim):
    # max batch 1: a FCFS queue in front of one server whose service times do not depend on the
    # load. With arrivals a_i / r, every finish time and the makespan shrink or stay as r grows,
    # so throughput (= goodput without SLOs) never falls and no request's latency falls; each
    # request's TPOT is its own decode alone, whatever the load
    table = rate_sweep(sim, RATES, REQUESTS, 0, one_server(), progress=False)
    for label, rows in table.groupby("label"):
        assert list(rows["rate_per_s"]) == RATES
        for column in ("throughput_tokens_per_s", "goodput_requests_per_s"):
            assert rows[column].is_monotonic_increasing, (label, column)
        for column in ("e2e_p50_s", "e2e_p90_s", "ttft_p90_s"):
            assert rows[column].is_monotonic_increasing, (label, column)
        assert np.allclose(rows["tpot_p50_s"], rows["tpot_p50_s"].iat[0], rtol=1e-9)
    assert (table["goodput_requests_per_s"] == table["throughput_requests_per_s"]).all()


def test_a_saturated_single_server_serves_tokens_at_the_rate_of_its_service_times(sim):
    # at 10^6 requests/s everything has arrived when the first request starts: the makespan is
    # the sum of the requests' service times, each measured alone
    table = rate_sweep(sim, [1e6], REQUESTS, 0, one_server(), progress=False)
    for policy, row in zip(("sd", "ad"), table.itertuples()):
        solo = serve_once(sim, alone(REQUESTS), one_server(), policy, {"gamma": 3} if policy == "sd" else {}).frame
        assert row.throughput_tokens_per_s == pytest.approx(solo["tokens"].sum() / solo["e2e_s"].sum(), rel=1e-6)
    assert list(table["mean_batch"]) == [1.0, 1.0]  # one server decodes one request at a time


def test_slo_attainment_never_rises_with_the_rate_on_one_server(sim):
    table = rate_sweep(sim, RATES, REQUESTS, 0, one_server(slo=Slo(ttft_s=100.0)), progress=False)
    for _, rows in table.groupby("label"):
        assert rows["slo_attainment"].is_monotonic_decreasing
        assert rows["slo_attainment"].iat[0] == 1.0 and rows["slo_attainment"].iat[-1] < 1.0


def test_a_rate_sweep_has_a_row_per_rate_and_policy_with_the_speedup_on_the_speculative_ones(sim):
    table = rate_sweep(sim, [0.1, 1.0], 4, 0, ServeConfig("sd", {"gamma": 3}), progress=False)
    assert list(table["label"]) == ["sd(gamma=3)", "ad (no SD)"] * 2
    assert list(table["speculative"]) == [True, False] * 2
    assert list(table["policy"]) == ["sd", "ad"] * 2 and list(table["batch_policy"]) == ["none"] * 4
    spec, base = table[table["speculative"]], table[~table["speculative"]]
    assert np.allclose(spec["e2e_speedup"].to_numpy(), base["e2e_mean_s"].to_numpy() / spec["e2e_mean_s"].to_numpy())
    assert rate_sweep(sim, [0.1], 4, 0, ServeConfig("sd", {"gamma": 3}), baseline=False, progress=False)["label"].tolist() \
        == ["sd(gamma=3)"]


class Terminal(io.StringIO):
    """stderr as a terminal shows it: tqdm draws a bar where ``isatty()`` is true."""

    def isatty(self):
        return True


@pytest.mark.parametrize("stderr,progress,shown", [(Terminal, None, True), (io.StringIO, None, False),
                                                   (io.StringIO, True, True), (Terminal, False, False)])
def test_a_sweep_shows_its_progress_on_a_terminal_or_when_asked(sim, monkeypatch, stderr, progress, shown):
    monkeypatch.setattr(sys, "stderr", stderr())
    rate_sweep(sim, [1.0], 1, 0, one_server(), baseline=False, progress=progress)
    assert sys.stderr.getvalue().startswith("\rserve:") == shown and ("rate/s" in sys.stderr.getvalue()) == shown


def test_a_rate_is_served_on_the_arrivals_its_seed_draws(sim):
    # at 0.001 requests/s the server idles between requests: the makespan is the seed's draw
    table = rate_sweep(sim, [0.001], 4, 5, one_server(), baseline=False, progress=False)
    res = serve(sim, poisson_arrivals(0.001, 4, seed=5), one_server(), baseline=False)
    assert table["makespan_s"].tolist() == [res.run.summary["makespan_s"]]


def test_a_series_is_labelled_by_its_policy_parameters_and_batch_policy():
    assert series_label("layerskip", {"exit_layer": 2, "gamma": 3}, "smartspec") == "layerskip(exit_layer=2, gamma=3) + smartspec"
    assert series_label("ad", {}, "none") == "ad"


@pytest.mark.parametrize("text,needle", [("0", "> 0"), ("1,-2", "> 0"), ("inf", "> 0"), ("2,1", "increasing"),
                                         ("1,1", "increasing"), ("1,,2", "comma-separated"), ("fast", "comma-separated")])
def test_bad_rates_fail_in_one_line(text, needle):
    with pytest.raises(SimlabError, match=needle):
        parse_rates(text)


def run_main(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", *map(str, args)])
    return exc.value.code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("extra,needle", [(["--arrivals", "times.txt"], "--arrivals"), (["--timeline", "t.json"], "--timeline"),
                                          (["--live"], "--live"), (["--requests", "0"], "--requests")])
def test_several_rates_refuse_what_one_rate_only_means(extra, needle, capsys, tmp_path):
    (tmp_path / "times.txt").write_text("0\n")
    extra = [str(tmp_path / e) if e.endswith((".txt", ".json")) else e for e in extra]
    code, err = run_main(["--rate", "1,2", *extra, "--trace", tmp_path / "no-such-trace"], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and needle in err


def test_serve_with_several_rates_prints_a_row_per_rate_and_policy_and_writes_them(tmp_path, capsys):
    out = tmp_path / "rates.csv"
    main(["serve", "--trace", str(SHIPPED), "--rate", "0.01,0.1", "--requests", "6", "--gamma", "4", "--out", str(out),
          "--slo-tpot", "1"])
    text = capsys.readouterr().out
    assert "sd(gamma=4)" in text and "ad (no SD)" in text
    table = pd.read_csv(out)
    assert list(table["rate_per_s"]) == [0.01, 0.01, 0.1, 0.1] and (table["requests"] == 6).all()
    assert (table["slo_tpot_s"] == 1).all() and (table["max_batch"] == 8).all()
    main(["serve", "--trace", str(SHIPPED), "--rate", "0.01,0.1", "--requests", "6", "--gamma", "4", "--json",
          "--no-baseline"])
    assert [r["rate_per_s"] for r in json.loads(capsys.readouterr().out)] == [0.01, 0.1]


def sweep_table(label, goodput, extra=0.0):
    return pd.DataFrame({"rate_per_s": [1.0, 2.0], "label": label, "goodput_requests_per_s": goodput,
                         "tpot_p50_s": [0.01 + extra, 0.02], "tpot_p90_s": [0.03, 0.04], "trace": "traces/hand"})


def test_the_rates_plot_draws_each_policy_once_with_p50_and_p90():
    ad = sweep_table("ad (no SD)", [1.0, 1.5])
    fig = rates_figure([pd.concat([sweep_table("sd(gamma=4)", [1.0, 2.0]), ad]),
                        pd.concat([sweep_table("sd(gamma=4) + smartspec", [1.0, 1.8]), ad])])
    good, lat = fig.axes
    assert [line.get_label() for line in good.get_lines()] == ["sd(gamma=4)", "ad (no SD)", "sd(gamma=4) + smartspec"]
    assert list(good.get_lines()[2].get_ydata()) == [1.0, 1.8]
    assert len(lat.get_lines()) == 6 and list(lat.get_lines()[1].get_ydata()) == pytest.approx([30.0, 40.0])  # p90, ms
    assert lat.get_lines()[1].get_linestyle() == "--"


def test_the_rates_plot_refuses_one_series_with_two_sets_of_figures():
    with pytest.raises(SimlabError, match="different figures at rate 1.0"):
        rates_figure([sweep_table("ad (no SD)", [1.0, 1.5]), sweep_table("ad (no SD)", [1.0, 1.5], extra=0.5)])
    with pytest.raises(SimlabError, match="--latency"):
        rates_figure([sweep_table("ad", [1.0, 1.5])], latency="tbt")
    with pytest.raises(SimlabError, match="lacks columns"):
        rates_figure([pd.DataFrame({"rate_per_s": [1.0]})])

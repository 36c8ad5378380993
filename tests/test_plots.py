"""Plots are checked for content: axes, labels, series, points, titles; files by suffix."""

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from simlab.common.errors import SimlabError
from simlab.common.mapping import SPIDE_EDGES, mapping_table, spide_bin
from simlab.plots import save
from simlab.plots.acceptance import acceptance_figure
from simlab.plots.frontier import FRONT_LABEL, frontier_figure
from simlab.plots.live import live_figure
from simlab.plots.mapping import mapping_figure, trace_mapping
from simlab.plots.sensitivity import sensitivity_figure
from simlab.plots.timeline import kind_of, timeline_figure
from simlab.sim.devices import Slice
from simlab.sim.run import Simulator
from tests.helpers import hand_trace


def sweep_rows(rows, reference_speedup=2.0):
    """A sweep table as `simlab sweep --out` writes it (the columns plots read)."""
    table = pd.DataFrame(rows)
    table["label"] = table["policy"]
    table["reference_gamma"] = 6
    table["reference_speedup"] = reference_speedup
    table["trace"] = "traces/hand-made"
    return table


@pytest.fixture
def table():
    sd = [{"policy": "sd", "gamma": g, "tau": None, "speedup": s, "cost": c}
          for g, s, c in [(3, 1.8, 1.3), (1, 1.2, 2.0), (6, 2.0, 1.0), (9, 1.9, 0.9)]]
    spide = [{"policy": "spide", "gamma": None, "tau": t, "speedup": s, "cost": c}
             for t, s, c in [(0.9, 2.6, 1.2), (0.5, 2.1, 0.8), (0.7, 2.4, 1.0)]]
    return sweep_rows(sd + spide + [{"policy": "ad", "gamma": None, "tau": None, "speedup": 1.0, "cost": 3.0}])


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines()}


# -- frontier ----------------------------------------------------------------------------------

def test_frontier_draws_each_policy_in_parameter_order(table):
    ax = frontier_figure(table).axes[0]
    assert ax.get_xlabel() == "cost (target calls / sd at its best γ)"
    assert ax.get_ylabel() == "speedup over autoregressive decoding"
    assert ax.get_title() == "Speed vs cost: hand-made"
    lines = lines_by_label(ax)
    sd, spide, ad = lines["sd (γ 1..9)"], lines["spide (τ 0.5..0.9)"], lines["ad"]
    assert list(sd.get_xdata()) == [2.0, 1.3, 1.0, 0.9]  # gamma 1, 3, 6, 9
    assert list(spide.get_ydata()) == [2.1, 2.4, 2.6]  # tau 0.5, 0.7, 0.9
    assert list(ad.get_xdata()) == [3.0] and ad.get_linestyle() == "None"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["sd (γ 1..9)", "spide (τ 0.5..0.9)", "ad", FRONT_LABEL, "Pareto-optimal",
                      "sd at its best γ=6"]


def test_frontier_front_and_reference(table):
    ax = frontier_figure(table).axes[0]
    lines = lines_by_label(ax)
    optimal = lines["Pareto-optimal"]
    # spide 0.5 (0.8, 2.1), spide 0.7 (1.0, 2.4), spide 0.9 (1.2, 2.6); every sd and ad dominated
    assert list(optimal.get_xdata()) == [0.8, 1.0, 1.2]
    assert list(optimal.get_ydata()) == [2.1, 2.4, 2.6]
    front = lines[FRONT_LABEL]
    assert list(front.get_xdata()) == [0.8, 1.0, 1.2, 3.0]  # runs on to the costliest point
    assert front.get_drawstyle() == "steps-post"
    star = lines["sd at its best γ=6"]
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([1.0], [2.0])
    labels = [t.get_text() for t in ax.texts]
    # the front by name, then every other sd point by its γ
    assert labels == ["spide τ=0.5", "spide τ=0.7", "spide τ=0.9", "γ=3", "γ=1", "γ=6", "γ=9"]
    reference, parity = (line for line in ax.get_lines() if line.get_label().startswith("_child"))
    # speed reference: horizontal at sd's best speedup; cost parity: vertical at cost 1
    assert list(reference.get_ydata()) == [2.0, 2.0] and list(reference.get_xdata()) == [0, 1]
    assert list(parity.get_xdata()) == [1.0, 1.0] and list(parity.get_ydata()) == [0, 1]


def overlaps(texts, renderer):
    boxes = [t.get_window_extent(renderer) for t in texts]
    return [(texts[i].get_text(), texts[j].get_text()) for i in range(len(boxes)) for j in range(i)
            if boxes[i].overlaps(boxes[j])]


def test_frontier_labels_do_not_overlap_even_when_points_crowd():
    # twelve sd points bunched near cost 1 beside a spide series: one fixed offset overlaps 11 pairs
    sd = [{"policy": "sd", "gamma": g, "tau": None, "speedup": 2.0 - 0.002 * abs(g - 6), "cost": 1 + 0.002 * (6 - g)}
          for g in range(1, 13)]
    spide = [{"policy": "spide", "gamma": None, "tau": t / 10, "speedup": 2.0 + t / 100, "cost": 0.95 + t / 100}
             for t in range(1, 10)]
    fig = frontier_figure(sweep_rows(sd + spide))
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert all(f"γ={g}" in texts or f"sd γ={g}" in texts for g in range(1, 13))
    assert overlaps(ax.texts, fig.canvas.get_renderer()) == []


# -- per-position acceptance -------------------------------------------------------------------

def test_acceptance_plot_draws_vllm_per_position_rates_per_configuration():
    table = sweep_rows([{"policy": "sd", "acceptance_per_position": [0.9, 0.7, 0.5]},
                        {"policy": "spide", "acceptance_per_position": [0.8, 0.4]},
                        {"policy": "ad", "acceptance_per_position": []}])
    ax = acceptance_figure(table).axes[0]
    lines = lines_by_label(ax)
    assert set(lines) == {"sd", "spide"}  # ad drafts nothing: no line
    assert list(lines["sd"].get_xdata()) == [1, 2, 3] and list(lines["sd"].get_ydata()) == [0.9, 0.7, 0.5]
    assert list(lines_by_label(acceptance_figure(table, policies=["spide"]).axes[0])) == ["spide"]
    with pytest.raises(SimlabError, match="no configuration drafted anything"):
        acceptance_figure(table, policies=["ad"])


# -- tau / any parameter -----------------------------------------------------------------------

def test_tau_plot_like_spide_figure_6(table):
    fig = sensitivity_figure(table)
    speed_ax, cost_ax = fig.axes
    assert speed_ax.get_xlabel() == "tau"
    assert speed_ax.get_ylabel() == "speedup over autoregressive decoding"
    assert cost_ax.get_ylabel() == "cost (target calls / sd at its best γ)"
    assert speed_ax.get_title() == "spide: speed and cost against tau (hand-made)"
    speed = lines_by_label(speed_ax)
    cost = lines_by_label(cost_ax)
    assert list(speed["speedup"].get_xdata()) == [0.5, 0.7, 0.9]
    assert list(speed["speedup"].get_ydata()) == [2.1, 2.4, 2.6]
    assert list(cost["cost"].get_ydata()) == [0.8, 1.0, 1.2]
    assert list(speed["sd speedup at its best γ=6"].get_ydata()) == [2.0, 2.0]
    assert speed["sd speedup at its best γ=6"].get_linestyle() == "--"
    assert list(cost["cost parity with that sd"].get_ydata()) == [1.0, 1.0]


def test_any_policy_and_parameter(table):
    speed_ax = sensitivity_figure(table, param="gamma").axes[0]
    assert list(lines_by_label(speed_ax)["speedup"].get_xdata()) == [1, 3, 6, 9]


def test_other_varying_parameters_must_be_pinned(table):
    extra = table.assign(window=[None] * 4 + [2, 2, 4] + [None])
    with pytest.raises(SimlabError, match=r"\['window'\] also vary for 'spide'; pin them with --where"):
        sensitivity_figure(extra)
    fig = sensitivity_figure(extra, where={"window": 2})
    assert list(lines_by_label(fig.axes[0])["speedup"].get_xdata()) == [0.5, 0.9]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"param": "beta"}, "no parameter 'beta'"),
    ({"policy": "sd"}, "no rows of policy 'sd' with 'tau'"),
    ({"where": {"nope": 1}}, "no column 'nope'"),
])
def test_tau_plot_errors(table, kwargs, fragment):
    with pytest.raises(SimlabError, match=fragment):
        sensitivity_figure(table, **kwargs)


def test_two_policies_sweeping_the_parameter_need_a_choice(table):
    both = pd.concat([table, table.assign(policy="pearl")], ignore_index=True)
    with pytest.raises(SimlabError, match=r"policies \['spide', 'pearl'\] sweep 'tau'; pick one with --policy"):
        sensitivity_figure(both)


# -- mapping -----------------------------------------------------------------------------------

def test_spide_has_twenty_bins():
    assert len(SPIDE_EDGES) == 20
    assert spide_bin([0.0, 0.05, 0.1, 0.85, 0.9, 0.905, 0.955, 0.995, 0.999, 1.0]).tolist() == [0, 0, 1, 8, 9, 9, 14, 18, 19, 19]


def test_trace_mapping_counts_drafted_positions():
    # position 0 is the prefill's and never drafted; the helper gives matches confidence 0.9
    # and mismatches 0.4.
    trace = hand_trace(["1" + "1101", "0" + "0011"])
    table = trace_mapping(trace).set_index("conf_low")
    assert (table.loc[0.9, "count"], table.loc[0.9, "accepted"]) == (5, 5)
    assert (table.loc[0.4, "count"], table.loc[0.4, "accepted"]) == (3, 0)
    assert table["count"].sum() == 8


def test_mapping_figure_panels():
    table = mapping_table([0.05, 0.95, 0.95, 1.0, 1.0, 1.0], [False, True, False, True, True, True])
    fig = mapping_figure(table, title="pair")
    acc_ax, share_ax = fig.axes
    rates = [p.get_height() for p in acc_ax.patches]
    shares = [p.get_height() for p in share_ax.patches]
    assert len(rates) == len(shares) == 20
    assert rates[0] == 0.0 and rates[14] == 0.5 and rates[19] == 1.0
    assert np.isnan(rates[1])  # an empty bin has no rate
    assert shares[14] == pytest.approx(100 * 2 / 6) and sum(shares) == pytest.approx(100)
    assert [t.get_text() for t in acc_ax.get_xticklabels()][-2:] == ["[0.99, 1)", "1.0"]
    assert acc_ax.get_ylabel() == "acceptance rate" and share_ax.get_ylabel() == "share of draft tokens (%)"
    assert fig.texts[0].get_text() == "pair"
    counts = [t.get_text() for t in acc_ax.texts]
    assert counts[0] == "n=1" and counts[1] == "" and counts[14] == "n=2" and counts[19] == "n=3"  # empty: no bar
    assert share_ax.get_title() == "Draft tokens per confidence bin (n=6)"


# -- timeline ----------------------------------------------------------------------------------

def test_timeline_has_one_bar_per_forward():
    res = Simulator(hand_trace(["1" + "11011110010"])).run("sd", {"gamma": 3}, timeline_prompt=0, with_cost=False)
    fig = timeline_figure(res.timeline, title="sd on prompt 0")
    ax = fig.axes[0]
    bars = {c.get_label(): len(c.get_paths()) for c in ax.collections if isinstance(c, PolyCollection)}
    assert bars == {"draft": 5, "verify": 5}  # five serial rounds
    assert [t.get_text() for t in ax.get_yticklabels()] == ["draft", "target"]
    assert ax.get_xlabel() == "time (ms)" and ax.get_title() == "sd on prompt 0"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["draft", "verify"]
    window = timeline_figure(res.timeline, start=0.0, end=1.0).axes[0]  # the first second
    assert sum(len(c.get_paths()) for c in window.collections) == 2
    with pytest.raises(SimlabError, match="no slices between 100 s and 200 s"):
        timeline_figure(res.timeline, start=100, end=200)


def test_each_kind_of_forward_has_one_colour_in_every_timeline():
    def colours(slices):
        ax = timeline_figure(slices).axes[0]
        return {c.get_label(): tuple(c.get_facecolor()[0]) for c in ax.collections if isinstance(c, PolyCollection)}

    serial = [Slice("draft", "draft x3", 0.0, 0.3, {}), Slice("target", "verify x4", 0.3, 1.3, {})]
    parallel = [Slice("target", "verify (parallel) x2", 0.0, 1.0, {}), Slice("draft", "draft (parallel) x3", 0.0, 0.3, {}),
                Slice("target", "verify x4", 1.0, 2.0, {}), Slice("draft", "draft x1", 2.0, 2.1, {})]
    a, b = colours(serial), colours(parallel)
    assert a["draft"] == b["draft"] and a["verify"] == b["verify"]
    assert len(set(b.values())) == 4  # four kinds, four colours


def test_slice_kinds():
    assert kind_of("verify (parallel) x5") == "verify (parallel)"
    assert kind_of("draft x12") == "draft"


# -- live --------------------------------------------------------------------------------------

def test_live_plot_measured_against_predicted():
    table = pd.DataFrame({"prompt_id": [0, 1, 0, 1], "policy": ["sd", "sd", "spide", "spide"],
                          "predicted_tokens_per_s": [2.0, 4.0, 3.0, 3.0],
                          "measured_tokens_per_s": [2.0, 5.0, 3.0, 2.0]})
    ax = live_figure(table).axes[0]
    lines = lines_by_label(ax)
    # relative errors: sd 0 and 0.2 -> 10%; spide 0 and 0.5 -> 25%; all four -> 17.5%
    assert list(lines["sd (mean error 10.0%)"].get_xdata()) == [2.0, 4.0]
    assert list(lines["spide (mean error 25.0%)"].get_ydata()) == [3.0, 2.0]
    diagonal = lines["measured = predicted"]
    assert list(diagonal.get_xdata()) == list(diagonal.get_ydata())
    assert ax.get_title() == "Live vs simulated: tokens_per_s, 4 decodes, mean error 17.5%"
    assert ax.get_xlabel() == "predicted tokens_per_s (simulator)"
    assert ax.get_ylabel() == "measured tokens_per_s (live)"


def test_live_plot_needs_both_columns():
    with pytest.raises(SimlabError, match=r"lacks columns \['predicted_speedup'\]"):
        live_figure(pd.DataFrame({"measured_speedup": [1.0]}), metric="speedup")


# -- files -------------------------------------------------------------------------------------

def test_save_by_suffix(table, tmp_path):
    fig = frontier_figure(table)
    assert save(fig, tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in save(fig, tmp_path / "f.svg").read_bytes()[:400]
    with pytest.raises(SimlabError, match="must end in .png, .svg, .pdf"):
        save(fig, tmp_path / "f.jpg")

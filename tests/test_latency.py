"""Latency models: interpolation rules, profile files, the tabulated grid."""

import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.latency.fitted import FittedLatency
from simlab.latency.grid import LatencyGrid
from simlab.latency.model import TableLatency, load_profile, save_profile
from simlab.latency.retime import with_latency
from simlab.latency.surface import Surface
from simlab.trace.schema import NO_LAYER
from simlab.trace.synth import SynthSpec, synth_trace
from tests.helpers import latency_table


@pytest.fixture()
def table():
    lat = latency_table(draft=0.1, verify={1: 0.3, 2: 0.6, 3: 0.9, 4: 0.6, 8: 0.8}, ctx=(100, 200))
    lat.loc[(lat.op == "target_forward") & (lat.k == 1) & (lat.context_len == 200), "seconds"] = 0.5
    return TableLatency.from_samples(lat)


def test_table_keeps_measured_points_and_interpolates_between_them(table):
    assert table.target_forward(3, 100) == pytest.approx(0.9)
    assert table.target_forward(4, 100) == pytest.approx(0.6)  # not monotone in k: kept as measured
    assert table.target_forward(6, 100) == pytest.approx(0.7)  # between k=4 and k=8
    assert table.target_forward(1, 150) == pytest.approx(0.4)  # between context 100 and 200
    assert table.target_forward(1, 10) == pytest.approx(0.3)  # clamped below the measured range


def test_table_extends_the_last_slope_beyond_the_largest_k(table):
    assert table.target_forward(12, 100) == pytest.approx(0.8 + 4 * (0.8 - 0.6) / 4)


def test_medians_of_repeated_samples():
    lat = latency_table(draft=0.1, verify={1: 1.0}, ctx=(0,))
    forward = lat[lat.op == "target_forward"]
    lat = pd.concat([lat, forward.assign(seconds=2.0), forward.assign(seconds=3.0)])
    assert TableLatency.from_samples(lat).target_forward(1, 0) == pytest.approx(2.0)
    assert TableLatency.from_samples(lat).source == "trace samples (medians)"  # what the profile says it holds


def test_profile_round_trip(table, tmp_path):
    path = save_profile(table, tmp_path / "p.json")
    back = load_profile(path)
    for k in (1, 2, 5, 9):
        for ctx in (50, 120, 300):
            assert back.target_forward(k, ctx) == pytest.approx(table.target_forward(k, ctx))
    assert back.draft_step(150) == pytest.approx(0.1)


def test_bad_profiles(tmp_path):
    with pytest.raises(SimlabError, match="not found"):
        load_profile(tmp_path / "none.json")
    p = tmp_path / "bad.json"
    p.write_text('{"format": "something-else"}')
    with pytest.raises(SimlabError, match="not a 'simlab-latency' file"):
        load_profile(p)


def test_grid_answers_like_the_model(table):
    grid = LatencyGrid(table, 300)
    for ctx in (0, 100, 157, 300):
        assert grid.target_forward(5, ctx) == pytest.approx(table.target_forward(5, ctx))
    assert grid.draft_seconds(100, 4) == pytest.approx(4 * 0.1)
    assert grid.draft_seconds(299, 4) == pytest.approx(4 * 0.1)  # runs past the grid


def test_serial_rounds_equal_the_scalar_prices_bit_for_bit(table):
    """The oracle plans with the tabulated prices and the executor charges the scalar ones: they must be equal."""
    grid = LatencyGrid(table, 300)
    for first, count, top_k in ((0, 40, 6), (120, 30, 3), (250, 60, 16)):  # the last runs past the grid
        rows = grid.serial_rounds(first, count, top_k)
        assert len(rows) == count
        assert rows == [[grid.draft_seconds(c, k) + grid.target_forward(k + 1, c) for k in range(top_k + 1)]
                        for c in range(first, first + count)]
        least, first_k = grid.serial_round_tails(first, count, top_k)  # the best round drafting >= i tokens
        assert least == [[min(row[i:]) for i in range(top_k + 1)] for row in rows]
        assert first_k == [[row.index(min(row[i:]), i) for i in range(top_k + 1)] for row in rows]


def test_a_catch_up_is_never_cheaper_than_the_one_token_step():
    """A draft forward feeding f tokens costs the step times the target's growth from 1 to f
    tokens: 0.1 x (1.5 / 1.0 - 1) = 0.05 s more for 3 tokens; where a 2-token forward measured
    faster than a 1-token one (0.8 s against 1.0 s, as on CPUs), the first forward still costs a
    whole step, so nothing more, not 0.1 x (0.8 - 1) = -0.02 s."""
    grid = LatencyGrid(TableLatency.from_samples(latency_table(draft=0.1, verify={1: 1.0, 2: 0.8, 3: 1.5})), 300)
    assert grid.catch_up_seconds(100, 3) == pytest.approx(0.05)
    assert grid.catch_up_seconds(100, 2) == 0.0
    assert grid.catch_up_row(2)[100] == 0.0
    assert grid.catch_up_seconds(100, 1) == 0.0


def test_beyond_the_largest_k_a_falling_last_segment_is_not_extended_downwards():
    # measured: k=1 1.0 s, k=2 2.0 s, k=3 1.5 s; the last segment falls (-0.5 s per token).
    # Extending it would give k=5 at 0.5 s and k=7 at -0.5 s; the rule holds the last value.
    lat = TableLatency.from_samples(latency_table(verify={1: 1.0, 2: 2.0, 3: 1.5}, ctx=(0,)))
    assert [lat.target_forward(k, 0) for k in (3, 5, 7)] == [1.5, 1.5, 1.5]
    # a rising last segment is extended: +1 s per token from k=2 (1.0 s) to k=3 (2.0 s)
    lat = TableLatency.from_samples(latency_table(verify={1: 1.0, 2: 1.0, 3: 2.0}, ctx=(0,)))
    assert lat.target_forward(5, 0) == pytest.approx(4.0)


def test_a_table_profile_that_does_not_say_corun_is_solo():
    # profiles written before co-running samples existed name no "corun": they are solo tables
    profile = TableLatency.from_samples(latency_table(draft=0.1, verify={1: 1.0, 2: 1.5})).to_profile()
    for entry in profile["draft_step"] + profile["target_forward"]:
        entry.pop("corun", None)
    model = TableLatency.from_profile(profile)
    assert not model.has_corun
    assert (model.target_forward(2, 100), model.draft_step(100)) == (1.5, 0.1)


def test_a_profile_that_gives_a_negative_duration_is_refused_where_it_does():
    # target forward 1.0 - 0.5 k s: -0.5 s for k = 3, at every context, so the first is 0
    surfaces = {("target", False): Surface("affine", (1.0, -0.5), (1, 2)),
                ("draft", False): Surface("affine", (0.1, 0.0), (1, 2))}
    grid = LatencyGrid(FittedLatency("falling", surfaces), 10)
    assert grid.target_forward(1, 5) == 0.5
    with pytest.raises(SimlabError) as err:
        grid.target_row(3)
    assert str(err.value) == ("latency model 'falling' gives -0.5 s for a 3-token target forward at context 0; "
                              "a duration must be positive and at most 3600 s (check the profile's coefficients)")


def test_a_synthetic_trace_retimed_by_a_profile_reads_its_table_at_the_traces_contexts(tmp_path):
    # a table profile: draft step 0.5 s, verify 1.0 / 1.5 / 2.0 s for k = 1 / 2 / 3, each plus
    # 0.01 s per token of context; the trace (prompt 8 tokens, 4 generated, max_k 2) is
    # tabulated at contexts 8 and 12 for k = 1..3: draft 0.58 / 0.62 s, verify k=3 2.08 / 2.12 s
    path = save_profile(TableLatency.from_samples(latency_table(0.5, {1: 1.0, 2: 1.5, 3: 2.0}, ctx=(0, 100),
                                                                slope=0.01), name="hand", hardware="2-core CPU"),
                        tmp_path / "hand.json")
    trace = with_latency(synth_trace(SynthSpec(prompts=1, tokens=4, prompt_len=8, max_k=2)), path)
    lat = trace.latency
    draft, verify = lat[lat["op"] == "draft_step"], lat[lat["op"] == "target_forward"]
    assert draft["context_len"].tolist() == [8, 12]
    assert draft["seconds"].tolist() == pytest.approx([0.58, 0.62])
    assert verify[verify["k"] == 3]["seconds"].tolist() == pytest.approx([2.08, 2.12])
    assert sorted(set(verify["k"])) == [1, 2, 3]
    assert set(lat["repeat"]) == {0} and not lat["corun"].any()  # one solo repeat, as measured once
    assert set(lat["batch"]) == {1}  # of one sequence
    assert trace.manifest.hardware == "2-core CPU"  # the profile's
    assert trace.manifest.notes == ("Synthetic trace: acceptance and latencies are generated, not measured. "
                                    f"Latencies tabulated from the profile {path} (hand), not measured.")


# -- trees: the probe's tree axis, or chains where it is missing ---------------------------------

CHAIN = {1: 0.3, 2: 0.6, 3: 0.9, 4: 0.6, 8: 0.8}


def test_without_tree_samples_a_tree_is_priced_as_a_chain_exactly(table):
    for k, ctx in ((1, 100), (3, 150), (12, 200)):
        assert table.target_tree(k, ctx) == table.target_forward(k, ctx)
        assert table.draft_tree_factor(k, ctx) == table.target_forward(k, ctx) / table.target_forward(1, ctx)


def test_probed_tree_verifications_correct_the_chain_by_their_measured_ratio():
    # tree verifications probed at k = 2 (1.5x the chain) and k = 8 (1.25x); in between the chain
    # times the ratio linear in k, outside it the nearest probed ratio
    lat = TableLatency.from_samples(latency_table(draft=0.1, verify=CHAIN, ctx=(100, 200), tree={2: 0.9, 8: 1.0}))
    assert lat.target_tree(2, 100) == pytest.approx(0.9)
    assert lat.target_tree(8, 150) == pytest.approx(1.0)
    assert lat.target_tree(4, 100) == pytest.approx(0.6 * (1.5 - 2 / 6 * 0.25))  # k = 4's cheap chain, not 0.9-1.0
    assert lat.target_tree(3, 100) == pytest.approx(0.9 * (1.5 - 1 / 6 * 0.25))
    assert lat.target_tree(1, 100) == pytest.approx(0.3 * 1.5)
    assert lat.target_tree(12, 100) == pytest.approx(1.0 * 1.25)  # the chain's extended slope, times 1.25
    assert lat.target_forward(2, 100) == pytest.approx(0.6)  # chains do not move


def test_probed_draft_expansions_correct_the_chain_stand_in():
    # the draft's 2-node level measured at 3 steps (the target's chain says 0.6 / 0.3 = 2), its
    # 4-node level at 4 (the chain: 2): corrections 1.5 and 2, linear between
    lat = TableLatency.from_samples(latency_table(draft=0.1, verify=CHAIN, ctx=(100, 200), expand={2: 0.3, 4: 0.4}))
    assert lat.draft_tree_factor(2, 100) == pytest.approx(3.0)
    assert lat.draft_tree_factor(4, 100) == pytest.approx(4.0)
    assert lat.draft_tree_factor(3, 100) == pytest.approx(0.9 / 0.3 * 1.75)
    grid = LatencyGrid(lat, 300)
    assert grid.tree_draft_seconds(100, (1, 2, 4)) == pytest.approx(0.3 + 0.1 * (3.0 - 1) + 0.1 * (4.0 - 1))
    assert grid.tree_draft_seconds(100, (1, 1)) == grid.draft_seconds(100, 2)  # width one: the draft's steps


def test_solo_tree_ratios_price_co_running_tree_forwards():
    lat = TableLatency.from_samples(latency_table(draft=0.1, verify=CHAIN, ctx=(100, 200), corun=(2.0, 1.5),
                                                  tree={2: 0.9}))
    assert lat.target_tree(2, 100, corun=True) == pytest.approx(0.6 * 1.5 * 1.5)


def test_tree_series_round_trip_through_a_profile(tmp_path):
    lat = TableLatency.from_samples(latency_table(draft=0.1, verify=CHAIN, ctx=(100, 200), tree={2: 0.9, 8: 1.0},
                                                  expand={2: 0.3}))
    back = load_profile(save_profile(lat, tmp_path / "p.json"))
    for k in (1, 3, 9):
        assert back.target_tree(k, 130) == lat.target_tree(k, 130)
        assert back.draft_tree_factor(k, 130) == lat.draft_tree_factor(k, 130)
    plain = TableLatency.from_samples(latency_table(draft=0.1, verify=CHAIN)).to_profile()
    assert "target_tree" not in plain and "draft_tree" not in plain  # profiles without them read as before


def corun_growth_table() -> TableLatency:
    """Verify 1.0 s for 1 token and 1.5 s for 2 solo; co-running 2.0 s and 4.0 s: the growth
    from 1 to 2 tokens is 1.5 solo and 2.0 co-running (a draft step 0.1 s, 0.2 s co-running)."""
    rows = [("draft_step", 1, c, NO_LAYER, corun, 0, s) for c in (0, 1000) for corun, s in ((False, 0.1), (True, 0.2))]
    rows += [("target_forward", k, c, NO_LAYER, corun, 0, s) for c in (0, 1000)
             for corun, k, s in ((False, 1, 1.0), (False, 2, 1.5), (True, 1, 2.0), (True, 2, 4.0))]
    return TableLatency.from_samples(pd.DataFrame(rows, columns=["op", "k", "context_len", "layer", "corun", "repeat",
                                                                 "seconds"]))


def test_an_unprobed_draft_expansion_grows_as_the_co_running_target_does():
    # no draft_tree samples: a 2-node draft forward costs the target's growth from 1 to 2 tokens
    # in draft steps, 1.5 / 1.0 solo and 4.0 / 2.0 = 2.0 co-running
    lat = corun_growth_table()
    assert lat.draft_tree_factor(2, 100) == 1.5
    assert lat.draft_tree_factor(2, 100, corun=True) == 2.0


def test_co_running_figures_round_trip_through_a_profile(tmp_path):
    back = load_profile(save_profile(corun_growth_table(), tmp_path / "p.json"))
    assert back.has_corun and back.source == "trace samples (medians)"
    assert [back.target_forward(2, 100, corun) for corun in (False, True)] == [1.5, 4.0]
    assert [back.draft_step(100, NO_LAYER, corun) for corun in (False, True)] == [0.1, 0.2]


def test_a_shadow_read_costs_an_exit_head_per_layer():
    # exit head over 4 rows: 0.01 s; DEL reading 3 exit layers' shadow tokens: 3 x 0.01 s
    grid = LatencyGrid(TableLatency.from_samples(latency_table(heads={4: 0.01})), 300)
    assert grid.exit_head(4) == 0.01
    assert grid.shadow_seconds(4, 3) == pytest.approx(0.03)
    assert grid.exit_head(4) == 0.01  # asked again: the same figure
    # a model probed without the exit-head axis prices no shadow read
    bare = LatencyGrid(TableLatency.from_samples(latency_table()), 300)
    assert (bare.prices_shadows, bare.exit_head(4), bare.shadow_seconds(4, 3)) == (False, None, 0.0)


class ScalarOnly:
    """A latency model that takes one context length at a time (int() of an array fails)."""

    name = "scalar-only"

    def draft_step(self, context_len, layer=NO_LAYER, corun=False):
        return 0.1 + 0.001 * int(context_len)

    def target_forward(self, k, context_len, corun=False):
        return 1.0 + 0.01 * int(context_len)


def test_a_model_that_takes_no_arrays_is_tabulated_one_context_at_a_time():
    # draft step 0.1 + 0.001 c, verify 1.0 + 0.01 c: at c = 0..4 the grid holds what the model says
    grid = LatencyGrid(ScalarOnly(), 4)
    assert grid.target_row(1) == pytest.approx([1.0, 1.01, 1.02, 1.03, 1.04])
    assert grid.draft_seconds(0, 2) == pytest.approx(0.1 + 0.101)


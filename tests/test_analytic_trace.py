"""The closed forms beside the simulator: they agree on i.i.d. traces, the i.i.d. form drifts on
bursty ones while the run-length model keeps up; h(k), s and TPL follow their papers' formulas."""

import pandas as pd
import pytest

from simlab.analytic import closed_form as analytic
from simlab.analytic.on_trace import analyse_trace
from simlab.sim.run import Simulator
from simlab.trace.synth import SynthSpec, synth_trace
from tests.helpers import hand_trace, latency_table

TOKENS = 20_000


@pytest.fixture(scope="module")
def iid():
    trace = synth_trace(SynthSpec(alpha=0.8, prompts=4, tokens=TOKENS // 4, rollout=0, seed=11), command="test")
    return analyse_trace(Simulator(trace), max_gamma=8)


@pytest.fixture(scope="module")
def bursty():
    spec = SynthSpec(kind="markov", alpha=0.95, alpha_bad=0.3, prompts=4, tokens=TOKENS // 4, rollout=0, seed=12)
    return analyse_trace(Simulator(synth_trace(spec, command="test")), max_gamma=8)


def test_closed_forms_match_the_simulator_within_1_percent_on_an_iid_trace(iid):
    assert iid.alpha == pytest.approx(0.8, abs=0.01)
    for g in iid.gammas:
        assert abs(g.err_iid) < 0.01, g
        assert abs(g.err_runs) < 0.01, g
        assert g.tokens_runs == pytest.approx(g.tokens_sim, rel=0.01)
    # acceptance does not depend on the place in the run
    assert max(iid.position_acceptance) - min(iid.position_acceptance) < 0.02


def test_iid_assumption_overstates_bursty_traces_and_the_run_model_does_not(bursty):
    errs = [g.err_iid for g in bursty.gammas]
    assert errs[-1] > 0.05  # mean α hides the droughts rounds start in
    assert errs == sorted(errs)  # and the error grows with γ
    assert all(abs(g.err_runs) < 0.03 for g in bursty.gammas)
    acc = bursty.position_acceptance
    assert acc[3] > acc[0] + 0.05  # after a few acceptances the next is more likely


def test_h_rule_window_and_costs_come_from_the_latency_model():
    lat = latency_table(draft=0.1, verify={1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 5: 1.8})
    a = analyse_trace(Simulator(hand_trace(["1" * 40], latency=lat)), max_gamma=3)
    assert (a.t_draft, a.t_target) == pytest.approx((0.1, 1.0))
    # h(k) = (T_v(k+1) - k T_d) / T_r with T_r = T_v(k+1)
    assert [h.h for h in a.h] == pytest.approx([(1.2 - 0.1) / 1.2, (1.4 - 0.2) / 1.4, (1.6 - 0.3) / 1.6])
    assert a.window == 10  # floor(1.0 / 0.1)
    assert a.window_corun is None
    # all accepted: gamma+1 tokens per round; speedup = (g+1) / (g c + v(g+1))
    g3 = a.gammas[2]
    assert g3.tokens_iid == g3.tokens_runs == 4
    assert g3.speedup_iid == pytest.approx(4 / (3 * 0.1 + 1.6))


def test_tpl_table_follows_del_eq_1():
    trace = hand_trace(["1" * 21])
    trace.manifest.n_layers = 8
    rows = []
    for layer, bits in ((2, "0" * 21), (4, "01" * 10 + "0"), (6, "1" * 21)):
        for pos, b in enumerate(bits):
            match = trace.positions.target_token[pos] if b == "1" else -1
            rows.append({"prompt_id": 0, "pos": pos, "layer": layer, "token": match, "draft_conf": 0.5,
                         "draft_entropy": 1.0})
    trace.layers = pd.DataFrame(rows)
    tpl = analyse_trace(Simulator(trace), max_gamma=4).tpl
    assert tpl.layers == [2, 4, 6]
    assert tpl.alpha == pytest.approx([0.0, 0.5, 1.0])
    assert tpl.values[1][3] == pytest.approx(analytic.tokens_per_layer(0.5, 3, 4, 8))
    assert tpl.values[1][3] == pytest.approx((1 - 0.5**4) / (0.5 * (3 * 4 + 8)))
    assert tpl.best == (6, 4, pytest.approx(5 / (4 * 6 + 8)))  # layer 6 always right: draft the most

"""On i.i.d. synthetic traces the simulator agrees with Leviathan et al.'s closed forms."""

import pytest

from simlab import analytic
from simlab.sim.run import Simulator
from simlab.trace.synth import SynthSpec, synth_trace, synthetic_latency

ALPHAS = (0.6, 0.8, 0.9)
CS = (0.05, 0.2)
GAMMAS = range(1, 11)
TOKENS = 50_000  # 5 prompts x 10,000 positions: end-of-prompt effects stay far below 1%


@pytest.fixture(scope="module", params=ALPHAS)
def iid(request):
    alpha = request.param
    trace = synth_trace(SynthSpec(alpha=alpha, prompts=5, tokens=TOKENS // 5, rollout=0, seed=7), command="test")
    measured = (trace.positions.draft_token == trace.positions.target_token).mean()
    return alpha, measured, trace


@pytest.mark.parametrize("c", CS)
@pytest.mark.parametrize("verify_slope", (0.0, 0.1))
def test_simulated_sd_matches_closed_form_within_one_percent(iid, c, verify_slope):
    alpha, measured, trace = iid
    assert measured == pytest.approx(alpha, abs=0.01)
    trace.latency = synthetic_latency(SynthSpec(c=c, verify_slope=verify_slope, tokens=TOKENS // 5))
    sim = Simulator(trace)
    for gamma in GAMMAS:
        s = sim.run("sd", {"gamma": gamma}, with_cost=False).summary
        tokens_per_round = s.tokens / s.target_calls
        assert tokens_per_round == pytest.approx(analytic.expected_tokens(measured, gamma), rel=0.01), gamma
        assert s.speedup == pytest.approx(analytic.speedup(measured, c, gamma, verify_slope), rel=0.01), gamma


def test_closed_form_known_values():
    # Leviathan et al. 2023, Table/Fig. 3 regime: alpha=0.8, gamma=5 gives 3.69 tokens per round.
    assert analytic.expected_tokens(0.8, 5) == pytest.approx((1 - 0.8**6) / 0.2)
    assert analytic.expected_tokens(1.0, 5) == 6
    assert analytic.speedup(0.8, 0.0, 5) == pytest.approx(analytic.expected_tokens(0.8, 5))
    # if alpha > c some gamma beats 1 by at least (1 + alpha) / (1 + c) (Leviathan Cor. 3.9)
    g = analytic.optimal_gamma(0.6, 0.2)
    assert analytic.speedup(0.6, 0.2, g) >= (1 + 0.6) / (1 + 0.2)
    # a steep verify cost pushes the optimal gamma down
    assert analytic.optimal_gamma(0.9, 0.05, verify_slope=0.5) < analytic.optimal_gamma(0.9, 0.05)

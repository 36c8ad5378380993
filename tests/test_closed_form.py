"""On i.i.d. synthetic traces the simulator agrees with Leviathan et al.'s closed forms."""

import itertools
import math

import pytest

from simlab.analytic import closed_form as analytic
from simlab.common.errors import SimlabError
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


def enumerated_tokens_per_round(alpha: float, gamma: int) -> float:
    """E by brute force: over all 2^γ accept/reject outcomes of the γ drafts (each accepted with
    probability α, independently), a round emits the drafts before the first rejection plus
    one target token."""
    expected = 0.0
    for outcome in itertools.product((True, False), repeat=gamma):
        p = math.prod(alpha if ok else 1 - alpha for ok in outcome)
        leading = next((i for i, ok in enumerate(outcome) if not ok), gamma)
        expected += p * (leading + 1)
    return expected


@pytest.mark.parametrize("alpha", (0.0, 0.3, 0.8, 1.0))
@pytest.mark.parametrize("gamma", (1, 2, 5, 8))
def test_closed_form_matches_brute_force_enumeration(alpha, gamma):
    e = enumerated_tokens_per_round(alpha, gamma)
    assert analytic.expected_tokens(alpha, gamma) == pytest.approx(e)
    # a round costs γ draft steps (c each) and one verify of γ + 1 tokens (1 + slope·γ target steps),
    # and its first draft step feeds two tokens (c·(1 + slope)) when the round before it accepted
    # every draft: in the long run as often as a round does, the one outcome of 2^γ with no rejection
    full = sum(math.prod(alpha if ok else 1 - alpha for ok in outcome)
               for outcome in itertools.product((True, False), repeat=gamma) if all(outcome))
    for c, slope in ((0.0, 0.0), (0.1, 0.0), (0.05, 0.2)):
        cost = gamma * c + 1 + slope * gamma + full * c * slope
        assert analytic.speedup(alpha, c, gamma, slope) == pytest.approx(e / cost)


def test_closed_form_known_values():
    # Leviathan et al. 2023, Fig. 3 regime: α = 0.8, γ = 5 gives 1 + 0.8 + ... + 0.8^5 = 3.69 tokens
    assert analytic.expected_tokens(0.8, 5) == pytest.approx(3.68928)
    assert analytic.expected_tokens(1.0, 5) == 6
    # the speedup the CLI test checks: 3.68928 / (5 · 0.1 + 1) = 2.4595
    assert analytic.speedup(0.8, 0.1, 5) == pytest.approx(2.45952)
    # if alpha > c some gamma beats 1 by at least (1 + alpha) / (1 + c) (Leviathan Cor. 3.9)
    g = analytic.optimal_gamma(0.6, 0.2)
    assert analytic.speedup(0.6, 0.2, g) >= (1 + 0.6) / (1 + 0.2)
    # a steep verify cost pushes the optimal gamma down
    assert analytic.optimal_gamma(0.9, 0.05, verify_slope=0.5) < analytic.optimal_gamma(0.9, 0.05)


@pytest.mark.parametrize("call,message", [
    (lambda: analytic.speedup(1.5, 0.1, 5), "alpha must be in [0, 1], got 1.5"),
    (lambda: analytic.speedup(0.8, -0.1, 5), "c must be >= 0, got -0.1"),
    (lambda: analytic.speedup(0.8, math.inf, 5), "c must be >= 0, got inf"),
    (lambda: analytic.speedup(0.8, 0.1, 0), "gamma must be >= 1, got 0"),
    (lambda: analytic.speedup(0.8, 0.1, 5, verify_slope=-0.1), "verify slope must be >= 0, got -0.1"),
    (lambda: analytic.optimal_gamma(0.8, 0.1, verify_slope=-0.1), "verify slope must be >= 0, got -0.1"),
])
def test_parameters_outside_the_closed_forms_are_refused_by_name(call, message):
    with pytest.raises(SimlabError) as err:
        call()
    assert str(err.value) == message


def test_the_optimal_gamma_ranges_over_1_to_max_gamma():
    # α = 0.3, c = 0.2: S(1) = 1.3 / 1.2 = 1.08 beats S(2) = 1.39 / 1.4 = 0.99, and S falls on
    assert analytic.optimal_gamma(0.3, 0.2) == 1
    # every draft accepted and drafting free: S(γ) = γ + 1 grows to the longest γ allowed
    assert analytic.optimal_gamma(1.0, 0.0, max_gamma=8) == 8


def test_a_verification_costs_one_target_step_whatever_its_length_by_default():
    # Leviathan et al.'s assumption; a slope prices each further token
    assert analytic.verify_cost(9) == 1.0
    assert analytic.verify_cost(9, verify_slope=0.5) == 5.0


def test_analyse_reports_the_closed_forms_at_gamma_and_at_the_best_gamma():
    # α = 0.8, c = 0.2, slope 0.1: S(γ) = E(γ) / (1 + 0.3 γ + 0.02 · 0.8^γ) with E = 1.8, 2.44,
    # 2.952, 3.3616 for γ = 1..4: S = 1.368, 1.513, 1.545, 1.522; the best γ is 3
    assert analytic.analyse(0.8, 0.2, 4, verify_slope=0.1).to_dict() == pytest.approx({
        "alpha": 0.8, "c": 0.2, "gamma": 4, "verify_slope": 0.1, "expected_tokens": 3.3616,
        "speedup": 3.3616 / 2.208192, "optimal_gamma": 3, "optimal_speedup": 2.952 / 1.91024})
    # without a slope, Leviathan's S (the known value above)
    result = analytic.analyse(0.8, 0.1, 5)
    assert (result.verify_slope, result.speedup) == (0.0, pytest.approx(2.45952))


def test_the_parallel_window_is_the_drafts_that_fit_in_a_target_forward_and_at_least_one():
    # SPIDE eq. 6: s = ⌊v_q / v_p⌋; 0.3 / 0.1 is 2.9999999999999996 in floating point, read as 3
    assert analytic.parallel_window(t_draft=0.1, t_target=0.3) == 3
    assert analytic.parallel_window(t_draft=0.4, t_target=1.0) == 2
    assert analytic.parallel_window(t_draft=2.0, t_target=1.0) == 1  # a draft step outlasts a verification

"""vLLM's adaptive verification as a batch-level policy of serve (simlab.serve.adaptive_verify):
slots admitted by survival, the budget from the step's cost, the online fit from verified
outcomes only, and a run that conserves requests and tokens."""

import inspect
import math

import pytest

from simlab.cli import main
from simlab.common.errors import SimlabError
from simlab.latency.batch import BatchLatency
from simlab.serve import batch_policy
from simlab.serve.adaptive_verify import (
    PRIOR_BIAS,
    AcceptanceFit,
    AdaptiveVerify,
    admit,
    choose_budget,
    feature,
    survival,
)
from simlab.serve.batch_policy import BatchSpec
from simlab.serve.run import ServeConfig, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.sim.run import Simulator
from tests.helpers import hand_trace, latency_table

# two requests' survivals, by hand from per-position acceptance 0.9, 0.5 and 0.8, 0.9, 0.5
SURVIVALS = [[0.9, 0.45], [0.8, 0.72, 0.36]]


def test_survival_is_the_running_product_of_the_acceptance_estimates():
    assert survival([0.9, 0.5]) == pytest.approx(SURVIVALS[0], rel=1e-12)
    assert survival([0.8, 0.9, 0.5]) == pytest.approx(SURVIVALS[1], rel=1e-12)


@pytest.mark.parametrize("budget,counts", [(0, [0, 0]), (1, [1, 0]), (2, [1, 1]), (3, [1, 2]), (4, [2, 2]),
                                           (5, [2, 3]), (9, [2, 3])])
def test_the_budgets_best_slots_are_admitted_by_hand(budget, counts):
    # the slots in decreasing survival: 0.9 (request 0, draft 1), 0.8 (1, 1), 0.72 (1, 2), 0.45 (0, 2), 0.36 (1, 3)
    assert admit(SURVIVALS, budget) == counts


def test_the_budget_maximises_expected_tokens_per_second_of_the_step_by_hand():
    # 2 requests each emit one token whatever is verified, plus the survivals admitted; a step of
    # 1 s plus 0.2 s per verified draft: b = 0..5 gives 2/1.0, 2.9/1.2, 3.7/1.4, 4.42/1.6, 4.87/1.8,
    # 5.23/2.0 = 2.0, 2.42, 2.64, 2.76, 2.71, 2.62 tokens/s: b = 3
    assert choose_budget(SURVIVALS, lambda counts: 1.0 + 0.2 * sum(counts), 2) == (3, [1, 2])
    # verifying is free: every slot; a draft costs more than any can earn: none
    assert choose_budget(SURVIVALS, lambda counts: 1.0, 2) == (5, [2, 3])
    assert choose_budget(SURVIVALS, lambda counts: 1.0 + 10.0 * sum(counts), 2) == (0, [0, 0])
    # a padded step function (vLLM's cost below its CUDA graph limit): 3 or 4 drafts cost as much
    # as 4, so the fourth slot rides free: 4.42/1.8 = 2.46 < 4.87/1.8 = 2.71 > 2.9/1.2 = 2.42
    padded = {0: 1.0, 1: 1.2, 2: 1.6, 3: 1.8, 4: 1.8, 5: 2.4}
    assert choose_budget(SURVIVALS, lambda counts: padded[sum(counts)], 2) == (4, [2, 2])


def test_the_feature_is_the_logit_of_the_drafts_probability_clamped_as_vllm_clamps_it():
    assert feature(0.5) == 0.0
    assert feature(0.9) == pytest.approx(math.log(9.0), rel=1e-12)
    assert (feature(1.0), feature(0.0), feature(1e-30)) == (40.0, -40.0, -40.0)


def test_the_fit_starts_uniform_at_vllms_prior():
    fit = AcceptanceFit(3)
    assert fit.probabilities([feature(0.99), feature(0.2), 0.0]) == [1 / (1 + math.exp(-PRIOR_BIAS))] * 3
    assert fit.warming_up  # vLLM verifies whole drafts for its first 3 refits


def test_only_the_positions_the_target_judged_are_observed():
    fit = AcceptanceFit(3)
    p = [0.5, 0.5, 0.5]
    fit.observe([1.0, 2.0, 3.0], p, admitted=2, accepted=2)  # both verified drafts accepted; the third not verified
    fit.observe([1.0, 2.0, 3.0], p, admitted=3, accepted=1)  # the second rejected; the third never judged
    assert fit.counts == [2.0, 2.0, 0.0]
    assert fit.score_b == [1.0, 0.0, 0.0]  # labels minus 0.5: (+0.5 +0.5), (+0.5 -0.5)


def test_one_refit_is_the_damped_newton_step_by_hand():
    # one position, features +1 (accepted) and -1 (rejected), both predicted p0 = sigmoid(1.5):
    # weights w = p0 (1 - p0); slope information 2w, score (1 - p0) + p0 = 1; the coupling cancels
    # (w - w); the intercept's information 2w, score 1 - 2 p0. Newton: slope 1 / 2w, intercept
    # (1 - 2 p0) / 2w, each damped by n / (n + 50) = 2 / 52
    p0 = 1 / (1 + math.exp(-PRIOR_BIAS))
    w = p0 * (1 - p0)
    fit = AcceptanceFit(1, refit_steps=1, ridge=0.0)
    fit.observe([1.0], [p0], admitted=1, accepted=1)
    fit.observe([-1.0], [p0], admitted=1, accepted=0)
    fit.step()
    assert fit.slope == pytest.approx(1 / (2 * w) * 2 / 52, rel=1e-12)
    assert fit.bias == pytest.approx([PRIOR_BIAS + (1 - 2 * p0) / (2 * w) * 2 / 52], rel=1e-12)
    assert (fit.refits, fit.counts, fit.info_ss) == (1, [0.0], 0.0)  # a new round starts clean


def test_a_refit_that_would_make_the_slope_negative_keeps_the_slope():
    fit = AcceptanceFit(1, refit_steps=1)
    fit.observe([1.0], [0.5], admitted=1, accepted=0)  # a confident draft rejected
    fit.observe([-1.0], [0.5], admitted=1, accepted=1)  # an unsure one accepted
    fit.step()
    assert fit.slope == 0.0 and fit.refits == 1


def test_the_policy_sees_drafts_confidences_never_the_trace():
    # what the step's admission is given: the drafts' confidences, contexts and the draft phase's
    # price; acceptance reaches it only through observe, after the target verified
    assert list(inspect.signature(AdaptiveVerify.verified).parameters) == ["self", "confidences", "ctxs",
                                                                          "draft_seconds"]
    assert list(inspect.signature(AdaptiveVerify.observe).parameters) == ["self", "admitted", "accepted"]


LEARNS = dict(refit_steps=2, warmup_refits=1)


@pytest.fixture
def quick_fit(monkeypatch):
    """serve's adaptive verification with a fit that refits every 2 steps after one warm-up refit."""
    made = []

    def build(latency, k):
        made.append(AdaptiveVerify(latency, k, AcceptanceFit(k, **LEARNS)))
        return made[-1]

    monkeypatch.setattr(batch_policy, "AdaptiveVerify", build)
    return made


def spotty_run(batch=BatchSpec(adaptive_verify=6)):
    # confident drafts are accepted (0.9), unsure ones rejected (0.4); a verified draft costs 0.1 s
    patterns = ["1" + "1110" * 10, "1" + "10" * 20, "1" + "1111110" * 5, "1" + "0110" * 10]
    trace = hand_trace(patterns, latency=latency_table(draft=0.01, verify={k: 1 + 0.1 * k for k in range(1, 41)}))
    return serve_once(Simulator(trace), [0.0] * 8, ServeConfig(scheduler=Scheduler(4, 100), batch=batch),
                      "sd", {"gamma": 6}, record=True)


def test_adaptive_verification_conserves_requests_and_tokens_and_verifies_at_most_what_was_drafted(quick_fit):
    run = spotty_run()
    assert sorted(r.request_id for r in run.requests) == list(range(8))
    for r in run.requests:
        c = r.counts
        assert r.finished_steps == 1 and r.committed == r.replay.n_tokens
        assert c.accepted + c.target_calls == r.replay.n_tokens - 1 == c.tokens
        assert c.accepted <= c.verified <= c.drafted
    slices = sorted(run.slices, key=lambda s: s.start)
    assert all(a.end <= b.start + 1e-12 for a, b in zip(slices, slices[1:]))
    assert sum(s.args.get("accepted", 0) for s in slices) == sum(r.counts.accepted for r in run.requests)
    # the verifications carry each request's admitted drafts and its bonus token
    verified = sum(r.counts.verified for r in run.requests)
    assert sum(s.args["tokens"] for s in slices if s.name == "verify") == verified + run.stats.batch_sizes
    # once the fit has learnt, drafts are trimmed: fewer verified than drafted
    assert verified < sum(r.counts.drafted for r in run.requests)


def test_the_fit_learns_only_from_verified_outcomes(quick_fit):
    run = spotty_run()
    fit = quick_fit[0].fit
    # every position the target judged, with the target's verdict, went into the fit, and nothing
    # else: not a draft left unverified, nor the acceptance it would have had
    checked, accepted = run.positions.checked, run.positions.accepted
    assert fit.seen == checked + [0] * (6 - len(checked))
    assert fit.seen_accepted == accepted + [0] * (6 - len(accepted))
    assert sum(fit.seen) < sum(r.counts.drafted for r in run.requests)
    # a confident draft is likelier to be accepted: the slope grew from 0
    assert fit.slope > 0.0


def test_while_warming_up_adaptive_verification_is_fixed_k_number_for_number():
    # vLLM's warm-up (3 refits of 100 steps) verifies whole drafts: a run shorter than that is sd's
    fixed, adaptive = spotty_run(BatchSpec()), spotty_run()
    assert adaptive.batch_policy == "adaptive-verify" and adaptive.stats.steps < 300
    assert fixed.summary == adaptive.summary
    assert [s.args for s in fixed.slices] == [s.args for s in adaptive.slices]


def test_a_policy_that_adapts_to_outcomes_is_refused_in_one_line():
    trace = hand_trace(["1" * 10])
    with pytest.raises(SimlabError, match="--adaptive-verify trims a round after it is drafted"):
        serve_once(Simulator(trace), [0.0], ServeConfig(batch=BatchSpec(adaptive_verify=4)), "adaedl", {})


@pytest.mark.parametrize("spec,needle", [(dict(adaptive_verify=0), "--adaptive-verify must be a draft length >= 1"),
                                         (dict(smartspec=4, adaptive_verify=4),
                                          "choose one batch-level policy, got --smartspec and --adaptive-verify")])
def test_bad_adaptive_verification_is_refused_by_flag(spec, needle):
    with pytest.raises(SimlabError, match=needle):
        BatchSpec(**spec)


def test_the_cost_curve_is_the_engines_own_price_of_the_step():
    trace = hand_trace(["1" * 10], latency=latency_table(draft=0.01, verify={k: 1.0 + k for k in range(1, 41)}))
    latency = BatchLatency(Simulator(trace).latency)
    policy = AdaptiveVerify(latency, 2, AcceptanceFit(2, warmup_refits=0))
    # the uniform prior p0 = 0.818: survivals 0.818 and 0.669 for each of 2 requests; their
    # verification of b drafts and 2 bonus tokens costs the token-count rule's forward of 2 + b
    # tokens, 3 + b s. With no draft phase b = 0..4 gives 2/3, 2.82/4, 3.64/5, 4.31/6, 4.97/7 =
    # 0.667, 0.705, 0.727, 0.717, 0.710 tokens/s: one draft each
    assert policy.verified([[0.9, 0.9], [0.9, 0.9]], [20, 20], 0.0) == [1, 1]
    # a draft phase of 2 s makes each verified draft cheaper against the step: 2/5 ... 4.97/9 rises, all four
    assert policy.verified([[0.9, 0.9], [0.9, 0.9]], [20, 20], 2.0) == [2, 2]


@pytest.mark.parametrize("args,needle", [
    (["serve", "--adaptive-verify", "0"], "--adaptive-verify must be a draft length >= 1"),
    (["serve", "--adaptive-verify", "4", "--sd-off-above", "2"], "got --sd-off-above and --adaptive-verify"),
    (["sweep", "--policy", "sd", "--adaptive-verify", "4"], "--adaptive-verify sets how a serving sweep serves"),
])
def test_the_flag_is_refused_in_one_line_before_the_trace_is_read(args, needle, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([*args, "--trace", str(tmp_path / "no-such-trace")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and needle in err

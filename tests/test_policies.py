"""Every policy's rounds on small hand-built traces, derived by hand from its paper's rule.

Traces come from ``tests/helpers.py``: '1' marks a position where the draft matches the target,
position 0 is the prefill's; entropy is 1 − confidence. Unless said otherwise a draft step costs
0.1 s and a verify 1 s whatever k. ``rounds`` lists (start, verified positions, accepted) of the
target's forwards of prompt 0.
"""

import dataclasses
import math
import random

import pytest

from simlab.cli.policy_options import declared, flag_type
from simlab.common.errors import SimlabError
from simlab.common.signals import ShadowTokens, TokenSignal
from simlab.policies import REGISTRY, Outcome, PolicyContext
from simlab.policies.base import COUNT, ConfidencePredictor, Decision, Param, RoundState, Serial, choice
from simlab.policies.del_update import row_max, tpl_argmax, tpl_row
from simlab.policies.dv import DraftVerify
from simlab.policies.early_exit import Del
from simlab.policies.entropy import AdaEdl, acceptance_lower_bound
from simlab.policies.hf import roc_threshold
from simlab.policies.llama_cpp import LlamaCpp
from simlab.policies.stop import StopRule
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from tests.helpers import hand_trace, latency_table


def rounds(result, prompt=None):
    return [(s.args["position"], s.args["tokens"], s.args["accepted"]) for s in result.timeline if s.device == "target"]


def simulate(trace, policy, timeline_prompt=0, **params):
    return Simulator(trace).run(policy, params, timeline_prompt=timeline_prompt, with_cost=False)


def conf_trace(conf, pattern=None, **kw):
    """One prompt, all positions accepted unless ``pattern`` says otherwise; conf[0] is the prefill's."""
    return hand_trace([pattern or "1" * len(conf)], conf=[conf], **kw)


# -- Hugging Face assisted generation ------------------------------------------------------------

def test_hf_heuristic_adds_two_after_a_full_accept_and_drops_one_otherwise():
    # N=2: 1..2 accepted (+bonus at 3) -> N=4: 4..7, 6 rejected -> N=3: 7..9 accepted -> N=5;
    # the last position is a plain target step (nothing drafted: N stays 5; transformers counts
    # 0 of 0 drafts as all accepted, N = 7, which simlab does not yet: docs/policies/hf.md).
    pattern = "1" + "11" + "1" + "1101" + "11" + "1" + "1"
    trace = hand_trace([pattern, "1" * 12])
    assert rounds(simulate(trace, "hf-heuristic", gamma=2)) == [(1, 3, 2), (4, 5, 2), (7, 4, 3), (11, 1, 0)]
    # N persists into the next prompt (written back to the assistant's config)
    assert rounds(simulate(trace, "hf-heuristic", timeline_prompt=1, gamma=2))[0] == (1, 6, 5)


def test_hf_heuristic_transient_restarts_n_with_each_prompt():
    pattern = "1" + "11" + "1" + "1101" + "11" + "1" + "1"
    trace = hand_trace([pattern, "1" * 12])
    transient = simulate(trace, "hf-heuristic", timeline_prompt=1, gamma=2, schedule="heuristic_transient")
    assert rounds(transient)[0] == (1, 3, 2)


def test_hf_confidence_with_the_heuristic_schedule_grows_n_after_a_round_cut_short_but_fully_accepted():
    # transformers >= 4.45: the confidence criterion and the schedule apply together. N=2: 1, 2
    # (+bonus 3) -> N=4: 4, 5 (0.3 < 0.4: stop) all accepted -> N=6 (HF compares with the
    # tokens drafted) -> 7..12 (+bonus 13) -> the last position drafts nothing.
    trace = conf_trace([0.9] * 5 + [0.3] + [0.9] * 9)
    combined = simulate(trace, "hf-confidence", num_assistant_tokens=2, num_assistant_tokens_schedule="heuristic")
    assert rounds(combined) == [(1, 3, 2), (4, 3, 2), (7, 7, 6), (14, 1, 0)]
    constant = simulate(trace, "hf-confidence", num_assistant_tokens=2)
    assert rounds(constant) == [(1, 3, 2), (4, 3, 2), (7, 3, 2), (10, 3, 2), (13, 2, 1)]


def test_hugging_face_names_are_aliases_of_the_same_knob():
    trace = conf_trace([0.9, 0.9, 0.9, 0.3] + [0.9] * 6)
    assert rounds(simulate(trace, "sd", num_assistant_tokens=3)) == rounds(simulate(trace, "sd", gamma=3))
    by_hf_name = simulate(trace, "hf-confidence", assistant_confidence_threshold=0.2)
    assert by_hf_name.params["threshold"] == 0.2
    assert rounds(by_hf_name) == rounds(simulate(trace, "hf-confidence", threshold=0.2))
    with pytest.raises(SimlabError, match="given twice"):
        simulate(trace, "sd", gamma=3, num_assistant_tokens=4)


@pytest.mark.parametrize("policy, params, message", [
    ("sd", {"gamma": 0}, "gamma must be an integer >= 1"),
    ("hf-confidence", {"schedule": "linear"}, "schedule must be one of constant, heuristic, heuristic_transient"),
    ("hf-heuristic", {"schedule": "constant"}, "schedule must be one of heuristic, heuristic_transient"),
    ("del", {"dynamic_exit": 1}, "dynamic_exit must be true or false"),
    ("pacer", {"rho": -1.0}, "rho must be a finite number > 0"),
    ("pacer", {"rho": 0.0}, "rho must be a finite number > 0"),  # 0 is not > 0
    ("spide", {"tau": 1.5}, "tau must be a number in"),
])
def test_every_declared_parameter_is_checked_by_its_declaration(policy, params, message):
    with pytest.raises(SimlabError, match=message):
        simulate(conf_trace([0.9] * 4), policy, **params)


def test_hf_heuristic_never_drops_below_one_draft_token():
    # N=1: position 1 is rejected, so N = max(1, 1 - 1) = 1, not 0 (which would turn the policy
    # into autoregressive decoding for good): every later round still drafts one token.
    trace = hand_trace(["1" + "0" + "0" + "1" + "1"])
    assert rounds(simulate(trace, "hf-heuristic", gamma=1)) == [(1, 2, 0), (2, 2, 0), (3, 2, 1)]


def test_hf_confidence_stops_after_the_first_token_below_the_threshold():
    trace = conf_trace([0.9, 0.9, 0.9, 0.3] + [0.9] * 6)
    # 1, 2 (0.9), 3 (0.3 < 0.4: stop, kept); then 5..8, capped by the prompt's end
    assert rounds(simulate(trace, "hf-confidence")) == [(1, 4, 3), (5, 5, 4)]
    assert rounds(simulate(trace, "hf-confidence", max_draft=2)) == [(1, 3, 2), (4, 3, 2), (7, 3, 2)]


@pytest.mark.parametrize("seed", range(20))
def test_roc_threshold_matches_scikit_learn_and_hf_cost(seed):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    import numpy as np

    rng = np.random.default_rng(seed)
    scores = np.round(rng.random(12), 1)  # ties on purpose
    labels = rng.random(12) < scores
    if labels.all() or not labels.any():
        labels[0] = not labels[0]
    fpr, tpr, thresholds = sklearn_metrics.roc_curve(labels, scores)
    expected = thresholds[np.argmin(fpr + 3 * (1 - tpr))]
    assert roc_threshold(scores.tolist(), labels.tolist()) == pytest.approx(expected)


def test_hf_confidence_retune_moves_the_threshold_from_the_next_round():
    # Accepted tokens have confidence 0.5, rejected ones 0.45, so at the initial threshold 0.4
    # nothing stops drafting before the cap (20) or the prompt's end. After round 2 there are 8
    # samples (6 accepted, 2 rejected): the ROC threshold becomes 0.5, and from round 3 on each
    # 0.45 token stops drafting.
    pattern = "1" + "1110" * 6
    conf = [0.9] + [0.5, 0.5, 0.5, 0.45] * 6
    plain = simulate(conf_trace(conf, pattern), "hf-confidence")
    assert rounds(plain) == [(1, 21, 3), (5, 20, 3), (9, 16, 3), (13, 12, 3), (17, 8, 3), (21, 4, 3)]
    retuned = simulate(conf_trace(conf, pattern), "hf-confidence", retune=True)
    assert rounds(retuned) == [(1, 21, 3), (5, 20, 3), (9, 5, 3), (13, 5, 3), (17, 5, 3), (21, 4, 3)]


def test_hf_confidence_stops_below_the_threshold_not_at_it():
    # ConfidenceCriteria stops when p < threshold: a draft of exactly 0.5 (exact in float32, as
    # the trace stores it) goes on at threshold 0.5, one of 0.5 - 2^-10 stops (and is kept).
    # Six positions, all accepted: from 1 the cap is 6 - 1 - 1 = 4 drafts, whose bonus ends the
    # prompt; stopped after 2, the round from 4 drafts the last one that fits.
    at = conf_trace([0.9, 0.9, 0.5, 0.9, 0.9, 0.9])
    below = conf_trace([0.9, 0.9, 0.5 - 2 ** -10, 0.9, 0.9, 0.9])
    assert rounds(simulate(at, "hf-confidence", threshold=0.5)) == [(1, 5, 4)]
    assert rounds(simulate(below, "hf-confidence", threshold=0.5)) == [(1, 3, 2), (4, 2, 1)]


# Re-tuning's samples by hand (max_draft 5, threshold 0.4): drafts 1-4 match at confidence 0.6,
# 5 and 6 miss at 0.45, 7 on match at 0.5. Round 1 drafts 1..5 (none below 0.4): 4 accepted and
# the first rejected, 5 samples. Round 2 from 6 drafts 6..10: 6 is rejected, 1 sample more.
RETUNE_CONF = [0.9] + [0.6] * 4 + [0.45, 0.45] + [0.5] * 7
RETUNE_PATTERN = "1" + "1111" + "00" + "1" * 7


def test_hf_confidence_retunes_once_it_has_more_than_five_samples_of_both_kinds():
    # 5 samples are not enough (transformers: len(probs) > 5), 6 are: after round 2 the ROC
    # threshold of (0.6 x 4 accepted, 0.45 x 2 rejected) is 0.6 (FPR 0, FNR 0 at 0.6; cost 3 at
    # +inf). Round 3 from 7: 0.5 < 0.6 stops after one draft (accepted, bonus 8). After it the
    # samples add a 0.5 accepted: the threshold is 0.5 (cost 0; at 0.6 FNR 1/5, cost 0.6), and
    # round 4 from 9 drafts on at 0.5 (not below it) to the cap, 14 - 9 - 1 = 4.
    trace = conf_trace(RETUNE_CONF, RETUNE_PATTERN)
    assert rounds(simulate(trace, "hf-confidence", max_draft=5, retune=True)) == [
        (1, 6, 4), (6, 6, 0), (7, 2, 1), (9, 5, 4)]
    # without re-tuning round 3 drafts 7..11 (5, all accepted), and the last position is a plain step
    assert rounds(simulate(trace, "hf-confidence", max_draft=5)) == [(1, 6, 4), (6, 6, 0), (7, 6, 5), (13, 1, 0)]
    # a re-tuned threshold never needs both kinds from one prompt only: it restarts with each prompt
    assert roc_threshold([0.6] * 4 + [0.45] * 2, [True] * 4 + [False] * 2) == 0.6
    assert roc_threshold([0.6] * 4 + [0.45] * 2 + [0.5], [True] * 4 + [False] * 2 + [True]) == 0.5


def test_hf_confidence_at_threshold_0_is_not_retuned():
    # transformers keeps samples and re-tunes only while assistant_confidence_threshold is truthy:
    # at 0 (the criterion off) re-tuning stays off. On the re-tuning trace above nothing stops
    # drafting then: rounds of the cap (5), as without retune; re-tuned after round 2 (threshold
    # 0.6, as at 0.4) round 3 would stop after one draft
    trace = conf_trace(RETUNE_CONF, RETUNE_PATTERN)
    plain = [(1, 6, 4), (6, 6, 0), (7, 6, 5), (13, 1, 0)]
    assert rounds(simulate(trace, "hf-confidence", max_draft=5, threshold=0.0)) == plain
    assert rounds(simulate(trace, "hf-confidence", max_draft=5, threshold=0.0, retune=True)) == plain


# -- entropy bounds: SVIP, AdaEDL -----------------------------------------------------------------

def test_svip_stops_when_sqrt_of_0_15_entropy_exceeds_h():
    # entropy = 1 - conf: conf 0.3 -> H = 0.7 > h²/0.15 = 0.6 (stop); conf 0.5 -> H = 0.5 (go on)
    conf = [0.9] * 43 + [0.3] + [0.5] * 6
    # 1..40 (the cap), bonus 41; 42, 43 (stop); 45..48 (end of prompt)
    assert rounds(simulate(conf_trace(conf), "svip")) == [(1, 41, 40), (42, 3, 2), (45, 5, 4)]
    assert acceptance_lower_bound(0.6, 0.15) == pytest.approx(0.7)


def test_adaedl_stops_when_the_entropy_bound_falls_below_lambda():
    # 1 − sqrt(0.2·H) < 0.7  <=>  H > 0.45  <=>  conf < 0.55
    conf = [0.9, 0.6, 0.6, 0.5, 0.6, 0.6, 0.6]
    assert rounds(simulate(conf_trace(conf), "adaedl"))[0] == (1, 4, 3)


def test_adaedls_stop_rule_is_the_entropy_bound_below_lambda():
    # AdaEDL writes acceptance_lower_bound out in its per-token rule: the same decision on every
    # entropy, at λ just either side of the bound (the bound itself stops nothing: L < λ)
    policy, rng = AdaEdl(PolicyContext(latency=None), scale=0.3), random.Random(3)
    for entropy in [rng.random() * 4 for _ in range(500)] + [0.0, 1 / 0.3]:
        bound = acceptance_lower_bound(entropy, 0.3)
        for level in (math.nextafter(bound, -2.0), bound, math.nextafter(bound, 2.0)):
            policy.level = level
            assert policy.stops(TokenSignal(1, 0.5, entropy)) is (bound < level)


# -- Draft & Verify ----------------------------------------------------------------------------------

def test_dv_threshold_moves_toward_the_target_rate_after_each_round():
    # Round 1: 0.9, 0.9, 0.7 (< θ = 0.8: stop), x3 rejected: r = 2/3, ÃR = 1/3 < 0.9, so
    # θ = 0.9·0.8 + 0.1·0.81 = 0.801. Round 2 from 4: 0.85, then 0.8005 < 0.801 stops (it would
    # not at the initial θ = 0.8).
    conf = [0.9, 0.9, 0.9, 0.7, 0.85, 0.8005, 0.9, 0.9, 0.9, 0.9, 0.9]
    pattern = "1" + "110" + "1" * 7
    assert rounds(simulate(conf_trace(conf, pattern), "dv"))[:2] == [(1, 4, 2), (4, 3, 2)]


def test_adaptive_threshold_update_by_hand():
    """θ' = θ ± ε by ÃR vs α_target, unchanged when the round hit max_draft; θ ← β₂θ + (1-β₂)θ';
    θ persists across prompts and ÃR restarts at 0 (D&V code)."""
    policy = DraftVerify(PolicyContext(latency=None), max_draft=4)
    policy.observe(Outcome(False, 3, (), 2, 3))  # ÃR = 1/3 -> θ = 0.801
    assert policy.level == pytest.approx(0.801)
    for _ in range(3):  # full accepts of 4 = max_draft: ÃR 2/3 (up), 5/6 (up), 11/12 >= 0.9 (held)
        policy.observe(Outcome(False, 4, (), 4, 5))
    up1 = 0.9 * 0.801 + 0.1 * 0.811
    expected = 0.9 * up1 + 0.1 * (up1 + 0.01)
    assert policy.level == pytest.approx(expected)
    policy.observe(Outcome(False, 2, (), 2, 3))  # ÃR >= 0.9 and below the cap: θ - ε
    assert policy.level == pytest.approx(0.9 * expected + 0.1 * (expected - 0.01))
    level = policy.level
    policy.reset(None)
    assert policy.level == level and policy._rate == 0.0


def test_adaedl_lambda_uses_the_draft_and_verify_update():
    ada, dv = AdaEdl(PolicyContext(latency=None)), DraftVerify(PolicyContext(latency=None), threshold=0.7, max_draft=40)
    for outcome in (Outcome(False, 3, (), 1, 2), Outcome(False, 5, (), 5, 6), Outcome(False, 2, (), 0, 1)):
        ada.observe(outcome)
        dv.observe(outcome)
    assert ada.level == pytest.approx(dv.level) and ada.level != 0.7


# -- predicted acceptance: SpecDec++, the h-rule, Pacer --------------------------------------------

def test_specdecpp_scores_a_token_one_step_late():
    # conf 0.95, 0.95, 0.5, ...: after token 3, A = 0.95² (token 3 not yet scored): 1 - A < 0.3;
    # after token 4, A = 0.95²·0.5: 1 - A = 0.55 > 0.3 -> stop with 4 drafts. Then all 0.95:
    # stop at k with 1 - 0.95^(k-1) > 0.3, i.e. k = 8; the prompt's end cuts the third round.
    conf = [0.9, 0.95, 0.95, 0.5] + [0.95] * 16
    assert rounds(simulate(conf_trace(conf), "specdecpp")) == [(1, 5, 4), (6, 9, 8), (15, 5, 4)]
    # min_draft: never stop before it
    assert rounds(simulate(conf_trace([0.9, 0.1, 0.1, 0.1, 0.9]), "specdecpp", min_draft=3))[0] == (1, 4, 3)


def test_ags_threshold_comes_from_the_latency_model():
    # draft 0.2 s, verify 1 s: h(k) = (T_v - T_d(k)) / T_r = 1 - 0.2k. All confidences 0.9:
    # P_rej(k) = 1 - 0.9^k >= 1 - 0.2k first at k = 4 (0.656 <= 0.8).
    trace = conf_trace([0.9] * 12, latency=latency_table(draft=0.2))
    res = simulate(trace, "ags")
    assert rounds(res) == [(1, 5, 4), (6, 5, 4), (11, 1, 0)]
    ctx = Simulator(trace).context()
    policy = REGISTRY["ags"](ctx)
    assert [policy.threshold(k, 20) for k in (1, 2, 4)] == pytest.approx([0.8, 0.6, 0.2])
    # a fixed h: stop when 1 - 0.9^k >= 0.5, i.e. k = 7, capped by K_max = 6
    assert rounds(simulate(trace, "ags", rejection_threshold=0.5)) == [(1, 7, 6), (8, 4, 3)]


def test_pacer_stops_after_a_block_whose_mean_is_at_most_the_grown_threshold():
    # round 1: block means 0.8 > 0.7 (t -> 0.735), 0.74 > 0.735 (t -> 0.77175), 0.76 <= 0.77175:
    # stop after 12 drafts (without the growth 0.76 would pass). Round 2 from 14: t restarts at
    # 0.7: 0.75 passes, 0.5 stops: 8 drafts.
    conf = [0.9] + [0.8] * 4 + [0.74] * 4 + [0.76] * 4 + [0.9] + [0.75] * 4 + [0.5] * 4 + [0.9, 0.9]
    assert rounds(simulate(conf_trace(conf), "pacer")) == [(1, 13, 12), (14, 9, 8), (23, 1, 0)]


# -- PEARL ---------------------------------------------------------------------------------------------

class EntropyPredictor:
    """A predictor that names no signal field it reads (as a trained one): it must be asked."""

    name = "entropy"

    def predict_accept(self, signal, recent_acceptance):
        return 1 - signal.entropy


@pytest.mark.parametrize("name", ["specdecpp", "ags", "pacer"])
def test_predicted_stops_read_the_predictors_answer(name):
    # the untrained predictor names the field of the signal it answers with, which the policy
    # then reads directly, taking no outcomes (it tracks the recent acceptance for predictors
    # only); a predictor that names none is asked, and told the outcomes
    context = Simulator(conf_trace([0.9] * 12)).context()
    untrained = REGISTRY[name](context)
    trained = REGISTRY[name](dataclasses.replace(context, predictor=EntropyPredictor()))
    assert not untrained.observes() and trained.observes()
    rng = random.Random(3)
    for i in range(1, 30):
        signal = TokenSignal(i, rng.random(), rng.random(), rng.random())
        assert untrained.p_accept(signal) == ConfidencePredictor().predict_accept(signal, 0.5)
        assert trained.p_accept(signal) == 1 - signal.entropy


class RecentPredictor:
    """A predictor that answers the recent acceptance it is told."""

    name = "recent"

    def predict_accept(self, signal, recent_acceptance):
        return recent_acceptance


def test_the_recent_acceptance_is_of_the_last_recent_window_checked_tokens():
    # RECENT_WINDOW = 16. Eight rounds that accept 1 of 2 checked drafts: 16 checks, 8 accepted,
    # 0.5; then four rounds that accept 4 of 4: the last 16 checks are all accepted, 1.0 (all
    # 32 would read 24/32 = 0.75)
    policy = REGISTRY["specdecpp"](PolicyContext(latency=None, predictor=RecentPredictor()))
    signal = TokenSignal(1, 0.5, 0.5, 0.5)
    for _ in range(8):
        policy.observe(Outcome(False, 2, [signal] * 2, 1, 2))
    assert policy.p_accept(signal) == 0.5
    for _ in range(4):
        policy.observe(Outcome(False, 4, [signal] * 4, 4, 5))
    assert policy.p_accept(signal) == 1.0


class StopsOrDrops(StopRule):
    """A stop rule whose on_draft also drops a token below 0.5 confidence, unverified."""

    name = "stops-or-drops"
    params = (Param("max_draft", 3, "most drafts per round", COUNT),)

    def stops(self, signal):
        return signal.confidence < 0.7

    def on_draft(self, signal):
        return Decision.DROP if signal.confidence < 0.5 else super().on_draft(signal)


def test_a_stop_rule_that_decides_in_on_draft_is_asked_through_it():
    # at 1: 1 (0.9) drafted, 2 (0.3 < 0.5) dropped unverified: the target checks 1 and adds
    # its own token, (1, 2, 1). Asked through stops() alone, 2 (0.3 < 0.7) would end the round
    # kept and be verified: (1, 3, 2).
    trace = conf_trace([0.9, 0.9, 0.3, 0.6, 0.9, 0.9, 0.9, 0.9])
    sim = Simulator(trace)
    run = SimExecutor(sim.latency, "two-devices", timeline_prompt=0).run(sim.replay, StopsOrDrops(sim.context()))
    target = [(s.args["position"], s.args["tokens"], s.args["accepted"]) for s in run.prompts[0].slices
              if s.device == "target"]
    assert target[0] == (1, 2, 1)
    assert StopsOrDrops(PolicyContext(latency=None)).stop_rule() is None


def test_outcomes_go_to_the_policies_that_use_them():
    context = Simulator(conf_trace([0.9] * 12)).context()
    assert REGISTRY["dv"](context).observes() and REGISTRY["spide"](context).observes()
    assert not REGISTRY["pearl"](context).observes() and not REGISTRY["sd"](context).observes()


def test_pearl_pre_verify_and_post_verify_rounds_by_hand():
    """Window 4 (draft 0.25 s, verify 1 s). Pre-verify at 1: rejected (emit the correction);
    pre-verify at 2: accepted, 3..5 pending; post-verify 3..6 all accepted, 7..9 pending;
    post-verify 7..10: 9 rejected; pre-verify at 10 accepted; post-verify 11..14 (window cut to
    1 by the prompt's end, so no draft is left pending on the last position); pre-verify at 15."""
    pattern = "1" + "0" + "1" + "111111" + "0" + "111111"
    trace = hand_trace([pattern], latency=latency_table(draft=0.25))
    res = simulate(trace, "pearl")
    assert res.params["window"] == 4
    # (the last position is the end of the text: always the target's token, see rounds.py)
    assert rounds(res) == [(1, 1, 0), (2, 1, 1), (3, 4, 4), (7, 4, 2), (10, 1, 1), (11, 4, 4), (15, 1, 0)]
    drafts = [(s.args["position"], s.args["tokens"]) for s in res.timeline if s.device == "draft"]
    assert drafts == [(1, 4), (2, 4), (6, 4), (10, 4), (10, 4), (14, 1), (15, 1)]
    assert res.summary.wall_time_s == pytest.approx(7.0) and res.summary.parallel_rounds == 7


# -- self-speculative: LayerSkip, DEL ------------------------------------------------------------------

DEL_LAYERS = {
    5: "1" + "111" + "0" + "1111",  # layer 5: pos 4 has confidence 0.3 (dropped in round 1)
    2: "0" + "111111" + "0" + "1",  # layer 2: pos 0 mismatches, pos 7 has confidence 0.5
}
DEL_CONF = {5: [[0.9, 0.9, 0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.9]], 2: [[0.4, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.5, 0.9]]}
DEL_LATENCY = latency_table(layers={2: 0.02, 5: 0.05})


def del_trace():
    return hand_trace(["1" * 9], layers={k: [v] for k, v in DEL_LAYERS.items()}, layer_conf=DEL_CONF,
                      latency=DEL_LATENCY, n_layers=8)


def test_layerskip_drafts_gamma_tokens_with_the_exit_layer():
    res = simulate(del_trace(), "layerskip", gamma=3)  # default exit layer: the deepest, 5
    assert rounds(res) == [(1, 4, 3), (5, 4, 3)]
    assert res.summary.wall_time_s == pytest.approx(2 * (3 * 0.05 + 1.0))
    res2 = simulate(del_trace(), "layerskip", gamma=3, exit_layer=2)
    assert rounds(res2) == [(1, 4, 3), (5, 4, 2), (8, 1, 0)]  # layer 2 mismatches at 7
    assert res2.summary.wall_time_s == pytest.approx(2 * (3 * 0.02 + 1.0) + 1.0)
    with pytest.raises(SimlabError, match="not recorded"):
        simulate(del_trace(), "layerskip", exit_layer=3)


def test_del_pays_an_exit_head_per_exit_layer_for_each_shadow_read():
    # a trace whose probe timed exit heads, 1 ms a row: each shadow read (after the prefill, 1
    # row; after each verification, the positions it settled) runs one head per recorded exit
    # layer (2 and 5) on the target: 2 x 1 ms x rows
    trace = hand_trace(["1" * 9], layers={k: [v] for k, v in DEL_LAYERS.items()}, layer_conf=DEL_CONF,
                       latency=latency_table(layers={2: 0.02, 5: 0.05}, heads={n: 0.001 * n for n in range(1, 12)}),
                       n_layers=8)
    res = simulate(trace, "del")
    shadows = [(s.args["tokens"], s.end - s.start) for s in res.timeline if s.name.startswith("shadow")]
    assert shadows[0] == (1, pytest.approx(0.002))
    assert len(shadows) == 1 + sum(s.name.startswith("verify") for s in res.timeline)
    assert all(seconds == pytest.approx(2 * 0.001 * rows) for rows, seconds in shadows)


def test_token_per_layer_eq_1():
    assert tpl_row(1.0, 5, 18, 8)[18] == pytest.approx(19 / 98)
    assert tpl_row(0.0, 2, 0, 8).tolist() == [pytest.approx(1 / 8)]
    assert tpl_row(0.5, 1, 1, 2).tolist() == [pytest.approx(1 / 2), pytest.approx(1.5 / 3)]  # (1 - 0.25) / 0.5 tokens over 1 + 2 layers


def test_del_update_by_hand():
    """Prefill: layer 5 matches at position 0 (conf 0.9), layer 2 does not (0.4). Round 1
    settles positions 1..4: layer 5 matches at 1..3 (0.9) and not at 4 (0.3); layer 2 at all
    four (0.9). With ω = 0.95: S(n) = 0.95·1 + 4, S(c⁵) = 0.95 + 3, S(c²) = 4."""
    policy = Del(PolicyContext(latency=None, exit_layers=[2, 5], n_layers=8))
    policy.observe_shadows(ShadowTokens.read(0, {2: [False], 5: [True]}, {2: [0.4], 5: [0.9]}))
    assert (policy.alpha, policy.exit_layer, policy.gamma) == ({2: 0.0, 5: 1.0}, 5, 18)  # TPL grows with d at α=1
    assert policy.tau == pytest.approx({2: (1.0 + 0.4) / 2, 5: (0.9 + 0.0) / 2})  # empty sides read 1 and 0
    policy.observe_shadows(ShadowTokens.read(1, {2: [True] * 4, 5: [True, True, True, False]},
                                             {2: [0.9] * 4, 5: [0.9, 0.9, 0.9, 0.3]}))
    assert policy.alpha == pytest.approx({2: 4 / 4.95, 5: 3.95 / 4.95})
    # τ² = ½(3.6/4 + 0.95·0.4/0.95), τ⁵ = ½((0.95·0.9 + 2.7)/3.95 + 0.3/1)
    assert policy.tau == pytest.approx({2: 0.65, 5: 0.6})
    assert policy.exit_layer == 2  # higher α and fewer layers: TPL(2, d) > TPL(5, d) for every d >= 1
    assert policy.on_draft(TokenSignal(1, 0.64, 0.36)) is Decision.DROP
    assert policy.on_draft(TokenSignal(1, 0.66, 0.34)) is Decision.DRAFT


def argmax_moves(layer, d_max, n_layers):
    """The α (< 1) on both sides of each place where the argmax of a TPL row moves on, to the last
    bit: there the row's two best entries are too close to call."""
    out = []
    for d in range(d_max):
        lo, hi = 0.0, math.nextafter(1.0, 0.0)
        if row_max(tpl_row(hi, layer, d_max, n_layers))[1] <= d:
            continue
        while True:
            mid = (lo + hi) / 2
            if mid in (lo, hi):
                break
            if row_max(tpl_row(mid, layer, d_max, n_layers))[1] > d:
                hi = mid
            else:
                lo = mid
        out += [lo, hi]
    return out


@pytest.mark.parametrize("layer, d_max", [(1, 18), (2, 18), (7, 18), (15, 5), (29, 18), (3, 0), (4, 1)])
def test_tpl_argmax_is_the_first_maximum_of_the_whole_row(layer, d_max):
    # DEL's update searches each row from a guess instead of computing it whole: the same maximum
    # and index, bit for bit, from every guess, on random α, α near 0 and 1, and α where the
    # argmax moves (where the search gives up and computes the row)
    rng = random.Random(layer)
    alphas = [rng.random() for _ in range(200)] + [1 - 10.0 ** -k for k in range(1, 17)] + [0.0, 1.0, 5e-324]
    alphas += argmax_moves(layer, d_max, 30)
    for alpha in alphas:
        expected = row_max(tpl_row(alpha, layer, d_max, 30))
        for guess in range(-1, d_max + 2):
            assert tpl_argmax(alpha, layer, d_max, 30, guess) == expected, (alpha, guess)


class PlainDel:
    """DEL_UPDATE written as plainly as the paper states it (every layer's whole TPL row, every
    layer's τ): the reference for Del's faster update."""

    def __init__(self, layers, n_layers, omega=0.95, d_max=18):
        self.layers, self.n_layers, self.omega, self.d_max = layers, n_layers, omega, d_max
        self.n, self.c, self.tcs, self.fcs = 0.0, dict.fromkeys(layers, 0.0), dict.fromkeys(layers, 0.0), dict.fromkeys(layers, 0.0)
        self.alpha, self.tau = {}, {}

    def update(self, matches, confidence):
        w = self.omega
        self.n = w * self.n + len(matches[self.layers[0]])
        for layer in self.layers:
            match, conf = matches[layer], confidence[layer]
            self.c[layer] = w * self.c[layer] + sum(match)
            self.tcs[layer] = w * self.tcs[layer] + sum(c for c, m in zip(conf, match) if m)
            self.fcs[layer] = w * self.fcs[layer] + sum(c for c, m in zip(conf, match) if not m)
            c, mismatched = self.c[layer], self.n - self.c[layer]
            self.alpha[layer] = c / self.n
            matched_conf = self.tcs[layer] / c if c > 0 else 1.0
            mismatched_conf = self.fcs[layer] / mismatched if mismatched > 1e-12 else 0.0
            self.tau[layer] = (matched_conf + mismatched_conf) / 2
        best = -1.0
        for layer in self.layers:
            row = tpl_row(self.alpha[layer], layer, self.d_max, self.n_layers).tolist()
            if max(row) > best:
                best, self.exit_layer, self.gamma = max(row), layer, row.index(max(row))


def test_del_update_is_the_papers_update_bit_for_bit():
    # Del keeps its sums in numpy arrays over the layers, reads a slice of a prompt's shadow table
    # per round (as the replay does), computes only τ_E, skips rows that cannot win and searches
    # the others (tpl_argmax): the same α, τ, exit layer and γ as the plain update, to the last
    # bit, over prompts of random shadow tokens from layers that always, never or sometimes match
    layers, rng = list(range(1, 30)), random.Random(5)
    policy = Del(PolicyContext(latency=None, exit_layers=layers, n_layers=30))
    for prompt in range(6):
        plain = PlainDel(layers, 30)
        policy.reset(None)
        p_match = {layer: rng.choice([0.0, 1.0, rng.random(), 0.5 + layer / 60]) for layer in layers}
        if prompt >= 4:  # no layer ever matches, or each near or below its break-even α = ℓ/L: TPL ties at 1/L
            p_match = {layer: (prompt - 4) * layer / 30 * rng.uniform(0.6, 1.0) for layer in layers}
        matches, confidence, rounds = {layer: [] for layer in layers}, {layer: [] for layer in layers}, []
        for _ in range(60):
            count = rng.choice([1, 1, 1, 2, 3, 7, 12])
            rounds.append((len(matches[layers[0]]), count))
            for layer in layers:
                matches[layer] += [rng.random() < p_match[layer] for _ in range(count)]
                confidence[layer] += [rng.random() for _ in range(count)]
        whole = ShadowTokens.read(0, matches, confidence)
        for start, count in rounds:
            end = start + count
            plain.update({layer: m[start:end] for layer, m in matches.items()},
                         {layer: c[start:end] for layer, c in confidence.items()})
            policy.observe_shadows(ShadowTokens(start, whole.layers, whole.table[start:end]))
            assert (policy.exit_layer, policy.gamma) == (plain.exit_layer, plain.gamma)
            assert policy.alpha == plain.alpha and policy.tau == plain.tau
            threshold = plain.tau[plain.exit_layer]
            assert policy.on_draft(TokenSignal(1, threshold, 0.0)) is Decision.DRAFT
            assert policy.on_draft(TokenSignal(1, math.nextafter(threshold, 0.0), 0.0)) is Decision.DROP


def test_del_rounds_on_a_trace_with_early_exit_signals():
    """Round 1 with layer 5 (τ⁵ = 0.45): 1..3, then 4 at 0.3 is drafted and dropped; 1..3
    accepted + bonus. The update picks layer 2 (τ² = 0.65): 5, 6, then 7 at 0.5 is dropped;
    then the last position is a plain target step."""
    res = simulate(del_trace(), "del")
    assert rounds(res) == [(1, 4, 3), (5, 3, 2), (8, 1, 0)]
    drafts = [(s.args["position"], s.args["tokens"], round(s.end - s.start, 9)) for s in res.timeline
              if s.device == "draft"]
    assert drafts == [(1, 4, 0.2), (5, 3, 0.06)]  # dropped tokens are drafted, hence paid for
    assert (res.summary.drafted, res.summary.accepted) == (7, 5)


def test_del_needs_early_exit_signals():
    with pytest.raises(SimlabError, match="early-exit signals"):
        simulate(hand_trace(["1" * 5]), "del")


def test_latency_driven_policies_work_on_any_latency_model():
    """Live decoding builds policies with a plain latency table (no simulator grid): the h-rule
    and the parallel windows must price drafts through the LatencyModel protocol alike."""
    from simlab.latency.model import TableLatency

    samples = latency_table(draft=0.2, verify={1: 1.0, 4: 1.6, 8: 2.0, 40: 2.0})
    table = PolicyContext(latency=TableLatency.from_samples(samples), context_len=20)
    grid = Simulator(conf_trace([0.9] * 12, latency=samples)).context()
    for name in ("pearl", "spide"):
        assert REGISTRY[name](table).window == REGISTRY[name](grid).window == 10  # 10 x 0.2 s <= 2 s, flat from k=8
    assert REGISTRY["ags"](table).threshold(3, 20) == pytest.approx(REGISTRY["ags"](grid).threshold(3, 20))
    for name in ("pearl", "spide", "ags"):
        with pytest.raises(SimlabError, match="needs a latency model"):
            REGISTRY[name](PolicyContext(latency=None))


# -- llama.cpp (common/speculative.cpp, examples/speculative-simple) -----------------------------

def test_llama_cpp_drafts_draft_max_capped_by_the_budget():
    # 10 positions, all matching: rounds of 3 drafts + the target's token: 1..4, 5..8, then 9 alone
    # (one token left: the cap remaining - 1 leaves no draft).
    assert rounds(simulate(conf_trace([0.9] * 10), "llama-cpp")) == [(1, 4, 3), (5, 4, 3), (9, 1, 0)]


def test_llama_cpp_drops_the_token_below_p_min_unverified():
    trace = conf_trace([0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.9, 0.9])
    # 1 (0.9) kept, 2 (0.3 < 0.5) dropped: verify [1] -> 1, 2 committed; 3..5 drafted, 3 accepted
    # + bonus at 6; 7 alone (one token left).
    assert rounds(simulate(trace, "llama-cpp", p_min=0.5)) == [(1, 2, 1), (3, 4, 3), (7, 1, 0)]
    # below p_min at the first token: nothing verified, a plain target step
    assert rounds(simulate(conf_trace([0.9, 0.2, 0.9, 0.9]), "llama-cpp", p_min=0.5))[0] == (1, 1, 0)


def test_llama_cpp_n_predict_follows_speculative_simple_to_its_own_end():
    # speculative-simple with -n 6 and --draft-max 3 (position 0 is the prompt's last token, so
    # n_predict_so_far = committed - 1): cap min(3, 6-0-1) = 3 -> 4 tokens; cap 6-4-1 = 1 ->
    # 2 tokens (6 so far); cap -1, clamped to 0, which draft() reads as no limit: 3 drafts -> 10
    # tokens > 6, the loop ends.
    result = simulate(conf_trace([0.9] * 20), "llama-cpp", n_predict=6)
    assert rounds(result) == [(1, 4, 3), (5, 2, 1), (7, 4, 3)]
    assert result.summary.tokens == 10
    # -n 8: the budget cap never binds (8-0-1, then 8-4-1 = 3); the third round is uncapped
    assert rounds(simulate(conf_trace([0.9] * 20), "llama-cpp", n_predict=8)) == [(1, 4, 3), (5, 4, 3), (9, 4, 3)]


def test_llama_cpp_n_predict_needs_a_trace_long_enough_for_its_last_round():
    with pytest.raises(SimlabError, match="at least 23 positions"):
        simulate(conf_trace([0.9] * 20), "llama-cpp", n_predict=18)


def drafting(result):
    """(position, tokens) of each draft run the simulator paid for."""
    return [(s.args["position"], s.args["tokens"]) for s in result.timeline if s.device == "draft"]


def test_llama_cpp_discards_a_draft_shorter_than_draft_min_after_paying_for_it():
    # speculative.cpp draft(): `if (dp.result->size() < (size_t) params.n_min) dp.result->clear();`
    # after drafting stopped, whatever stopped it. Positions 1..7, all the target's; p_min 0.5,
    # draft_max 3, draft_min 2:
    # - at 1: 1 (0.9) kept, 2 (0.3) dropped -> 1 kept < 2, discarded: 2 draft steps, target alone (1, 1, 0);
    # - at 2: 2 (0.3) dropped -> 0 kept, discarded: 1 draft step, (2, 1, 0);
    # - at 3: cap min(3, 8-3-1) = 3: 3..5 kept (3 >= 2), verified, all accepted + bonus 6: (3, 4, 3);
    # - at 7: cap 8-7-1 = 0, a plain target step (7, 1, 0).
    trace = conf_trace([0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.9, 0.9])
    result = simulate(trace, "llama-cpp", p_min=0.5, draft_min=2)
    assert rounds(result) == [(1, 1, 0), (2, 1, 0), (3, 4, 3), (7, 1, 0)]
    assert drafting(result) == [(1, 2), (2, 1), (3, 3)]
    s = result.summary  # 6 draft steps paid, one verified draft (n_drafted, in test_llama_cpp_engine: 3)
    assert (s.drafted, s.num_drafts, s.accepted, s.target_calls) == (6, 1, 3, 4)
    # draft_min 1 discards only the empty draft, which verifies nothing anyway: p_min's rounds
    assert rounds(simulate(trace, "llama-cpp", p_min=0.5, draft_min=1)) == [(1, 2, 1), (3, 4, 3), (7, 1, 0)]


def test_llama_cpp_discards_a_draft_the_budget_cap_keeps_under_draft_min():
    # p_min 0 (fixed drafts, no stop): 7 positions, at 5 the cap is 7-5-1 = 1 < draft_min 2, so the
    # one drafted token is paid for and discarded, then 6 is a plain step. Without draft_min: (5, 2, 1).
    result = simulate(conf_trace([0.9] * 7), "llama-cpp", draft_min=2)
    assert rounds(result) == [(1, 4, 3), (5, 1, 0), (6, 1, 0)]
    assert drafting(result) == [(1, 3), (5, 1)]
    # speculative-simple with -n 6: caps 3, then 6-5 = 1 (drafted, discarded: 5 generated so
    # far), then 0 = no limit: 3 drafts; 9 tokens > 6 ends the loop.
    result = simulate(conf_trace([0.9] * 20), "llama-cpp", n_predict=6, draft_min=2)
    assert rounds(result) == [(1, 4, 3), (5, 1, 0), (6, 4, 3)]
    assert result.summary.tokens == 9


def test_llama_cpp_plans_are_fixed_exactly_when_p_min_is_off_capped_or_not():
    # p_min 0 never drops a token (no confidence is below 0): every plan, the n_predict caps
    # included, is fixed (the executor need not ask on_draft). -n 6, draft_max 3: the cap is
    # n_predict - committed, 6-4 = 2 at committed 4, 6-5 = 1 at 5; at 6 it is 0, no limit: 3.
    policy = LlamaCpp(PolicyContext(latency=None), n_predict=6)
    plans = [policy.plan(RoundState(committed=c, remaining=20, pending=0, context_len=10 + c)) for c in (4, 5, 6)]
    assert plans == [Serial(2, fixed=True), Serial(1, fixed=True), Serial(3, fixed=True)]
    # p_min 0.5 may stop a draft: no plan is fixed
    policy = LlamaCpp(PolicyContext(latency=None), n_predict=6, p_min=0.5)
    plans = [policy.plan(RoundState(committed=c, remaining=20, pending=0, context_len=10 + c)) for c in (4, 5, 6)]
    assert plans == [Serial(2), Serial(1), Serial(3)]


def test_a_choice_parameter_takes_a_string_on_the_command_line():
    # hf-confidence's schedule is choice(*SCHEDULES): its flag parses a string, one of those listed
    kind = choice("constant", "heuristic")
    assert (kind.type, kind.range) == (str, "constant | heuristic")
    assert flag_type("schedule", declared()["schedule"]) is str


def test_early_exit_policies_without_exit_layers_are_refused_by_name():
    for name in ("layerskip", "del"):
        with pytest.raises(SimlabError, match=f"^{name} needs a trace with early-exit signals"):
            REGISTRY[name](PolicyContext(latency=None))

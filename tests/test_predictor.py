"""Acceptance predictors: features as a decoder sees them, better than chance where acceptance
depends on confidence, recalibration of a miscalibrated draft, JSON that loads without sklearn."""

import subprocess
import sys

import numpy as np
import pytest

from simlab.common.signals import TokenSignal
from simlab.policies.base import Outcome
from simlab.predictor.features import FEATURES, RecentAcceptance, examples, feature_vector
from simlab.predictor.model import load_predictor, save_predictor
from simlab.predictor.train import reliability, split_prompts, train
from simlab.sim.run import Simulator
from simlab.trace.synth import SynthSpec, synth_trace
from tests.helpers import hand_trace


@pytest.fixture(scope="module")
def iid_trace():
    return synth_trace(SynthSpec(alpha=0.75, prompts=12, tokens=400, seed=3), command="test")


@pytest.fixture(scope="module")
def overconfident_trace(tmp_path_factory):
    """SPIDE's observation: confidence overstates acceptance. Every bin accepts far less often
    than its confidence says."""
    table = tmp_path_factory.mktemp("map") / "overconfident.csv"
    table.write_text("conf_low,conf_high,count,accepted\n0.0,0.5,300,15\n0.5,0.8,300,60\n0.8,0.95,300,150\n"
                     "0.95,1.0,300,240\n")
    return synth_trace(SynthSpec(kind="table", table=str(table), prompts=12, tokens=400, seed=4), command="test")


def test_examples_are_the_checked_tokens_with_recent_acceptance_as_it_stood():
    # position 0 is the prefill's token. gamma=2: round 1 drafts positions 1-2 (2 rejected),
    # round 2 drafts 3-4 (both accepted; 5 is the bonus), round 3 drafts 6-7, then one plain step.
    trace = hand_trace(["1101111111"], conf=[[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]])
    ex = examples(trace, gamma=2)
    assert ex["accepted"].tolist() == [True, False, True, True, True, True]
    assert ex["draft_index"].tolist() == [1, 2, 1, 2, 1, 2]
    assert ex["confidence"].tolist() == pytest.approx([0.8, 0.7, 0.6, 0.5, 0.3, 0.2])
    assert ex["recent_acceptance"].tolist() == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.75, 0.75])


def test_recent_acceptance_counts_checked_tokens_and_restarts():
    recent = RecentAcceptance(window=4)
    assert recent.value == 1.0
    sig = TokenSignal(1, 0.5, 1.0)
    recent.observe(Outcome(False, 3, (sig, sig), accepted=1, emitted=2))
    recent.observe(Outcome(False, 3, (sig, sig, sig), accepted=3, emitted=4))
    assert recent.value == pytest.approx(3 / 4)  # window of 4: [F, T, T, T]
    recent.reset()
    assert recent.value == 1.0


def test_features_are_defined_once_in_order():
    v = feature_vector(TokenSignal(3, 0.9, 0.4), 0.75)
    assert len(v) == len(FEATURES)
    assert v == pytest.approx((0.9, np.log(9), 0.4, 3.0, 0.75))


def test_prompts_not_tokens_are_split():
    train_ids, test_ids = split_prompts(range(10), 0.3, seed=1)
    assert len(test_ids) == 3 and not set(train_ids) & set(test_ids)
    assert sorted(train_ids + test_ids) == list(range(10))


@pytest.mark.parametrize("kind", ["logistic", "mlp"])
def test_predictor_beats_chance_where_acceptance_follows_confidence(iid_trace, kind):
    model = train(iid_trace, kind=kind)
    test = model.report["test"]
    assert test["auc"] > 0.7
    assert test["ece"] < 0.05
    assert model.report["test_examples"] > 500


def test_trained_predictor_recalibrates_an_overconfident_draft(overconfident_trace):
    r = train(overconfident_trace).report
    assert r["test_confidence_baseline"]["ece"] > 0.2
    assert r["test"]["ece"] < r["test_confidence_baseline"]["ece"] / 4
    assert r["test"]["brier"] < r["test_confidence_baseline"]["brier"]


def test_reliability_bins_and_ece():
    y = np.array([1, 0, 1, 1])
    p = np.array([0.15, 0.15, 0.95, 0.95])
    ece, table = reliability(y, p)
    assert [b["count"] for b in table] == [2, 2]
    assert ece == pytest.approx(0.5 * abs(0.15 - 0.5) + 0.5 * abs(0.95 - 1.0))


@pytest.mark.parametrize("kind", ["logistic", "mlp"])
def test_json_predictor_matches_itself_per_token_and_in_batch(iid_trace, tmp_path, kind):
    model = train(iid_trace, kind=kind, test_fraction=0.5)
    loaded = load_predictor(save_predictor(model, tmp_path / "p.json"))
    signals = [TokenSignal(i, c, e) for i, c, e in ((1, 0.2, 2.0), (3, 0.9, 0.3), (7, 0.99, 0.05))]
    batch = loaded.predict_proba(np.array([feature_vector(s, 0.6) for s in signals]))
    one_by_one = [loaded.predict_accept(s, 0.6) for s in signals]
    assert one_by_one == pytest.approx(batch.tolist())
    assert one_by_one == pytest.approx([model.predict_accept(s, 0.6) for s in signals])
    assert one_by_one == sorted(one_by_one)  # more confident, more likely accepted


def test_predictor_json_loads_without_scikit_learn(iid_trace, tmp_path):
    path = save_predictor(train(iid_trace), tmp_path / "p.json")
    code = ("import sys; sys.modules['sklearn'] = None\n"
            "from simlab.predictor import load_predictor\nfrom simlab.common.signals import TokenSignal\n"
            f"print(load_predictor({str(path)!r}).predict_accept(TokenSignal(2, 0.8, 0.5), 0.9))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 0.0 < float(out.stdout) < 1.0


def test_simulator_hands_the_predictor_to_policies(iid_trace):
    model = train(iid_trace)
    assert Simulator(iid_trace, predictor=model).context().predictor is model

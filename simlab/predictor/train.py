"""Training acceptance predictors with scikit-learn, and judging them on held-out prompts.

Prompts, not tokens, are split (a seeded shuffle, ``test_fraction`` of them held out), so a
predictor is judged on text it never saw — tokens of one prompt are not independent. The
report gives, on the held-out prompts:

- ``auc``: ROC AUC, how well the score ranks accepted above rejected tokens (0.5 = chance);
- ``brier`` and ``log_loss``;
- ``ece``: expected calibration error over ``CALIBRATION_BINS`` equal-width bins of the
  predicted probability, Σ_b (n_b / n)·|mean prediction_b − acceptance rate_b|, and the
  reliability table itself;

for the trained model and, as the baseline every policy falls back to, the raw draft
confidence (:class:`~simlab.policies.base.ConfidencePredictor`).
"""

from __future__ import annotations

import numpy as np

from simlab.common.errors import SimlabError
from simlab.predictor.features import FEATURES, examples
from simlab.predictor.model import LogisticPredictor, MLPPredictor

KINDS = ("logistic", "mlp")
CALIBRATION_BINS = 10
MLP_HIDDEN = (16,)


def split_prompts(prompt_ids, test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    ids = np.array(sorted(set(int(i) for i in prompt_ids)))
    if not 0 < test_fraction < 1:
        raise SimlabError(f"--test-fraction must be in (0, 1), got {test_fraction}")
    if len(ids) < 2:
        raise SimlabError(f"training a predictor needs at least 2 prompts (one to train, one to test); the trace has {len(ids)}")
    n_test = min(max(1, round(test_fraction * len(ids))), len(ids) - 1)
    perm = np.random.default_rng(seed).permutation(ids)
    return sorted(perm[n_test:].tolist()), sorted(perm[:n_test].tolist())


def reliability(y: np.ndarray, p: np.ndarray, bins: int = CALIBRATION_BINS) -> tuple[float, list[dict]]:
    """ECE and the reliability table (non-empty bins only)."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        sel = which == b
        if not sel.any():
            continue
        mean_p, rate = float(p[sel].mean()), float(y[sel].mean())
        ece += sel.mean() * abs(mean_p - rate)
        rows.append({"low": float(edges[b]), "high": float(edges[b + 1]), "count": int(sel.sum()),
                     "mean_predicted": mean_p, "accepted_rate": rate})
    return float(ece), rows


def scores(y: np.ndarray, p: np.ndarray) -> dict:
    from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

    ece, table = reliability(y, p)
    auc = float(roc_auc_score(y, p)) if 0 < y.sum() < len(y) else float("nan")
    return {"auc": auc, "brier": float(brier_score_loss(y, p)), "log_loss": float(log_loss(y, np.clip(p, 1e-6, 1 - 1e-6), labels=[0, 1])),
            "ece": ece, "reliability": table}


def fit(X: np.ndarray, y: np.ndarray, kind: str, name: str, seed: int = 0) -> LogisticPredictor | MLPPredictor:
    """Standardise, then fit a logistic regression or a small MLP; return the JSON-able model."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    if kind not in KINDS:
        raise SimlabError(f"unknown predictor kind {kind!r}; choose one of {', '.join(KINDS)}")
    if len(np.unique(y)) < 2:
        raise SimlabError("the training prompts have only accepted or only rejected tokens; nothing to learn")
    scaler = StandardScaler().fit(X)
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)  # a constant feature: leave it unscaled
    Z = (X - scaler.mean_) / scale
    if kind == "logistic":
        clf = LogisticRegression(max_iter=1000).fit(Z, y)
        return LogisticPredictor(name, scaler.mean_, scale, clf.coef_[0], float(clf.intercept_[0]))
    clf = MLPClassifier(hidden_layer_sizes=MLP_HIDDEN, activation="tanh", alpha=1e-3, max_iter=500,
                        random_state=seed).fit(Z, y)
    return MLPPredictor(name, scaler.mean_, scale, clf.coefs_, clf.intercepts_, "tanh")


def train(trace, kind: str = "logistic", gamma: int = 8, test_fraction: float = 0.3, seed: int = 0):
    """Train on one split of the trace's prompts, score on the other; the report rides along
    in the returned model (``model.report``)."""
    data = examples(trace, gamma=gamma, seed=seed)
    train_ids, test_ids = split_prompts(trace.prompts["prompt_id"], test_fraction, seed)
    tr, te = data[data["prompt_id"].isin(train_ids)], data[data["prompt_id"].isin(test_ids)]
    if te.empty:
        raise SimlabError("the held-out prompts produced no checked draft tokens")
    X_tr, y_tr = tr[list(FEATURES)].to_numpy(float), tr["accepted"].to_numpy(int)
    X_te, y_te = te[list(FEATURES)].to_numpy(float), te["accepted"].to_numpy(int)
    name = f"{kind} on {trace.path.name if trace.path else 'trace'}"
    model = fit(X_tr, y_tr, kind, name, seed)
    model.report = {
        "trace": str(trace.path) if trace.path else "",
        "trace_kind": trace.manifest.kind,
        "replay": f"vanilla SD, gamma={gamma}, seed={seed}",
        "train_prompts": train_ids,
        "test_prompts": test_ids,
        "train_examples": len(tr),
        "test_examples": len(te),
        "test_accept_rate": float(y_te.mean()),
        "test": scores(y_te, model.predict_proba(X_te)),
        "test_confidence_baseline": scores(y_te, te["confidence"].to_numpy(float)),
    }
    return model


"""Trained acceptance predictors as plain coefficients: JSON in, ``predict_accept`` out.

A file written by ``simlab calibrate predictor`` holds the feature names, the standardisation
(mean, scale) and either a logistic regression (one weight per feature) or a small MLP (weight
matrices, biases, hidden activation). Loading needs only numpy, so ``simlab simulate
--predictor`` and live decoding run without scikit-learn, and the JSON can be read by eye.
Both classes implement :class:`~simlab.policies.base.AcceptancePredictor`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from simlab.common.errors import SimlabError
from simlab.common.jsonfile import read_versioned, write_json
from simlab.common.signals import TokenSignal
from simlab.predictor.features import FEATURES, feature_vector

PREDICTOR_FORMAT = "simlab-predictor"
PREDICTOR_VERSION = 1
ACTIVATIONS = {"tanh": np.tanh, "relu": lambda z: np.maximum(z, 0.0), "logistic": lambda z: 1.0 / (1.0 + np.exp(-z))}


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class _Standardised:
    """Shared by both kinds: the features, their standardisation, the JSON header."""

    kind = ""

    def __init__(self, name: str, mean, scale, report: dict | None = None):
        self.name = name
        self.mean = np.asarray(mean, dtype=float)
        self.scale = np.asarray(scale, dtype=float)
        if self.mean.shape != (len(FEATURES),) or self.scale.shape != (len(FEATURES),) or (self.scale <= 0).any():
            raise SimlabError(f"predictor {name!r}: mean and scale need {len(FEATURES)} entries, scales > 0")
        self.report = report or {}

    def predict_accept(self, signal: TokenSignal, recent_acceptance: float) -> float:
        return float(self.predict_proba(np.asarray([feature_vector(signal, recent_acceptance)]))[0])

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """P(accept) for rows of features (columns in :data:`FEATURES` order)."""
        return self._proba((np.asarray(X, dtype=float) - self.mean) / self.scale)

    def header(self) -> dict:
        return {"format": PREDICTOR_FORMAT, "version": PREDICTOR_VERSION, "kind": self.kind, "name": self.name,
                "features": list(FEATURES), "mean": self.mean.tolist(), "scale": self.scale.tolist()}


class LogisticPredictor(_Standardised):
    """P(accept) = σ(b + Σ w_i · (f_i − mean_i) / scale_i)."""

    kind = "logistic"

    def __init__(self, name: str, mean, scale, coef, intercept: float, report: dict | None = None):
        super().__init__(name, mean, scale, report)
        self.coef = np.asarray(coef, dtype=float)
        self.intercept = float(intercept)
        if self.coef.shape != (len(FEATURES),):
            raise SimlabError(f"predictor {name!r}: need one coefficient per feature ({len(FEATURES)})")
        # Folded into raw-feature weights once: predict_accept runs once per drafted token.
        self._w = (self.coef / self.scale).tolist()
        self._b = self.intercept - float((self.coef * self.mean / self.scale).sum())

    def predict_accept(self, signal: TokenSignal, recent_acceptance: float) -> float:
        z = self._b
        for w, f in zip(self._w, feature_vector(signal, recent_acceptance)):
            z += w * f
        return _sigmoid(z)

    def _proba(self, Z: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(Z @ self.coef + self.intercept)))

    def to_dict(self) -> dict:
        return {**self.header(), "coef": self.coef.tolist(), "intercept": self.intercept, "report": self.report}


class MLPPredictor(_Standardised):
    """A small multi-layer perceptron: hidden layers with ``activation``, a logistic output."""

    kind = "mlp"

    def __init__(self, name: str, mean, scale, weights, biases, activation: str, report: dict | None = None):
        super().__init__(name, mean, scale, report)
        if activation not in ACTIVATIONS:
            raise SimlabError(f"predictor {name!r}: unknown activation {activation!r}")
        self.weights = [np.asarray(w, dtype=float) for w in weights]
        self.biases = [np.asarray(b, dtype=float) for b in biases]
        self.activation = activation
        dims = [len(FEATURES)] + [w.shape[1] for w in self.weights]
        if len(self.weights) != len(self.biases) or dims[-1] != 1 or any(
            w.shape != (dims[i], dims[i + 1]) or b.shape != (dims[i + 1],)
            for i, (w, b) in enumerate(zip(self.weights, self.biases))
        ):
            raise SimlabError(f"predictor {name!r}: MLP weight shapes do not chain from {len(FEATURES)} inputs to 1")

    def _proba(self, Z: np.ndarray) -> np.ndarray:
        act = ACTIVATIONS[self.activation]
        for w, b in zip(self.weights[:-1], self.biases[:-1]):
            Z = act(Z @ w + b)
        return ACTIVATIONS["logistic"](Z @ self.weights[-1] + self.biases[-1])[:, 0]

    def to_dict(self) -> dict:
        return {**self.header(), "activation": self.activation, "weights": [w.tolist() for w in self.weights],
                "biases": [b.tolist() for b in self.biases], "report": self.report}


def save_predictor(model: LogisticPredictor | MLPPredictor, path: str | os.PathLike) -> Path:
    return write_json(model.to_dict(), path)


def load_predictor(path: str | os.PathLike) -> LogisticPredictor | MLPPredictor:
    """Read a predictor JSON file; any problem is a one-line :class:`SimlabError`."""
    p = Path(path)
    d = read_versioned(p, "predictor file", PREDICTOR_FORMAT, PREDICTOR_VERSION)
    if d.get("features") != list(FEATURES):
        raise SimlabError(f"predictor {p} was trained on features {d.get('features')}; this simlab computes {list(FEATURES)}")
    try:
        common = dict(name=str(d.get("name", p.stem)), mean=d["mean"], scale=d["scale"], report=d.get("report"))
        if d.get("kind") == "logistic":
            return LogisticPredictor(coef=d["coef"], intercept=d["intercept"], **common)
        if d.get("kind") == "mlp":
            return MLPPredictor(weights=d["weights"], biases=d["biases"], activation=d["activation"], **common)
    except (KeyError, TypeError, ValueError) as exc:
        raise SimlabError(f"predictor {p} is malformed ({exc!r})") from exc
    raise SimlabError(f"predictor {p} has unknown kind {d.get('kind')!r}; known: logistic, mlp")

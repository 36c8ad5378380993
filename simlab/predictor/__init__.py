"""Acceptance predictors: P(a drafted token is accepted) from what a decoder knows at that moment.

``features`` defines the inputs once (for training and for decoding), ``model`` holds trained
predictors as plain JSON coefficients that load without scikit-learn, and ``train`` fits them
with scikit-learn on one split of a trace's prompts and reports AUC and calibration on another.
"""

from simlab.predictor.features import FEATURES, RecentAcceptance, feature_vector
from simlab.predictor.model import load_predictor, save_predictor

__all__ = ["FEATURES", "RecentAcceptance", "feature_vector", "load_predictor", "save_predictor"]

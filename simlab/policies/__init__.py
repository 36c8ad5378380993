"""Drafting policies: decision logic only, no I/O and no clock.

``REGISTRY`` maps the ``--policy`` name to its class; :func:`make_policy` builds one with
validated parameters.
"""

from __future__ import annotations

from typing import Any

from simlab.common.errors import SimlabError
from simlab.policies.ags import AcceptanceGuided
from simlab.policies.base import (
    Decision,
    Outcome,
    Parallel,
    Policy,
    PolicyContext,
    PromptInfo,
    RoundState,
    Serial,
)
from simlab.policies.dv import DraftVerify
from simlab.policies.early_exit import Del, LayerSkip
from simlab.policies.entropy import AdaEdl, Svip
from simlab.policies.fixed import Autoregressive, VanillaSD
from simlab.policies.hf import HfConfidence, HfHeuristic
from simlab.policies.llama_cpp import LlamaCpp
from simlab.policies.lookup import LookupThenDraft, Ngram, PromptLookup
from simlab.policies.oracle import Oracle
from simlab.policies.pacer import Pacer
from simlab.policies.pearl import Pearl
from simlab.policies.rest import Rest
from simlab.policies.specdecpp import SpecDecPP
from simlab.policies.spide import Spide, SpideNoDynaDraft, SpideNoParaVerify
from simlab.policies.suffix import SuffixDecoding
from simlab.policies.trees import AcceptanceGuidedTree, Eagle2, StaticTree
from simlab.policies.vllm import Vllm

# Order of `simlab policies`: baselines, then the serial adaptive rules, the parallel methods,
# self-speculative drafting, draft trees, drafting by lookup, and the serial-schedule bound.
REGISTRY: dict[str, type[Policy]] = {cls.name: cls for cls in (
    Autoregressive, VanillaSD, HfHeuristic, HfConfidence, Svip, AdaEdl, DraftVerify, SpecDecPP,
    AcceptanceGuided, Pacer, Pearl, Spide, SpideNoDynaDraft, SpideNoParaVerify, LayerSkip, Del, LlamaCpp, Vllm, StaticTree,
    Eagle2, AcceptanceGuidedTree, PromptLookup, Ngram, LookupThenDraft, SuffixDecoding, Rest, Oracle,
)}


def make_policy(name: str, context: PolicyContext, **params: Any) -> Policy:
    """Build policy ``name``; unknown names and parameters are a :class:`SimlabError`."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise SimlabError(f"unknown policy {name!r}; known policies: {', '.join(sorted(REGISTRY))}") from None
    return cls(context, **params)


__all__ = [
    "REGISTRY",
    "make_policy",
    "Policy",
    "PolicyContext",
    "PromptInfo",
    "RoundState",
    "Serial",
    "Parallel",
    "Decision",
    "Outcome",
]

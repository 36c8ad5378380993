"""Synthetic traces: known acceptance processes, for tests, closed-form checks and paper setups.

Every synthetic trace is labelled ``kind = "synthetic"`` in its manifest. Three processes:

- ``iid``: each position is accepted independently with probability α — Leviathan et al.'s
  assumption, under which the closed forms of :mod:`simlab.analytic.closed_form` hold. So that
  confidence-driven policies have an informative signal, each position's confidence is drawn
  from Beta(α·κ, (1-α)·κ) and acceptance is then Bernoulli(confidence): the confidence is
  calibrated and acceptance is still i.i.d. with mean α.
- ``markov``: bursty acceptance. A hidden regime (good/bad) switches with fixed
  probabilities per position; within a regime positions behave as in ``iid`` with that
  regime's α.
- ``table``: a confidence histogram with a per-bin acceptance rate read from a CSV with
  columns ``conf_low, conf_high, count, accepted`` (e.g. the SPIDE Figure 4 snapshot shipped
  in ``calibrate/mapping/``). A position draws its bin in proportion to ``count``, its
  confidence uniformly inside the bin, and acceptance with probability accepted/count.

Entropy is derived from confidence as the entropy of a distribution with top-1 probability
``conf`` and the rest spread evenly over 9 other tokens, so it falls as confidence rises.
Latency: the target's one-token step costs ``target_step`` seconds, a draft step ``c`` times
that, and a k-token verify ``target_step * (1 + verify_slope * (k - 1))``; flat in context.
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simlab.common.errors import SimlabError
from simlab.common.inputs import input_file
from simlab.common.mapping import ONE
from simlab.common.params import check_seed
from simlab.trace.io import Trace, empty_table
from simlab.trace.schema import NO_LAYER, Manifest, Topology

KINDS = ("iid", "markov", "table")
ALTERNATIVES = 9  # tokens sharing the non-top-1 mass when deriving entropy from confidence
VOCAB = 32000


@dataclass(frozen=True)
class SynthSpec:
    kind: str = "iid"
    alpha: float = 0.8
    c: float = 0.1
    prompts: int = 20
    tokens: int = 256
    prompt_len: int = 128
    verify_slope: float = 0.0
    target_step: float = 0.025
    concentration: float = 4.0
    rollout: int = 16
    max_k: int = 64
    seed: int = 0
    # markov
    alpha_bad: float = 0.3
    p_good_to_bad: float = 0.05
    p_bad_to_good: float = 0.2
    # table
    table: str | None = None

    def check(self) -> None:
        check_seed(self.seed)
        if self.kind not in KINDS:
            raise SimlabError(f"unknown synthetic kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        for name in ("alpha", "alpha_bad", "p_good_to_bad", "p_bad_to_good"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise SimlabError(f"--{name.replace('_', '-')} must be in [0, 1], got {v}")
        for name in ("prompts", "tokens", "prompt_len", "max_k"):
            if getattr(self, name) < 1:
                raise SimlabError(f"--{name.replace('_', '-')} must be >= 1")
        if self.rollout < 0:
            raise SimlabError("--rollout must be >= 0")
        if not (self.c > 0 and math.isfinite(self.c)):
            raise SimlabError(f"--c (draft step / target step) must be > 0, got {self.c}")
        if not (self.target_step > 0 and math.isfinite(self.target_step)):
            raise SimlabError("--target-step must be > 0 seconds")
        if self.verify_slope < 0:
            raise SimlabError("--verify-slope must be >= 0")
        if self.concentration <= 0:
            raise SimlabError("--concentration must be > 0")
        if self.kind == "table" and not self.table:
            raise SimlabError("--kind table needs --table CSV (columns conf_low, conf_high, count, accepted)")


def entropy_from_confidence(conf: np.ndarray) -> np.ndarray:
    rest = np.clip(1.0 - conf, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(conf > 0, conf * np.log(conf), 0.0) - np.where(rest > 0, rest * np.log(rest / ALTERNATIVES), 0.0)
    return np.maximum(h, 0.0)


def _beta_conf(rng: np.random.Generator, alpha: np.ndarray | float, kappa: float, size: int) -> np.ndarray:
    """Confidences with mean alpha (degenerate at alpha in {0, 1})."""
    a = np.broadcast_to(np.asarray(alpha, dtype=float), (size,))
    inner = (a > 0) & (a < 1)
    out = a.copy()
    out[inner] = rng.beta(a[inner] * kappa, (1 - a[inner]) * kappa)
    return out


def read_mapping_table(path: str | Path) -> pd.DataFrame:
    p = input_file(path, "mapping table")
    try:
        df = pd.read_csv(p, comment="#")
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise SimlabError(f"mapping table {p} is not a readable CSV ({exc})") from exc
    need = ["conf_low", "conf_high", "count", "accepted"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise SimlabError(f"mapping table {p} lacks columns {missing}")
    df = df[need].astype(float)
    bad = (df["count"] <= 0) | (df["accepted"] < 0) | (df["accepted"] > df["count"]) | (df["conf_low"] < 0) | (
        df["conf_high"] > 1) | (df["conf_high"] < df["conf_low"])
    if df.isna().any().any() or bad.any():
        raise SimlabError(f"mapping table {p}: rows need 0 <= conf_low <= conf_high <= 1 and 0 <= accepted <= count > 0")
    return df


def _confidences(spec: SynthSpec, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidence and acceptance probability per position of one prompt."""
    if spec.kind == "iid":
        conf = _beta_conf(rng, spec.alpha, spec.concentration, n)
        return conf, conf
    if spec.kind == "markov":
        good = np.empty(n, dtype=bool)
        state = True
        u = rng.random(n)
        for t in range(n):
            good[t] = state
            state = (u[t] >= spec.p_good_to_bad) if state else (u[t] < spec.p_bad_to_good)
        alpha = np.where(good, spec.alpha, spec.alpha_bad)
        conf = _beta_conf(rng, alpha, spec.concentration, n)
        return conf, conf
    table = read_mapping_table(spec.table)
    bins = rng.choice(len(table), size=n, p=(table["count"] / table["count"].sum()).to_numpy())
    low, high = table["conf_low"].to_numpy()[bins], table["conf_high"].to_numpy()[bins]
    # A published "[x, 1.0)" row ends where its precision rounds to 1.0 (simlab.common.mapping.ONE).
    high = np.where((high >= 1.0) & (low < 1.0), np.minimum(high, ONE), high)
    conf = low + (high - low) * rng.random(n)
    return conf, (table["accepted"] / table["count"]).to_numpy()[bins]


def synth_trace(spec: SynthSpec, command: str | None = None) -> Trace:
    """Generate a synthetic trace from ``spec`` (deterministic for a given seed)."""
    spec.check()
    rng = np.random.default_rng(spec.seed)
    prompts, positions, rollouts = [], [], []
    for pid in range(spec.prompts):
        n = spec.tokens
        conf, p_accept = _confidences(spec, rng, n)
        accept = rng.random(n) < p_accept
        target = rng.integers(10, VOCAB, size=n)
        draft = np.where(accept, target, (target + rng.integers(1, VOCAB - 1, size=n)) % VOCAB)
        positions.append(pd.DataFrame({
            "prompt_id": pid,
            "pos": np.arange(n),
            "target_token": target,
            "draft_token": draft,
            "draft_conf": conf,
            "draft_entropy": entropy_from_confidence(conf),
            "q_target": np.where(accept, conf, 0.0),
            "p_target": 1.0,
            "p_draft": np.where(accept, 1.0, 0.0),
            "accept_prob": accept.astype(float),
        }))
        diverged = np.flatnonzero(~accept)
        if spec.rollout and len(diverged):
            r_conf, _ = _confidences(spec, rng, len(diverged) * spec.rollout)
            rollouts.append(pd.DataFrame({
                "prompt_id": pid,
                "pos": np.repeat(diverged, spec.rollout),
                "step": np.tile(np.arange(1, spec.rollout + 1), len(diverged)),
                "token": rng.integers(10, VOCAB, size=len(r_conf)),
                "draft_conf": r_conf,
                "draft_entropy": entropy_from_confidence(r_conf),
                "layer": NO_LAYER,
            }))
        prompts.append({"prompt_id": pid, "source": f"synthetic/{spec.kind}/{pid}", "prompt_len": spec.prompt_len,
                        "n_tokens": n, "stop": "length", "prompt_text": ""})
    manifest = Manifest(
        kind="synthetic",
        draft_model=f"synthetic draft (c={spec.c})",
        target_model="synthetic target",
        dataset=f"synthetic:{spec.kind}",
        hardware="synthetic",
        device="none",
        topology=Topology.TWO_DEVICES.value,  # the papers' setup, which synthetic latencies describe
        seed=spec.seed,
        max_new_tokens=spec.tokens,
        rollout_len=spec.rollout,
        command=command if command is not None else " ".join(sys.argv),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        notes="Synthetic trace: acceptance and latencies are generated, not measured.",
        extra={"synth": {k: v for k, v in spec.__dict__.items()}},
    )
    return Trace(
        manifest=manifest,
        prompts=pd.DataFrame(prompts),
        positions=pd.concat(positions, ignore_index=True),
        rollouts=pd.concat(rollouts, ignore_index=True) if rollouts else empty_table("rollouts"),
        latency=synthetic_latency(spec),
    )


def synthetic_latency(spec: SynthSpec) -> pd.DataFrame:
    ctx = [spec.prompt_len, spec.prompt_len + spec.tokens]
    rows = [("draft_step", 1, x, spec.c * spec.target_step) for x in ctx]
    rows += [("target_forward", k, x, spec.target_step * (1 + spec.verify_slope * (k - 1)))
             for k in range(1, spec.max_k + 2) for x in ctx]
    df = pd.DataFrame(rows, columns=["op", "k", "context_len", "seconds"])
    df["layer"] = NO_LAYER
    df["corun"] = False
    df["repeat"] = 0
    df["batch"] = 1
    return df

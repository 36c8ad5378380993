"""A trace as the draft model would live through it, prompt by prompt.

Replay rests on one fact: every generated position is checked by the target at most once
before it is committed (accepted, or replaced by the target's own token). So a replay can fix
one acceptance outcome per position up front, and every policy replayed on the same trace and
seed meets the same outcomes:

- greedy traces (temperature 0): position t is accepted iff the draft's greedy token equals
  the target's token. This is exact, not a model.
- stochastic traces (temperature > 0): the trace records the target's sampled path y. Given
  that the output at t is y, speculative sampling accepted the draft's token with probability
  min(1, q(y)/p(y)) (Leviathan et al. 2023: P(accept, x=y) = min(p(y), q(y)), P(output=y) =
  p(y)). Replay draws that Bernoulli once per position under the seed; averaged over y this is
  sum_x min(p, q), the usual acceptance rate.

What the draft shows while it drafts past a mistake comes from the divergence rollouts: after
the first rejected position d of a run, the i-th further token's confidence is step i of the
rollout recorded at d. When a policy drafts past the end of a recorded rollout (or past
the prompt's end token), the last recorded signal is repeated and the overrun is counted; when no rollout was recorded at d (only
possible on stochastic traces), the true path's signals stand in for it.

Whether a drafted token is an end token (``TokenSignal.end``, which stops the drafting of the
policies that declare ``stops_at_draft_end``) is read from the recorded tokens — the draft's
token on the true path, the rollout's, an exit layer's — against the manifest's
``eos_token_ids`` (draft and target share a vocabulary; ``simlab record`` checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

from simlab.errors import SimlabError
from simlab.signals import ShadowTokens, TokenSignal
from simlab.trace.io import Trace


def runs_of(accept: list[bool]) -> list[int]:
    """run[t] = number of consecutive accepted positions starting at t."""
    run = [0] * (len(accept) + 1)
    for t in range(len(accept) - 1, -1, -1):
        run[t] = run[t + 1] + 1 if accept[t] else 0
    return run[:-1]


@dataclass
class DraftPath:
    """One drafter's view of a prompt: the separate draft model, or one exit layer."""

    accept: list[bool]
    run: list[int]
    confidence: list[float]
    entropy: list[float]
    score: list[float] | None = None
    # divergence position -> (confidences, entropies, end flags) of the draft's own continuation
    rollouts: dict[int, tuple[list[float], list[float], list[bool]]] = field(default_factory=dict)
    end: list[bool] = field(default_factory=list)  # the drafted token at each position is an end token


@dataclass(repr=False)
class PromptReplay:
    """Per-prompt arrays, as Python lists for fast scalar access in the simulator."""

    prompt_id: int
    prompt_len: int
    n_tokens: int  # positions recorded: the prompt ends here (end token or budget)
    budget: int  # the recording's max_new_tokens: what a decoder caps its drafts by
    target_tokens: list[int]
    draft_tokens: list[int]
    draft: DraftPath
    layers: dict[int, DraftPath] = field(default_factory=dict)
    rollout_overruns: int = 0

    def __repr__(self) -> str:
        return f"PromptReplay(prompt_id={self.prompt_id}, prompt_len={self.prompt_len}, n_tokens={self.n_tokens})"

    def path(self, layer: int | None) -> DraftPath:
        if layer is None:
            return self.draft
        try:
            return self.layers[layer]
        except KeyError:
            have = sorted(self.layers) or "none"
            raise SimlabError(f"the trace has no early-exit signals for layer {layer} (layers: {have})") from None

    def signal(self, start: int, i: int, layer: int | None = None) -> TokenSignal:
        """The signal of the i-th (1-based) token of a draft run that starts at position ``start``."""
        path = self.draft if layer is None else self.path(layer)
        t = start + i - 1
        r = path.run[start]
        if i - 1 <= r:  # every earlier token of the run was accepted: the draft is on the true path
            if t >= self.n_tokens:  # past the end token, where nothing was recorded
                self.rollout_overruns += 1
                t = self.n_tokens - 1
            return _signal(path, i, t)
        d = start + r  # first rejected position of this run
        rollout = path.rollouts.get(d)
        if rollout is None:
            return _signal(path, i, min(t, self.n_tokens - 1))
        conf, ent, end = rollout
        j = t - d
        if j > len(conf):
            self.rollout_overruns += 1
            j = len(conf)
        return TokenSignal(i, conf[j - 1], ent[j - 1], math.nan, end[j - 1])

    def shadows(self, start: int, count: int) -> ShadowTokens:
        """Every recorded exit layer's token at positions ``start..start+count-1`` (DEL's shadow
        tokens; layer signals are teacher-forced on the true prefix, as in a verification)."""
        end = start + count
        return ShadowTokens(
            start,
            {layer: p.accept[start:end] for layer, p in self.layers.items()},
            {layer: p.confidence[start:end] for layer, p in self.layers.items()},
        )

    def token_at(self, t: int, accepted: bool, layer: int | None = None) -> int:
        """The token emitted at position t: the draft's if it was accepted, else the target's."""
        if accepted and layer is None:
            return self.draft_tokens[t]
        return self.target_tokens[t]


class SignalRun(NamedTuple):
    """The signals of ``count`` consecutive draft tokens of a run, built only when read.

    A fixed-length policy (vanilla SD) never reads them, and the simulator is fastest when it
    does not build what nobody reads. Indexing and slicing behave like a tuple of
    :class:`TokenSignal` (a tuple subclass keeps construction cheap).
    """

    replay: "PromptReplay"
    start: int
    count: int
    layer: int | None
    first: int = 1

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"SignalRun(prompt={self.replay.prompt_id}, start={self.start}, tokens={self.first}..{self.first + self.count - 1})"

    def __iter__(self):
        return (self[i] for i in range(self.count))

    def __getitem__(self, i):
        if isinstance(i, slice):
            lo, hi, step = i.indices(self.count)
            if step != 1:
                return tuple(self[j] for j in range(lo, hi, step))
            return SignalRun(self.replay, self.start, max(0, hi - lo), self.layer, self.first + lo)
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError(i)
        return self.replay.signal(self.start, self.first + i, self.layer)


def _signal(path: DraftPath, i: int, t: int) -> TokenSignal:
    score = path.score[t] if path.score is not None else math.nan
    return TokenSignal(i, path.confidence[t], path.entropy[t], score, path.end[t])


class TraceReplay:
    """All prompts of a trace, with acceptance outcomes fixed for one seed."""

    def __init__(self, trace: Trace, seed: int = 0):
        self.trace = trace
        self.seed = seed
        self.greedy = trace.manifest.greedy
        pos = trace.positions.sort_values(["prompt_id", "pos"], kind="stable")
        cuts = np.flatnonzero(np.diff(pos["prompt_id"].to_numpy())) + 1

        def split(values: np.ndarray) -> list[list]:
            return [part.tolist() for part in np.split(values, cuts)]

        accept = self._accept(pos, np.random.default_rng(seed))
        eos = np.asarray(trace.manifest.eos_token_ids, dtype=np.int64)
        columns = {
            "accept": split(accept),
            "target": split(pos["target_token"].to_numpy(np.int64)),
            "draft": split(pos["draft_token"].to_numpy(np.int64)),
            "conf": split(pos["draft_conf"].to_numpy(float)),
            "entropy": split(pos["draft_entropy"].to_numpy(float)),
            "end": split(np.isin(pos["draft_token"].to_numpy(np.int64), eos)),
        }
        scores = split(pos["predictor_score"].to_numpy(float)) if "predictor_score" in pos.columns else None
        rollouts = _group_rollouts(trace.rollouts, eos)
        budget = int(trace.manifest.max_new_tokens)
        layers = _group_layers(trace.layers, pos, eos) if trace.layers is not None else {}
        self.prompts: list[PromptReplay] = []
        for i, row in enumerate(trace.prompts.sort_values("prompt_id").itertuples(index=False)):
            pid = int(row.prompt_id)
            draft = DraftPath(
                accept=columns["accept"][i],
                run=runs_of(columns["accept"][i]),
                confidence=columns["conf"][i],
                entropy=columns["entropy"][i],
                score=scores[i] if scores is not None else None,
                rollouts=rollouts.get(pid, {}),
                end=columns["end"][i],
            )
            self.prompts.append(PromptReplay(
                prompt_id=pid,
                prompt_len=int(row.prompt_len),
                n_tokens=int(row.n_tokens),
                budget=max(int(row.n_tokens), budget if row.stop == "eos" else 0),
                target_tokens=columns["target"][i],
                draft_tokens=columns["draft"][i],
                draft=draft,
                layers=layers.get(pid, {}),
            ))

    def _accept(self, pos: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
        if self.greedy:
            return pos["draft_token"].to_numpy() == pos["target_token"].to_numpy()
        q, p = pos["q_target"].to_numpy(float), pos["p_target"].to_numpy(float)
        ratio = np.minimum(1.0, q / np.where(p > 0, p, 1.0))
        return rng.random(len(pos)) < np.where(p > 0, ratio, 0.0)

    @property
    def n_tokens(self) -> int:
        return sum(p.n_tokens for p in self.prompts)

    @property
    def max_context(self) -> int:
        return max((p.prompt_len + p.budget for p in self.prompts), default=0)


def _group_rollouts(df: pd.DataFrame, eos: np.ndarray) -> dict[int, dict[int, tuple[list[float], list[float], list[bool]]]]:
    out: dict[int, dict[int, tuple[list[float], list[float], list[bool]]]] = {}
    if df.empty:
        return out
    df = df.sort_values(["prompt_id", "pos", "step"], kind="stable")
    pid, d = df["prompt_id"].to_numpy(np.int64), df["pos"].to_numpy(np.int64)
    starts = np.flatnonzero(np.r_[True, (np.diff(pid) != 0) | (np.diff(d) != 0)])
    conf = np.split(df["draft_conf"].to_numpy(float), starts[1:])
    ent = np.split(df["draft_entropy"].to_numpy(float), starts[1:])
    end = np.split(np.isin(df["token"].to_numpy(np.int64), eos), starts[1:])
    for j, s in enumerate(starts):
        out.setdefault(int(pid[s]), {})[int(d[s])] = (conf[j].tolist(), ent[j].tolist(), end[j].tolist())
    return out


def _group_layers(df: pd.DataFrame, pos: pd.DataFrame, eos: np.ndarray) -> dict[int, dict[int, DraftPath]]:
    """Per prompt and exit layer, a greedy draft path: accepted iff the early-exit token matches."""
    target = pos[["prompt_id", "pos", "target_token"]]
    df = df.merge(target, on=["prompt_id", "pos"], how="inner").sort_values(["prompt_id", "layer", "pos"])
    out: dict[int, dict[int, DraftPath]] = {}
    for (pid, layer), g in df.groupby(["prompt_id", "layer"], sort=False):
        accept = (g["token"].to_numpy() == g["target_token"].to_numpy()).tolist()
        out.setdefault(int(pid), {})[int(layer)] = DraftPath(
            accept=accept,
            run=runs_of(accept),
            confidence=g["draft_conf"].astype(float).tolist(),
            entropy=g["draft_entropy"].astype(float).tolist(),
            end=np.isin(g["token"].to_numpy(np.int64), eos).tolist(),
        )
    return out

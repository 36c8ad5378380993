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
rollout recorded at d. A run accepted to the end of the path (d = n, the prompt's length)
drafts on past it, as a live round does before it learns the target ended: it reads the
rollout's tail, the draft's continuation of the whole path (recorded at pos n from step 0;
``simlab.record.rollouts``). When a policy drafts past the end of a recorded rollout (or past
the path's end of a trace recorded before tails), the last recorded signal is repeated and the
overrun is counted; when no rollout was recorded at d (for the draft, only possible on
stochastic traces), the true path's signals stand in for it.

An exit layer drafting (LayerSkip, DEL) reads its own rollouts where the trace holds them
(``simlab record --rollout-layers``; the draft layer of a self-speculative trace has the
draft's). Where it holds none for that layer and prompt, the layer's teacher-forced signals at
the next positions stand in: the layer given the true prefix, not its own wrong token, which
may be far less confident than the layer continuing its own path (DEL on SmolLM2's layer 1:
0.78 where the live draft said 0.97), so a confidence-stopped round ends early.

Whether a drafted token is an end token (``TokenSignal.end``, which stops the drafting of the
policies that declare ``stops_at_draft_end``) is read from the recorded tokens — the draft's
token on the true path, the rollout's, an exit layer's — against the manifest's
``eos_token_ids`` (draft and target share a vocabulary; ``simlab record`` checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple

import numpy as np

from simlab.common.errors import SimlabError
from simlab.common.signals import ShadowTokens, TokenSignal
from simlab.trace.io import Trace
from simlab.trace.schema import NO_LAYER
from simlab.trace.tables import Columns
from simlab.trace.tree_replay import Expansions, group_expansions, target_ranks

if TYPE_CHECKING:
    import pandas as pd

NAN = math.nan  # a signal's score where no predictor's was recorded
NEW = tuple.__new__  # builds a TokenSignal several times faster than calling the class


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
    # the drafter's own continuations: after each divergence, and past the path's end
    rollouts: "Rollouts" = field(default_factory=lambda: Rollouts.none())
    end: list[bool] = field(default_factory=list)  # the drafted token at each position is an end token

    def __post_init__(self) -> None:
        # what a drafted token's signal is read from, in one tuple (one attribute read a drafted
        # round, not five): confidence, entropy, score (NaN at every position without a trained
        # predictor's: a list read per token rather than a test), end flag; and the accepted runs
        scores = self.score if self.score is not None else [NAN] * len(self.confidence)
        self.lists = (self.confidence, self.entropy, scores, self.end, self.run)


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
    # tree rounds (simlab.trace.tree_replay): the target token's rank among the draft's
    # candidates per position, and the recorded EAGLE-2 trees (None without tree.parquet)
    ranks: list[int] = field(default_factory=list)
    expansions: Expansions | None = None
    # where the prompt itself ends on a path extended past it (simlab.trace.past_end: the engine
    # stops there); n_tokens on any other trace
    stop: int = 0
    # the prompt's token ids (prompts.parquet's prompt_token_ids; None in traces without them),
    # which drafting by lookup reads
    prompt_tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.stop = self.stop or self.n_tokens

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

    def signals(self, start: int, layer: int | None = None, first: int = 1) -> Iterator[TokenSignal]:
        """The signals of a draft run that starts at position ``start``, from its ``first``-th
        (1-based) token on, produced as they are read (a run reads as far as its policy drafts).

        While every earlier token of the run was accepted the draft is on the true path and its
        recorded signals are read; past the run's first rejection, this drafter's own divergence
        rollout recorded there (the draft's, or exit layer ``layer``'s). With none there (a layer
        recorded without ``--rollout-layers``, or a stochastic trace), its teacher-forced signals
        at the following positions stand in (see the module docstring). Reads past what was
        recorded repeat its last entry and count a rollout overrun.
        """
        new, nan = NEW, NAN
        path = self.draft if layer is None else self.path(layer)
        conf, ent, scores, ends, run = path.lists
        n = self.n_tokens
        r = run[start]
        d = start + r  # the run's first rejected position (n when the run reaches the end)
        # on the true path: positions start+first-1..d, each read as it is drafted (a range
        # loop: this generator yields once per simulated draft token)
        lo, hi = start + first - 1, min(d, n - 1) + 1
        for t in range(lo, hi):
            yield new(TokenSignal, (t - start + 1, conf[t], ent[t], scores[t], ends[t]))
        t = max(lo, hi)
        i = t - start + 1
        if t == d:  # the run reaches past the path's end
            yield new(TokenSignal, (i, *self._past_end(path)))
            i += 1
            t += 1
        rollout = path.rollouts.get(d)
        if rollout is None:
            while True:
                u = min(t, n - 1)
                yield new(TokenSignal, (i, conf[u], ent[u], scores[u], ends[u]))
                i += 1
                t += 1
        rconf, rent, rends = rollout
        for j in range(t - d - 1, len(rconf)):  # the rollout's steps from this token's on
            yield new(TokenSignal, (i, rconf[j], rent[j], nan, rends[j]))
            i += 1
        while True:  # past the recorded rollout
            self.rollout_overruns += 1
            yield new(TokenSignal, (i, rconf[-1], rent[-1], nan, rends[-1]))
            i += 1

    def _past_end(self, path: DraftPath) -> tuple[float, float, float, bool]:
        """The signal of the first token a run drafts past the path's end: the tail's step 0,
        else (a trace recorded before tails) the last position's again, a rollout overrun."""
        head = path.rollouts.head(self.n_tokens)
        if head is None:
            self.rollout_overruns += 1
            conf, ent, scores, ends, _ = path.lists
            u = self.n_tokens - 1
            head = conf[u], ent[u], scores[u], ends[u]
        return head

    def draft_until(self, start: int, layer: int | None, cap: int, stop: Callable[[TokenSignal], object],
                    stop_at_end: bool = False, go: object = False) -> tuple[list[TokenSignal], object]:
        """Up to ``cap`` signals of :meth:`signals` from ``start``, until ``stop`` of one answers
        other than ``go`` (or, with ``stop_at_end``, one is an end token): those signals, and how
        they ended — ``go`` at the cap, None at an end token, else ``stop``'s answer. What a
        draft loop (``simlab.policies.rounds.DraftLoop.run``: a stop rule and False, or ``on_draft`` and
        DRAFT) reads from :meth:`signals`, rollout overruns included, drafted in one frame: the
        simulator drafts most tokens so, and a generator's resumption, its closing and a loop
        around it were most of a short round. tests/test_replay.py pins the two together."""
        path = self.draft if layer is None else self.path(layer)
        conf, ent, scores, ends, run = path.lists
        n = self.n_tokens
        d = start + run[start]  # the run's first rejected position (n when the run reaches the end)
        drafted: list[TokenSignal] = []
        append = drafted.append
        hi = d + 1 if d < n else n  # min(d, n - 1) + 1 (d <= n), as the bounds below, without a call
        last = start + cap if start + cap < hi else hi
        for t in range(start, last):  # on the true path
            signal = NEW(TokenSignal, (t - start + 1, conf[t], ent[t], scores[t], ends[t]))
            append(signal)
            said = None if stop_at_end and signal.end else stop(signal)
            if said != go:
                return drafted, said
        t, i = hi, hi - start + 1
        if i > cap:
            return drafted, go
        if t == d:  # the run reaches past the path's end
            signal = NEW(TokenSignal, (i, *self._past_end(path)))
            append(signal)
            said = None if stop_at_end and signal.end else stop(signal)
            if said != go:
                return drafted, said
            t, i = t + 1, i + 1
        rollout = path.rollouts.get(d)
        if rollout is None:  # teacher-forced signals at the next positions, the last one repeated
            for i in range(i, cap + 1):
                u = min(t, n - 1)
                signal = NEW(TokenSignal, (i, conf[u], ent[u], scores[u], ends[u]))
                append(signal)
                said = None if stop_at_end and signal.end else stop(signal)
                if said != go:
                    return drafted, said
                t += 1
            return drafted, go
        rconf, rent, rends = rollout
        for j in range(t - d - 1, min(len(rconf), t - d - 1 + cap - i + 1)):  # the rollout's steps
            signal = NEW(TokenSignal, (i, rconf[j], rent[j], NAN, rends[j]))
            append(signal)
            said = None if stop_at_end and signal.end else stop(signal)
            if said != go:
                return drafted, said
            i += 1
        for i in range(i, cap + 1):  # past the recorded rollout
            self.rollout_overruns += 1
            signal = NEW(TokenSignal, (i, rconf[-1], rent[-1], NAN, rends[-1]))
            append(signal)
            said = None if stop_at_end and signal.end else stop(signal)
            if said != go:
                return drafted, said
        return drafted, go

    def shadows(self, start: int, count: int) -> ShadowTokens:
        """Every recorded exit layer's token at positions ``start..start+count-1`` (DEL's shadow
        tokens; layer signals are teacher-forced on the true prefix, as in a verification): rows
        of the prompt's :attr:`shadow_tokens`."""
        whole = self.shadow_tokens
        return ShadowTokens(start, whole.layers, whole.table[start:start + count])

    @cached_property
    def shadow_tokens(self) -> ShadowTokens:
        """The shadow tokens of every position, built once per prompt (on DEL's first read): a
        round reads a slice of it, where building its rows each round was most of a round."""
        return ShadowTokens.read(0, {layer: p.accept for layer, p in self.layers.items()},
                                 {layer: p.confidence for layer, p in self.layers.items()})

    @cached_property
    def tokens(self) -> np.ndarray:
        """The prompt's tokens then the target's, one array (int64): what a lookup reads, cut at
        the committed position (:class:`~simlab.policies.rounds.Propose`)."""
        if self.prompt_tokens is None:
            raise SimlabError("this trace has no prompt token ids (prompts.parquet's prompt_token_ids), which "
                              "drafting by lookup reads; record it with simlab record")
        return np.concatenate([np.asarray(self.prompt_tokens, dtype=np.int64),
                               np.asarray(self.target_tokens, dtype=np.int64)])

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
        return islice(self.replay.signals(self.start, self.layer, self.first), self.count)

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
        return next(self.replay.signals(self.start, self.layer, self.first + i))


class TraceReplay:
    """All prompts of a trace, with acceptance outcomes fixed for one seed.

    The per-prompt arrays a round-by-round replay reads (:attr:`prompts`) are built on first
    use; what closed-form computations need (acceptance bits, prompt lengths, budgets) is here
    as numpy arrays, all in prompt_id order.
    """

    def __init__(self, trace: Trace, seed: int = 0):
        self.trace = trace
        self.seed = seed
        self.greedy = trace.manifest.greedy
        self._pos = pos = trace.columns("positions").sorted_by(["prompt_id", "pos"])
        pids = pos["prompt_id"]
        # prompt i holds rows bounds[i]:bounds[i+1] of the sorted positions
        self.bounds = np.concatenate([[0], np.flatnonzero(np.diff(pids)) + 1, [len(pos)]]).astype(np.int64)
        self.accept = self._accept(pos, seed)
        self._prompts_table = table = trace.columns("prompts").sorted_by(["prompt_id"])
        self.prompt_ids = table["prompt_id"].astype(np.int64)
        self.prompt_lens = table["prompt_len"].astype(np.int64)
        self.lengths = table["n_tokens"].astype(np.int64)
        self.ends = table["end"].astype(np.int64) if "end" in table else self.lengths  # simlab.trace.past_end
        budget = int(trace.manifest.max_new_tokens)
        self.budgets = np.maximum(self.lengths, np.where(table["stop"] == "eos", budget, 0))
        self._prompts: list[PromptReplay] | None = None

    @property
    def prompts(self) -> list[PromptReplay]:
        if self._prompts is None:
            self._prompts = self._build_prompts()
        return self._prompts

    def _build_prompts(self) -> list[PromptReplay]:
        pos, bounds, trace = self._pos, self.bounds, self.trace

        def split(values: np.ndarray) -> list[list]:
            # one tolist() and list slices: far cheaper than a numpy view per prompt
            whole = values.tolist()
            return [whole[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]

        eos = np.asarray(trace.manifest.eos_token_ids, dtype=np.int64)
        columns = {
            "accept": split(self.accept),
            "run": split(_runs(self.accept, bounds)),
            "target": split(pos["target_token"].astype(np.int64)),
            "draft": split(pos["draft_token"].astype(np.int64)),
            "conf": split(pos["draft_conf"].astype(float)),
            "entropy": split(pos["draft_entropy"].astype(float)),
            "end": split(np.isin(pos["draft_token"].astype(np.int64), eos)),
            "ranks": split(target_ranks(trace.columns("topk") if trace.has("topk") else None, trace.manifest.topk,
                                        pos["target_token"].astype(np.int64), self.accept)),
        }
        scores = split(pos["predictor_score"].astype(float)) if "predictor_score" in pos else None
        by_layer = _rollout_tables(trace.columns("rollouts"), eos)
        rollouts = by_layer.pop(NO_LAYER)
        if trace.manifest.draft_layer != NO_LAYER:  # a self-speculative draft's rollouts are its layer's
            by_layer.setdefault(trace.manifest.draft_layer, rollouts)
        layers = _group_layers(trace.layers, trace.positions, eos, by_layer) if trace.has("layers") else {}
        expansions = {}
        if trace.has("tree"):
            m = trace.manifest
            expansions = group_expansions(trace.columns("tree"), m.topk, m.tree_depth, self.prompt_ids.tolist(),
                                          columns["target"])
        table = self._prompts_table
        ids = table["prompt_token_ids"] if "prompt_token_ids" in table else None
        prompts = []
        for i, (pid, prompt_len, n, budget, stop) in enumerate(zip(self.prompt_ids.tolist(), self.prompt_lens.tolist(),
                                                                  self.lengths.tolist(), self.budgets.tolist(),
                                                                  self.ends.tolist())):
            draft = DraftPath(
                accept=columns["accept"][i],
                run=columns["run"][i],
                confidence=columns["conf"][i],
                entropy=columns["entropy"][i],
                score=scores[i] if scores is not None else None,
                rollouts=rollouts.of(pid),
                end=columns["end"][i],
            )
            prompts.append(PromptReplay(
                prompt_id=pid,
                prompt_len=prompt_len,
                n_tokens=n,
                budget=budget,
                target_tokens=columns["target"][i],
                draft_tokens=columns["draft"][i],
                draft=draft,
                layers=layers.get(pid, {}),
                ranks=columns["ranks"][i],
                expansions=expansions.get(pid),
                stop=stop,
                prompt_tokens=ids[i] if ids is not None else None,
            ))
        return prompts

    def _accept(self, pos: Columns, seed: int) -> np.ndarray:
        if self.greedy:  # no draw: numpy.random is not even imported
            return pos["draft_token"] == pos["target_token"]
        rng = np.random.default_rng(seed)
        q, p = pos["q_target"].astype(float), pos["p_target"].astype(float)
        ratio = np.minimum(1.0, q / np.where(p > 0, p, 1.0))
        return rng.random(len(pos)) < np.where(p > 0, ratio, 0.0)

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def max_context(self) -> int:
        return int((self.prompt_lens + self.budgets).max()) if len(self.lengths) else 0


def _runs(accept: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """:func:`runs_of` for every prompt at once (prompt i holds rows ``bounds[i]:bounds[i+1]``)."""
    t = np.arange(len(accept))
    rejected = np.flatnonzero(~accept)
    next_rejected = np.append(rejected, len(accept))[np.searchsorted(rejected, t)]
    prompt_end = np.repeat(bounds[1:], np.diff(bounds))
    return np.minimum(next_rejected, prompt_end) - t


class Rollouts:
    """One prompt's rollouts: divergence position -> (confidences, entropies, end flags) of
    steps 1, 2, ...; and the tail's step 0 at the path's end (:meth:`head`).

    Grouped into lists on first use: a trace holds a rollout per rejected position, and a
    policy that reads no signals past a rejection (vanilla SD) never needs them.
    """

    __slots__ = ("_pos", "_step", "_conf", "_ent", "_end", "_groups", "_heads")

    def __init__(self, pos: np.ndarray, step: np.ndarray, conf: np.ndarray, ent: np.ndarray, end: np.ndarray):
        self._pos, self._step = pos, step  # sorted by (pos, step)
        self._conf, self._ent, self._end = conf, ent, end
        self._groups: dict[int, tuple[list[float], list[float], list[bool]]] | None = None
        self._heads: dict[int, tuple[float, float, float, bool]] = {}

    @classmethod
    def none(cls) -> "Rollouts":
        empty = np.empty(0)
        return cls(empty, empty, empty, empty, empty)

    def get(self, d: int) -> tuple[list[float], list[float], list[bool]] | None:
        if self._groups is None:
            self._group()
        return self._groups.get(d)

    def head(self, d: int) -> tuple[float, float, float, bool] | None:
        """Step 0 of the rollout at ``d`` as a signal's (confidence, entropy, score, end): only
        the tail has one; at a divergence step 0 is the true path's."""
        if self._groups is None:
            self._group()
        return self._heads.get(d)

    def _group(self) -> None:
        cuts = np.flatnonzero(np.diff(self._pos)) + 1
        starts = [0, *cuts.tolist()]
        ends = [*cuts.tolist(), len(self._pos)]
        conf, ent, end = self._conf.tolist(), self._ent.tolist(), self._end.tolist()
        at = self._pos[starts].tolist() if len(self._pos) else []
        first = self._step[starts].tolist() if len(self._pos) else []
        self._groups = {}
        for d, a, b, s in zip(at, starts, ends, first):
            if s == 0:
                self._heads[d] = conf[a], ent[a], NAN, end[a]
                a += 1
            self._groups[d] = conf[a:b], ent[a:b], end[a:b]


def _rollout_tables(rollouts: Columns, eos: np.ndarray) -> dict[int, "_RolloutTable"]:
    """The rollouts table cut by whose continuation each row is: the draft's (``NO_LAYER``,
    always present, perhaps empty) and each exit layer's that has its own."""
    layer = rollouts["layer"]
    tables = {x: _RolloutTable(rollouts.subset(np.flatnonzero(layer == x)), eos) for x in set(layer.tolist())}
    tables.setdefault(NO_LAYER, _RolloutTable(rollouts.subset(np.zeros(0, np.int64)), eos))
    return tables


class _RolloutTable:
    """Rows of a trace's rollouts table (one drafter's) as sorted arrays, cut into
    :class:`Rollouts` per prompt."""

    def __init__(self, rows: Columns, eos: np.ndarray):
        rows = rows.sorted_by(["prompt_id", "pos", "step"])
        self.pid = rows["prompt_id"].astype(np.int64)
        self.pos = rows["pos"].astype(np.int64)
        self.step = rows["step"].astype(np.int64)
        self.conf = rows["draft_conf"].astype(float)
        self.ent = rows["draft_entropy"].astype(float)
        self.end = np.isin(rows["token"].astype(np.int64), eos)

    def of(self, prompt_id: int) -> Rollouts:
        lo, hi = np.searchsorted(self.pid, [prompt_id, prompt_id + 1])
        return Rollouts(self.pos[lo:hi], self.step[lo:hi], self.conf[lo:hi], self.ent[lo:hi], self.end[lo:hi])


def _group_layers(df: pd.DataFrame, pos: pd.DataFrame, eos: np.ndarray,
                  rollouts: dict[int, _RolloutTable]) -> dict[int, dict[int, DraftPath]]:
    """Per prompt and exit layer, a greedy draft path: accepted iff the early-exit token matches;
    with the layer's own divergence rollouts where ``rollouts`` has them."""
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
            rollouts=rollouts[layer].of(pid) if layer in rollouts else Rollouts.none(),
        )
    return out

"""One prompt through the models, into rows of the trace tables.

1. the target decodes with ``generate`` (its output path and raw logits, see ``decode``);
2. the draft runs one teacher-forced pass over the prompt and that path, giving its greedy
   token, confidence, entropy and probabilities at every position (``forward``, ``signals``);
   with exit layers, the target's own teacher-forced pass gives every exit layer's early-exit
   token and confidence, and for self-speculative traces the chosen ``draft_layer`` is the
   draft;
3. after every divergence the draft continues on its own for ``rollout`` tokens, and once more
   past the path's end (the tail), all of a prompt's rollouts in one batch branching from the
   teacher-forced cache (``rollouts``);
   ``layer_rollouts`` does the same for exit layers, after their own divergences, for a prompt
   recorded now or earlier (``--rollout-layers``);
4. with ``topk``, the draft's top-K candidates at every position, and with ``tree_depth`` the
   EAGLE-2 candidate tree from every position, branching from the same cache
   (``tree_expansion``).

Each step is timed, so that the trace itself says what recording cost relative to plain
generation (the ``*_seconds`` columns of prompts.parquet).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from simlab.record.decode import decode
from simlab.record.forward import exit_logits, first_layers, forced_pass, truncated
from simlab.record.prompts import Prompt, render
from simlab.record.rollouts import Rollout, rollouts
from simlab.record.signals import PositionSignals, greedy_stats, position_signals
from simlab.record.tree_expansion import Expansion, TopK, expansions, top_k
from simlab.trace.io import empty_table
from simlab.trace.schema import NO_LAYER


@dataclass
class Models:
    """Loaded models and how to run them."""

    tokenizer: object
    target: object
    draft: object | None  # None: self-speculative, the draft is the target cut at draft_layer
    exit_layers: list[int]
    draft_layer: int
    chat_template: bool
    max_new_tokens: int
    temperature: float
    seed: int
    rollout: int
    topk: int = 0
    tree_depth: int = 0

    def drafter(self) -> AbstractContextManager:
        """The draft model as it is, or the target cut at the draft layer."""
        if self.draft is not None:
            return nullcontext(self.draft)
        return truncated(self.target, self.draft_layer)


def record_prompt(m: Models, prompt: Prompt) -> dict[str, pd.DataFrame]:
    """Rows of every table for one prompt (``layers`` only when exit layers are recorded)."""
    rendered = render(prompt, m.tokenizer, m.chat_template)
    ids = torch.tensor([rendered.ids], device=m.target.device)
    t0 = time.perf_counter()
    out = decode(m.target, ids, m.max_new_tokens, m.temperature, m.seed, prompt.prompt_id)
    t1 = time.perf_counter()
    tables: dict[str, pd.DataFrame] = {}
    if m.exit_layers:
        target_pass = forced_pass(m.target, ids, out.tokens, hidden=True)
        tables["layers"] = _layer_rows(m, prompt.prompt_id, target_pass.hidden)
    if m.draft is not None:
        draft_pass = forced_pass(m.draft, ids, out.tokens)
        draft_logits = draft_pass.logits
    else:
        draft_pass = target_pass
        draft_logits = exit_logits(m.target, target_pass.hidden, m.draft_layer)
    signals = position_signals(draft_logits, out.logits, out.tokens, m.temperature)
    t2 = time.perf_counter()
    path = out.tokens.cpu().numpy()
    runs: list[Rollout] = []
    if m.rollout > 0:
        with m.drafter() as drafter:
            runs = _rollouts(drafter, draft_pass.cache, len(rendered.ids), path, signals.draft.token, m.rollout)
    t3 = time.perf_counter()
    if m.topk:
        candidates = top_k(draft_logits, m.topk)
        tables["topk"] = _topk_rows(prompt.prompt_id, candidates)
        if m.tree_depth:
            with m.drafter() as drafter:
                trees = expansions(drafter, draft_pass.cache, len(rendered.ids), candidates, m.tree_depth)
            tables["tree"] = _tree_rows(prompt.prompt_id, trees)
    t4 = time.perf_counter()
    tables["prompts"] = pd.DataFrame(
        {
            "prompt_id": [prompt.prompt_id],
            "source": [prompt.source],
            "prompt_len": [len(rendered.ids)],
            "n_tokens": [len(path)],
            "stop": [out.stop],
            "prompt_text": [rendered.text],
            "prompt_token_ids": [list(rendered.ids)],
            "generate_seconds": [t1 - t0],
            "signals_seconds": [t2 - t1],
            "rollout_seconds": [t3 - t2],
            "tree_seconds": [t4 - t3],
        }
    )
    tables["positions"] = _position_rows(prompt.prompt_id, path, signals)
    tables["rollouts"] = _rollout_rows(prompt.prompt_id, runs)
    return tables


def path_rows(m: Models, prompt_id: int, prompt_ids: list[int], path: np.ndarray,
              end: int) -> tuple[dict[str, pd.DataFrame], float]:
    """Rows of positions.parquet, past_end.parquet and rollouts.parquet for a greedy path decoded by
    another engine (vLLM: :mod:`simlab.record.vllm`), whose first ``end`` tokens are the prompt's own
    output and the rest its continuation past the end. The signals come from one teacher-forced pass
    of each model over the whole path, as :func:`record_prompt` computes them from the draft's (the
    target's logits too are a forced pass here, where there they come from its own decode); the
    rollouts, from the draft's pass over the prompt's own output, as there. Returns the rows and the
    seconds the rollouts took (that pass included), which a caller times apart from the signals."""
    ids = torch.tensor([prompt_ids], device=m.target.device)
    whole = torch.as_tensor(path, dtype=torch.long)
    draft_pass = forced_pass(m.draft, ids, whole)
    signals = position_signals(draft_pass.logits, forced_pass(m.target, ids, whole).logits, whole, m.temperature)
    rows = _position_rows(prompt_id, path, signals)
    own = path[:end]
    runs: list[Rollout] = []
    started = time.perf_counter()
    if m.rollout > 0:
        cache = forced_pass(m.draft, ids, whole[:end]).cache
        runs = _rollouts(m.draft, cache, len(prompt_ids), own, signals.draft.token[:end], m.rollout)
    rollout_seconds = time.perf_counter() - started
    return {"positions": rows.iloc[:end].reset_index(drop=True), "past_end": rows.iloc[end:].reset_index(drop=True),
            "rollouts": _rollout_rows(prompt_id, runs)}, rollout_seconds


def _position_rows(prompt_id: int, path: np.ndarray, s: PositionSignals) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "prompt_id": prompt_id,
            "pos": np.arange(len(path)),
            "target_token": path,
            "draft_token": s.draft.token,
            "draft_conf": s.draft.conf,
            "draft_entropy": s.draft.entropy,
            "q_target": s.q_target,
            "p_target": s.p_target,
            "p_draft": s.p_draft,
            "accept_prob": s.accept_prob,
        }
    )


def _layer_rows(m: Models, prompt_id: int, hidden: tuple[torch.Tensor, ...]) -> pd.DataFrame:
    frames = []
    for layer in m.exit_layers:
        stats = greedy_stats(exit_logits(m.target, hidden, layer))
        frames.append(
            pd.DataFrame(
                {
                    "prompt_id": prompt_id,
                    "pos": np.arange(len(stats.token)),
                    "layer": layer,
                    "token": stats.token,
                    "draft_conf": stats.conf,
                    "draft_entropy": stats.entropy,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def forced_cache(m: Models, prompt_ids: list[int], path: np.ndarray, model=None):
    """The KV cache of a recorded prompt and path from one teacher-forced pass of ``model`` (by
    default the target's: what :func:`layer_rollouts` branches from; an exit layer's entries of
    it are the layer's own, as its first layers see the same tokens)."""
    ids = torch.tensor([prompt_ids], device=m.target.device)
    return forced_pass(model or m.target, ids, torch.as_tensor(path, dtype=torch.long)).cache


def layer_rollouts(m: Models, prompt_id: int, prompt_len: int, cache, path: np.ndarray,
                   layer_tokens: dict[int, np.ndarray]) -> Iterator[tuple[int, pd.DataFrame, float]]:
    """Exit layers' own divergence rollouts on a recorded prompt (``--rollout-layers``).

    At every position t where layer l's early-exit token (``layer_tokens[l]``, as layers.parquet
    holds it) is not the target's (``path``), the layer continues from its own token for
    ``m.rollout`` steps, as a layer drafting past its mistake does: step 1 is its greedy token
    given ``prompt + path[:t] + its token``. All branch from ``cache`` (:func:`forced_cache`).
    Yields ``(layer, rollout rows, seconds)`` layer by layer, so that a recorder can commit each
    as it comes.
    """
    for layer, tokens in layer_tokens.items():
        started = time.perf_counter()
        with truncated(m.target, layer) as drafter:
            runs = _rollouts(drafter, first_layers(cache, layer), prompt_len, path, tokens, m.rollout)
        yield layer, _rollout_rows(prompt_id, runs, layer), time.perf_counter() - started


def draft_rollouts(m: Models, prompt_id: int, prompt_ids: list[int], path: np.ndarray,
                   draft_tokens: np.ndarray) -> pd.DataFrame:
    """The draft's rollouts of a recorded prompt again (``draft_tokens``: its tokens on the true
    path, as positions.parquet holds them), branching from a new teacher-forced pass: what
    ``simlab record --resume`` gives prompts recorded before rollouts had a tail."""
    if m.draft is not None:
        cache = forced_cache(m, prompt_ids, path, m.draft)
    else:
        cache = first_layers(forced_cache(m, prompt_ids, path), m.draft_layer)
    with m.drafter() as drafter:
        runs = _rollouts(drafter, cache, len(prompt_ids), path, draft_tokens, m.rollout)
    return _rollout_rows(prompt_id, runs)


def _rollouts(drafter, cache, prompt_len: int, path: np.ndarray, tokens: np.ndarray, steps: int) -> list[Rollout]:
    """A drafter's rollouts after every position where its token (``tokens``) is not the
    target's (``path``), and its tail (:func:`~simlab.record.rollouts.rollouts`)."""
    diverged = [int(t) for t in np.flatnonzero(tokens != path)]
    return rollouts(drafter, cache, prompt_len, diverged, [int(tokens[t]) for t in diverged], steps, int(path[-1]))


def _rollout_rows(prompt_id: int, runs: list[Rollout], layer: int = NO_LAYER) -> pd.DataFrame:
    if not runs:
        return empty_table("rollouts")
    return pd.DataFrame(
        {
            "prompt_id": prompt_id,
            "pos": np.concatenate([np.full(len(r.tokens), r.pos) for r in runs]),
            "step": np.concatenate([np.arange(r.first_step, r.first_step + len(r.tokens)) for r in runs]),
            "token": np.concatenate([r.tokens for r in runs]),
            "draft_conf": np.concatenate([r.conf for r in runs]),
            "draft_entropy": np.concatenate([r.entropy for r in runs]),
            "layer": layer,
        }
    )


def _topk_rows(prompt_id: int, top: TopK) -> pd.DataFrame:
    n, k = top.token.shape
    return pd.DataFrame({"prompt_id": prompt_id, "pos": np.repeat(np.arange(n), k), "rank": np.tile(np.arange(k), n),
                         "token": top.token.reshape(-1), "prob": top.prob.reshape(-1)})


def _tree_rows(prompt_id: int, trees: list[Expansion]) -> pd.DataFrame:
    return pd.DataFrame({
        "prompt_id": prompt_id,
        "pos": np.concatenate([np.full(len(e.parent), e.pos) for e in trees]),
        "node": np.concatenate([np.arange(len(e.parent)) for e in trees]),
        "parent": np.concatenate([e.parent for e in trees]),
        "rank": np.concatenate([e.rank for e in trees]),
        "token": np.concatenate([e.token for e in trees]),
        "prob": np.concatenate([e.prob for e in trees]),
    })

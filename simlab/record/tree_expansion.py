"""What tree policies need from the draft: its top-K candidates, and EAGLE-2's dynamic trees.

Top-K (``--topk K``). At every position of the target's path, the draft's K likeliest tokens
given the true prefix, with their probabilities (raw softmax, the signal convention of
``simlab.trace.schema``). Under greedy verification only nodes on the target's path can be
accepted, and their prefix *is* the true prefix, so this table replays every tree whose shape
does not depend on the draft's probabilities off the path (fixed shapes, Sequoia's) exactly.

Dynamic trees (``--tree-depth D``). EAGLE-2 (Li et al. 2024, "EAGLE-2: Faster Inference of
Language Models with Dynamic Draft Trees", arXiv 2406.16858, §4.1-4.2) decides which nodes to
grow from the draft's probabilities *off* the target's path, which the top-K table does not
hold. So the recorder runs EAGLE-2's expansion itself from every position's true prefix and
stores the whole candidate tree: level 1 is the root's top-K; each further level expands the
K candidates of the previous level with the largest cumulative probability (the product of
the draft probabilities on the node's path) into their top-K children, D levels in all. Every
EAGLE-2 tree of top-k K and depth ≤ D, and every top-n rerank of it, is a subset of this tree,
so replay is exact for those shape parameters. Cumulative probabilities are products in
float64 of the stored float32 probabilities, parent first, and ties go to the earlier node,
exactly as the replaying policy computes them, so replay picks the nodes recorded here.

The expansion branches from the teacher-forced KV cache as the divergence rollouts do
(``simlab.record.rollouts``): a row for candidate j at position t hides the cache entries of the
path from t on, and appends its own nodes; growing a level reorders the rows by parent
(``reorder_cache``) and appends one token per row.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from simlab.models.kv_cache import cache_kwargs
from simlab.record.rollouts import MAX_BATCH


@dataclass
class TopK:
    """The draft's top-K at each of n positions: (n, K) tokens and probabilities, rank order."""

    token: np.ndarray
    prob: np.ndarray


@dataclass
class Expansion:
    """One position's EAGLE-2 candidate tree: nodes in creation order, parents before children."""

    pos: int
    parent: np.ndarray  # -1: a child of the root (the last committed token)
    rank: np.ndarray  # which of its parent's top-K candidates the node is (0-based)
    token: np.ndarray
    prob: np.ndarray  # float32 draft probability of the token given its parent's prefix


def top_k(logits: torch.Tensor, k: int) -> TopK:
    """Raw-softmax top-``k`` of ``logits`` (n, V), ties broken toward the lower token id."""
    p = torch.softmax(logits.detach().float(), dim=-1)
    prob, token = torch.topk(p, k, dim=-1, sorted=True)
    return TopK(token.cpu().numpy().astype(np.int64), prob.cpu().numpy().astype(np.float32))


def frontier(cum: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest cumulative probabilities per row, ties to the earlier index."""
    return np.argsort(-cum, axis=-1, kind="stable")[..., :k]


@torch.inference_mode()
def expansions(model, cache, prompt_len: int, first: TopK, depth: int) -> list[Expansion]:
    """EAGLE-2's D-level candidate tree at every position (module docstring). ``first`` is the
    draft's top-K on the true path (level 1), ``cache`` its teacher-forced cache, left unchanged."""
    n, k = first.token.shape
    per_batch = max(1, MAX_BATCH // k)
    out: list[Expansion] = []
    for lo in range(0, n, per_batch):
        out += _expand(model, cache, prompt_len, np.arange(lo, min(n, lo + per_batch)), first, depth)
    return out


def _expand(model, cache, prompt_len: int, positions: np.ndarray, first: TopK, depth: int) -> list[Expansion]:
    g, k = len(positions), first.token.shape[1]
    device = model.device
    parent = [np.full(k, -1)] * g
    rank = [np.arange(k)] * g
    token = [first.token[t] for t in positions]
    prob = [first.prob[t] for t in positions]
    cum = first.prob[positions].astype(np.float64)  # (g, k): level 1
    ids = np.tile(np.arange(k), (g, 1))  # node id of each level candidate
    if depth > 1:
        branch = copy.deepcopy(cache)
        branch.batch_repeat_interleave(g * k)
        cached = branch.get_seq_length()
        start = torch.tensor(positions + prompt_len, device=device).repeat_interleave(k)
        mask = (torch.arange(cached, device=device).unsqueeze(0) < start.unsqueeze(1)).long()
    for level in range(2, depth + 1):
        pick = frontier(cum, k)  # (g, k) indices into the level's candidates
        node_ids = np.take_along_axis(ids, pick, axis=1)
        tokens = np.stack([token[i][node_ids[i]] for i in range(g)])
        if level > 2:  # row (i, j) continues the branch row of its parent, slot pick // k of the last forward
            beam = np.arange(g)[:, None] * k + pick // k
            branch.reorder_cache(torch.tensor(beam.reshape(-1), device=device))
        mask = torch.cat([mask, torch.ones(g * k, 1, dtype=mask.dtype, device=device)], dim=1)
        logits = model(
            input_ids=torch.tensor(tokens.reshape(-1, 1), device=device),
            attention_mask=mask,
            position_ids=(start + level - 2).unsqueeze(1),
            **cache_kwargs(model, branch),
            use_cache=True,
        ).logits[:, -1]
        children = top_k(logits, k)
        child_tok = children.token.reshape(g, k, k)
        child_prob = children.prob.reshape(g, k, k)
        parent_cum = np.take_along_axis(cum, pick, axis=1)
        cum = (parent_cum[:, :, None] * child_prob.astype(np.float64)).reshape(g, k * k)
        ids = np.empty((g, k * k), dtype=np.int64)
        for i in range(g):
            base = len(parent[i])
            ids[i] = base + np.arange(k * k)
            parent[i] = np.concatenate([parent[i], np.repeat(node_ids[i], k)])
            rank[i] = np.concatenate([rank[i], np.tile(np.arange(k), k)])
            token[i] = np.concatenate([token[i], child_tok[i].reshape(-1)])
            prob[i] = np.concatenate([prob[i], child_prob[i].reshape(-1)])
    return [Expansion(int(t), parent[i], rank[i], token[i], prob[i]) for i, t in enumerate(positions)]

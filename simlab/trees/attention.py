"""Draft trees decoded for real: one forward over many branches, and a KV cache kept to one path.

A tree round (:mod:`simlab.policies.rounds`) drafts several continuations of the committed prefix and
verifies them all in one target forward (SpecInfer's token tree verification: Miao et al.,
"SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative Inference and
Verification", ASPLOS 2024, arXiv:2305.09781). The nodes of a tree are fed to a model as one
flat sequence after its cached prefix; what makes that one forward equal to a forward per
root-to-node path is

- the attention mask: a node attends to the committed prefix, its ancestors and itself, never to
  a sibling or a cousin fed beside it;
- the position ids: a node at depth d sits at position ``(prefix length - 1) + d`` (the last
  committed token's position plus its depth), whatever its place in the flat sequence.

transformers passes a 4-D ``attention_mask`` of shape (batch, 1, query, key) to the attention
as it is (``masking_utils._preprocess_mask_arguments``: "If the mask is already 4D, simply return
as-is"); an additive float mask (0 where a token may attend, the dtype's minimum elsewhere) is
read alike by the eager and SDPA attentions. The cached keys carry the rotary embedding of the
position they were computed at, so after verification the cache is *compacted*: the entries of
the accepted path are kept, moved up behind the prefix, and every other node's are dropped
(:func:`keep_entries`); the next round then continues from a cache that a chain forward over
the accepted tokens would have left (tests/test_live_trees.py checks both equalities on a real
model).

The live decoder (:mod:`simlab.live.executor`) builds its forwards' inputs here, and so does the
latency probe (:mod:`simlab.record.latency`), so that the probe times the forwards decoding
runs; hence this module's place below both.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from simlab.common.errors import SimlabError
from simlab.trees.draft_tree import ROOT


def tree_inputs(cached: int, shared: int, prefix: int, visible: list[list[int]], positions: list[int],
                dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4-D additive attention mask and the position ids of a forward that feeds ``prefix``
    tokens of the committed sequence (causal) and then ``len(visible)`` tree nodes, after
    ``cached`` cache entries of which the first ``shared`` are the committed prefix (the rest:
    tree nodes fed by earlier forwards of the round). Every row sees the shared entries; a
    prefix row also the prefix rows up to itself; node row i also the prefix rows and the cache
    indices ``visible[i]`` (its ancestors' and its own, wherever they were fed). ``positions``
    holds every fed token's position id."""
    q = prefix + len(visible)
    allowed = torch.zeros(q, cached + q, dtype=torch.bool)
    allowed[:, :shared] = True
    allowed[:prefix, cached:cached + prefix] = torch.ones(prefix, prefix, dtype=torch.bool).tril()
    allowed[prefix:, cached:cached + prefix] = True
    for i, seen in enumerate(visible):
        allowed[prefix + i, seen] = True
    mask = torch.zeros(q, cached + q, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device), torch.tensor([positions], device=device)


def verify_inputs(cached: int, prefix: int, parents: Sequence[int], depths: Sequence[int], dtype: torch.dtype,
                  device) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask and position ids of the target's verification of a tree (node i's parent
    ``parents[i]``, its depth ``depths[i]``): ``prefix`` committed tokens then every node, after
    a cache of ``cached`` committed entries. The live decoder's forward, and the latency
    probe's (:mod:`simlab.record.latency`), so that the probe times the forward decoding runs."""
    first = cached + prefix  # cache index of node 0
    visible: list[list[int]] = []
    for i, p in enumerate(parents):
        visible.append([first + i] + (visible[p] if p != ROOT else []))
    positions = list(range(cached, first)) + [first - 1 + d for d in depths]
    return tree_inputs(cached, cached, prefix, visible, positions, dtype, device)


def keep_entries(cache, keep: list[int]) -> None:
    """Keep the cache entries at indices ``keep`` (in that order) in every layer of a transformers
    ``DynamicCache``, dropping the rest: a tree's accepted path moved up behind the prefix."""
    index = None
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise SimlabError("live tree decoding keeps a path's cache entries; a sliding-window cache cannot")
        if not layer.is_initialized:
            continue
        if index is None or index.device != layer.keys.device:
            index = torch.tensor(keep, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)


class LiveTree:
    """One round's draft candidates as the draft produced them: token, parent, depth of each,
    which candidate is (parent, rank), where the draft's cache holds the ones it has fed
    (expanded), and, for a candidate whose children were sampled (temperature > 0), the draft
    distribution they were drawn from (``proposal``; none for top-k children). ``base``: the
    draft cache's length once it holds the committed prefix."""

    __slots__ = ("tokens", "parents", "depths", "child", "slot", "proposal", "base")

    def __init__(self, base: int):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.child: dict[tuple[int, int], int] = {}
        self.slot: dict[int, int] = {}
        self.proposal: dict[int, torch.Tensor] = {}
        self.base = base

    def add(self, parent: int, rank: int, token: int) -> int:
        c = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
        self.child[(parent, rank)] = c
        return c

    def feed(self, expand: Sequence[int], cached: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask and position ids of the draft's forward over the candidates ``expand`` (one
        level's expansion), fed after ``cached`` cache entries, where it places them: each sees
        the committed prefix and its ancestors, at the position of its depth. The live
        decoder's forward, and the latency probe's."""
        for j, e in enumerate(expand):
            self.slot[e] = cached + j
        visible = [[self.slot[a] for a in self.ancestry(e)] for e in expand]
        positions = [self.base - 1 + self.depths[e] for e in expand]
        return tree_inputs(cached, self.base, 0, visible, positions, dtype, device)

    def ancestry(self, c: int) -> list[int]:
        """``c`` and its ancestors (not the root), deepest first."""
        out = []
        while c != ROOT:
            out.append(c)
            c = self.parents[c]
        return out

    def nodes_of(self, parents: tuple[int, ...], ranks: tuple[int, ...]) -> list[int]:
        """The candidate of every node of a :class:`~simlab.trees.draft_tree.DraftTree` given by
        its ``parents`` and ``ranks`` (node i is rank ``ranks[i]`` among its parent's children)."""
        out: list[int] = []
        for p, r in zip(parents, ranks):
            out.append(self.child[(ROOT if p == ROOT else out[p], r)])
        return out

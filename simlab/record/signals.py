"""Per-position signals computed from logits: what a policy sees and what acceptance needs.

Two probability conventions meet here (defined in ``simlab.trace.schema``): *signals*
(confidence, entropy) always use the raw softmax of the draft logits, because that is what
SPIDE (eq. 2), SVIP and Draft & Verify read; *acceptance* probabilities (q, p and
sum_x min(p, q)) use the recorded temperature, and the raw softmax for greedy traces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class GreedyStats:
    """The greedy token, its probability and the entropy (nats) of each row of logits."""

    token: np.ndarray  # int64
    conf: np.ndarray  # float32
    entropy: np.ndarray  # float32


@dataclass
class PositionSignals:
    """The draft columns of positions.parquet for one prompt (arrays of length n)."""

    draft: GreedyStats
    q_target: np.ndarray  # draft probability of the target token
    p_target: np.ndarray  # target probability of the target token
    p_draft: np.ndarray  # target probability of the draft token
    accept_prob: np.ndarray  # sum_x min(p(x), q(x))


def greedy_stats(logits: torch.Tensor) -> GreedyStats:
    """Raw-softmax (T = 1) statistics of ``logits`` of shape (n, V)."""
    logp = torch.log_softmax(logits.detach().float(), dim=-1)
    p = logp.exp()
    conf, token = p.max(dim=-1)
    entropy = torch.special.entr(p).sum(dim=-1)
    return GreedyStats(token.cpu().numpy(), conf.cpu().numpy(), entropy.cpu().numpy())


def position_signals(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, target_tokens: torch.Tensor, temperature: float
) -> PositionSignals:
    """Signals at the n positions of the target's path, both logits of shape (n, V).

    Models of one tokenizer may pad their embedding matrices to different widths; the
    padding rows are never real tokens, so both sides are cut to the common width.
    """
    width = min(draft_logits.shape[-1], target_logits.shape[-1])
    draft_logits, target_logits = draft_logits[:, :width].float(), target_logits[:, :width].float()
    draft = greedy_stats(draft_logits)
    scale = temperature if temperature > 0 else 1.0
    q = torch.softmax(draft_logits / scale, dim=-1)
    p = torch.softmax(target_logits / scale, dim=-1)
    tgt = target_tokens.to(q.device).long().unsqueeze(-1)
    drf = torch.from_numpy(draft.token).to(q.device).unsqueeze(-1)
    return PositionSignals(
        draft=draft,
        q_target=q.gather(-1, tgt).squeeze(-1).cpu().numpy(),
        p_target=p.gather(-1, tgt).squeeze(-1).cpu().numpy(),
        p_draft=p.gather(-1, drf).squeeze(-1).cpu().numpy(),
        accept_prob=torch.minimum(p, q).sum(dim=-1).clamp(max=1.0).cpu().numpy(),
    )

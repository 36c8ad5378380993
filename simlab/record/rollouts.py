"""The draft's own continuation after each position where it diverged from the target.

What a policy sees while it drafts past a mistake (docs/architecture.md, "Replay"): at a divergence position t
the draft emitted its own token d_t instead of the target's y_t; a drafting policy that does
not stop would feed d_t back and keep going. Step 1 of the rollout is the draft's greedy token
given ``prompt + y[:t] + d_t``, step 2 given that plus step 1's token, and so on.

All rollouts of a prompt run as one batch that branches from the teacher-forced KV cache:
the cache holds ``prompt + y[:-1]`` (length L); row i may see only its first ``P + t_i``
entries, so the attention mask hides the rest, and the row's new tokens are appended after
index L with position ids ``P + t_i, P + t_i + 1, ...``. Rotary embeddings were applied to the
cached keys at their own positions, so hiding entries is all a branch needs.

One more row of the same batch records the *tail*: the draft's continuation of the target's
whole path, fed the path's last token. A round that drafts past the target's end token (its
run accepted to the end) reads it live, and the replay reads it there (``simlab.trace.replay``).
It is stored as the rollout at ``pos = n`` (the path's length) from ``step = 0``, so that
step s of every rollout at pos d is the draft at position d + s; at an ordinary divergence
step 0 is the positions table's draft token, and is not stored again.

Rollouts do not end at the draft's own end token: a policy that drafts on past it feeds the
end token back and goes on, and the rollout records what it then reads; a policy that stops
there (``Policy.stops_at_draft_end``) stops reading.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from simlab.models.kv_cache import cache_kwargs
from simlab.record.signals import greedy_stats

# Rows per batched rollout forward; bounds memory when a weak draft diverges everywhere.
MAX_BATCH = 32


@dataclass
class Rollout:
    pos: int  # the divergence position, or the path's length for the tail
    first_step: int  # 1 at a divergence (step 0 is on the true path); 0 for the tail
    tokens: np.ndarray
    conf: np.ndarray
    entropy: np.ndarray


@torch.inference_mode()
def rollouts(
    model,
    cache,
    prompt_len: int,
    positions: list[int],
    first_tokens: list[int],
    steps: int,
    last_token: int,
) -> list[Rollout]:
    """Greedy continuations of ``steps`` tokens after feeding ``first_tokens[i]`` at
    ``positions[i]``, and the tail: ``steps`` tokens after the path's last token ``last_token``.

    ``model`` is the draft (or a :func:`~simlab.record.forward.truncated` target); ``cache``
    its teacher-forced cache of the prompt and the target's path but its last token, which is
    left unchanged.
    """
    n = cache.get_seq_length() - prompt_len + 1  # the path's length
    positions, first_tokens = [*positions, n - 1], [*first_tokens, last_token]
    out: list[Rollout] = []
    for lo in range(0, len(positions), MAX_BATCH):
        out += _batch(model, cache, prompt_len, positions[lo : lo + MAX_BATCH], first_tokens[lo : lo + MAX_BATCH],
                      steps)
    tail = out.pop()
    return [*out, Rollout(n, 0, tail.tokens, tail.conf, tail.entropy)]


def _batch(model, cache, prompt_len, positions, first_tokens, steps) -> list[Rollout]:
    b = len(positions)
    device = model.device
    branch = copy.deepcopy(cache)
    branch.batch_repeat_interleave(b)
    cached = branch.get_seq_length()
    start = torch.tensor(positions, device=device) + prompt_len  # first hidden cache index per row
    mask = (torch.arange(cached, device=device).unsqueeze(0) < start.unsqueeze(1)).long()
    token = torch.tensor(first_tokens, device=device).unsqueeze(1)
    stats = []
    for j in range(steps):
        mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype, device=device)], dim=1)
        out = model(
            input_ids=token,
            attention_mask=mask,
            position_ids=(start + j).unsqueeze(1),
            **cache_kwargs(model, branch),
            use_cache=True,
        )
        step = greedy_stats(out.logits[:, -1])
        stats.append(step)
        token = torch.from_numpy(step.token).to(device).unsqueeze(1)
    tokens = np.stack([s.token for s in stats], axis=1)
    conf = np.stack([s.conf for s in stats], axis=1)
    ent = np.stack([s.entropy for s in stats], axis=1)
    return [Rollout(pos, 1, tokens[i], conf[i], ent[i]) for i, pos in enumerate(positions)]

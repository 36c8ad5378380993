"""One model's KV cache over a batch of sequences of different lengths, left-padded.

Speculative decoding of B requests at once leaves every row of the batch at its own length:
each request accepts its own number of drafts per round. A transformers KV cache has one
length for the whole batch, so this class keeps the rows *right-aligned* in it: row i's
``n[i]`` cached tokens are its last ``n[i]`` positions, the positions before them are padding,
and a boolean ``mask`` (B × length) says which entries are real. A forward then takes

- the attention mask: ``mask`` followed by the new tokens' own (each row's new tokens are
  right-aligned in the chunk, so a row that feeds fewer tokens is padded on the left of it);
- position ids: row i's new tokens sit at positions ``n[i], n[i] + 1, ...`` whatever padding
  precedes them, which is what makes a padded row compute what it would alone (rotary
  embeddings see true positions; masked entries get zero attention weight).

After a verification each row keeps only its accepted prefix (:meth:`keep`): the rejected
drafts at the end of its entries, and any padding a forward left inside the row, are masked
out and the rows are *compacted* — one gather per layer moves every row's real entries to the
end again, and the cache shrinks to the longest row. The cache therefore holds exactly what
each request's single-sequence cache would hold, plus left padding; no hole survives a round.
(The alternative, per-row cache lengths with a ragged attention kernel, needs paged attention,
which transformers' eager and SDPA paths do not have.)

Prompts are prefilled one row at a time and assembled (:meth:`PaddedCache.prefill`), so that
the first token of every request is exactly what a single-request prefill gives.
"""

from __future__ import annotations

import torch

from simlab.models.kv_cache import cache_kwargs, cache_of


class PaddedCache:
    """A KV cache of B right-aligned rows of a causal LM; see the module docstring."""

    def __init__(self, model, cache, mask: torch.Tensor, pad_id: int = 0):
        self.model = model
        self.cache = cache
        self.mask = mask  # (B, length) bool: True where an entry is a real token
        self.pad_id = pad_id

    @property
    def n(self) -> list[int]:
        """Tokens each row holds."""
        return self.mask.sum(dim=1).tolist()

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @classmethod
    @torch.inference_mode()
    def prefill(cls, model, prompts: list[list[int]], pad_id: int = 0) -> tuple["PaddedCache", list[torch.Tensor]]:
        """Prefill every prompt alone and assemble the caches; returns the cache and each
        prompt's last-position logits."""
        device = model.device
        caches, last = [], []
        for ids in prompts:
            out = model(input_ids=torch.tensor([ids], device=device), use_cache=True)
            caches.append(cache_of(out))
            last.append(out.logits[0, -1])
        length = max(len(p) for p in prompts)
        mask = torch.zeros((len(prompts), length), dtype=torch.bool, device=device)
        for i, ids in enumerate(prompts):
            mask[i, length - len(ids):] = True
        cache = caches[0]
        for layer, entries in enumerate(cache.layers):
            entries.keys = torch.cat([_left_pad(c.layers[layer].keys, length) for c in caches])
            entries.values = torch.cat([_left_pad(c.layers[layer].values, length) for c in caches])
        return cls(model, cache, mask, pad_id), last

    @torch.inference_mode()
    def feed(self, feeds: list[list[int]]) -> list[torch.Tensor]:
        """One forward: row i brings ``feeds[i]`` (possibly none). Returns each row's logits for
        the tokens it fed, (len(feeds[i]), vocabulary)."""
        device = self.mask.device
        width = max(len(f) for f in feeds)
        rows = len(feeds)
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long, device=device)
        chunk = torch.zeros((rows, width), dtype=torch.bool, device=device)
        n = self.n
        positions = torch.tensor(n, device=device).unsqueeze(1).repeat(1, width)
        for i, f in enumerate(feeds):
            if f:
                ids[i, width - len(f):] = torch.tensor(f, device=device)
                chunk[i, width - len(f):] = True
                positions[i, width - len(f):] = torch.arange(n[i], n[i] + len(f), device=device)
        mask = torch.cat([self.mask, chunk], dim=1)
        out = self.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions,
                         **cache_kwargs(self.model, self.cache), use_cache=True)
        self.cache = cache_of(out)
        self.mask = mask
        return [out.logits[i, width - len(f):] for i, f in enumerate(feeds)]

    @torch.inference_mode()
    def keep(self, lengths: list[int]) -> None:
        """Row i keeps its first ``lengths[i]`` tokens (at most what it holds); then compact."""
        mask = self.mask.clone()
        for i, (have, want) in enumerate(zip(self.n, lengths)):
            if want < have:
                real = torch.nonzero(mask[i]).squeeze(1)
                mask[i, real[want:]] = False
        self._compact(mask)

    @torch.inference_mode()
    def select(self, rows: list[int]) -> None:
        """Keep only these rows (requests that finished leave the batch)."""
        index = torch.tensor(rows, device=self.mask.device)
        for entries in self.cache.layers:
            entries.keys = entries.keys[index]
            entries.values = entries.values[index]
        self._compact(self.mask[index])

    def _compact(self, mask: torch.Tensor) -> None:
        """Move every row's real entries to the end; shrink to the longest row."""
        n = mask.sum(dim=1)
        length = int(n.max())
        aligned = torch.arange(mask.shape[1], device=mask.device) >= mask.shape[1] - n.unsqueeze(1)
        if torch.equal(mask, aligned) and length == mask.shape[1]:
            self.mask = mask
            return
        index = torch.zeros((mask.shape[0], length), dtype=torch.long, device=mask.device)
        for i in range(mask.shape[0]):
            real = torch.nonzero(mask[i]).squeeze(1)
            index[i, length - len(real):] = real
        gather = index[:, None, :, None]
        for entries in self.cache.layers:
            k, v = entries.keys, entries.values
            entries.keys = torch.gather(k, 2, gather.expand(k.shape[0], k.shape[1], length, k.shape[3]))
            entries.values = torch.gather(v, 2, gather.expand(v.shape[0], v.shape[1], length, v.shape[3]))
        self.mask = torch.arange(length, device=mask.device) >= length - n.unsqueeze(1)


def _left_pad(t: torch.Tensor, length: int) -> torch.Tensor:
    """(1, heads, l, dim) -> (1, heads, length, dim) with zeros before (masked, never read)."""
    pad = length - t.shape[2]
    return t if pad == 0 else torch.cat([t.new_zeros((*t.shape[:2], pad, t.shape[3])), t], dim=2)

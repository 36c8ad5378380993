"""Model forwards the recorder needs: one pass over a known path, and early exits.

Teacher forcing: once the target's output path is known, a single forward of a model over
``prompt + path[:-1]`` gives its next-token logits at every generated position (what it would
have predicted given the true prefix), plus a KV cache of the whole path that the divergence
rollouts branch from. This is much cheaper than decoding token by token and, up to float
rounding, identical to it (tests/test_record.py checks that).

Early exit (self-speculative drafting, DEL / LayerSkip): the draft of exit layer l is the
target's first l decoder layers followed by the final norm and the LM head. In transformers,
``hidden_states[l]`` is the residual stream after l layers, except the last entry, which is
already normalised for Llama-style models; :func:`exit_logits` applies the norm to the others only.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from simlab.common.errors import SimlabError
from simlab.models.kv_cache import cache_of


@dataclass
class ForcedPass:
    """One forward over prompt + path[:-1]."""

    logits: torch.Tensor  # (n, V): the model's next-token logits at the n generated positions
    cache: object  # transformers Cache holding prompt + path[:-1]
    hidden: tuple[torch.Tensor, ...] | None  # hidden_states[l] at the n positions, (n, H) each


@torch.inference_mode()
def forced_pass(model, prompt_ids: torch.Tensor, path: torch.Tensor, hidden: bool = False) -> ForcedPass:
    """Teacher-forced forward; ``prompt_ids`` is (1, P), ``path`` the n generated tokens."""
    n = int(path.shape[0])
    ids = torch.cat([prompt_ids[0], path[:-1].to(prompt_ids.device)]).unsqueeze(0)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=n, output_hidden_states=hidden)
    states = tuple(h[0, -n:] for h in out.hidden_states) if hidden else None
    return ForcedPass(logits=out.logits[0], cache=cache_of(out), hidden=states)


def n_layers(model) -> int:
    return int(model.config.num_hidden_layers)


def _decoder(model):
    decoder = model.get_decoder()
    if not (hasattr(decoder, "layers") and hasattr(decoder, "norm")):
        raise SimlabError(
            f"early exit needs a decoder with .layers and .norm (Llama-style); {type(model).__name__} has not"
        )
    return decoder


@torch.inference_mode()
def exit_logits(model, hidden: tuple[torch.Tensor, ...], layer: int) -> torch.Tensor:
    """Logits of exit layer ``layer`` from a forced pass's hidden states."""
    if layer < n_layers(model):
        return exit_head(model, hidden[layer])
    return model.get_output_embeddings()(hidden[layer])


@torch.inference_mode()
def exit_head(model, h: torch.Tensor) -> torch.Tensor:
    """Logits of the hidden states ``h`` (rows, H) taken after a decoder layer short of the
    last: the final norm, then the LM head, as an early-exit draft computes on top of its layers."""
    return model.get_output_embeddings()(_decoder(model).norm(h))


@torch.inference_mode()
def shadow_tokens(model, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 probability (raw softmax) and token of each row of ``h``, hidden states after a
    decoder layer short of the last: that exit layer's shadow tokens at those positions (DEL
    §4.2). The live decoder computes a shadow read with this function, once per exit layer, and
    the latency probe times it (``op = exit_head``), so what is priced is what runs."""
    return torch.softmax(exit_head(model, h).float(), dim=-1).max(dim=-1)


@contextmanager
def truncated(model, layer: int) -> Iterator[object]:
    """The model with only its first ``layer`` decoder layers: the early-exit draft itself.

    Its output logits are exactly :func:`exit_logits` of that layer, and it reads and writes
    only the first ``layer`` entries of a KV cache, so it can continue from a cache the full
    model filled.
    """
    decoder = _decoder(model)
    if not 1 <= layer <= len(decoder.layers):
        raise SimlabError(f"exit layer {layer} is outside 1..{len(decoder.layers)}")
    full = decoder.layers
    decoder.layers = torch.nn.ModuleList(list(full)[:layer])
    try:
        yield model
    finally:
        decoder.layers = full


def first_layers(cache, layer: int):
    """A view of a transformers KV cache that holds only its first ``layer`` layers (their entries
    shared, not copied): all that the :func:`truncated` model of that exit layer reads, so a
    rollout branching from a full model's cache copies ``layer`` layers instead of all of them."""
    view = copy.copy(cache)
    view.layers = cache.layers[:layer]
    return view

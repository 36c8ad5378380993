"""The early-exit draft of self-speculative decoding (LayerSkip, DEL) as a model of its own.

The draft of exit layer l is the target's first l decoder layers, followed by the target's
final norm and LM head (LayerSkip §4, DEL §2; docs/policies/early-exit.md). Built here as a separate module tree
whose leaves *are* the target's modules (no weight is copied), with its own config saying l
layers, so it keeps its own KV cache and can run while the target runs (parallel rounds),
which swapping the target's layers in place could not.
"""

from __future__ import annotations

import copy

from simlab.common.errors import SimlabError


def early_exit_draft(target, layer: int):
    """A causal LM sharing ``target``'s weights that stops after decoder layer ``layer``."""
    decoder = target.get_decoder()
    if not (hasattr(decoder, "layers") and hasattr(decoder, "norm")):
        raise SimlabError(f"early exit needs a Llama-style decoder with .layers and .norm; {type(target).__name__} has not")
    n = len(decoder.layers)
    if not 1 <= layer <= n:
        raise SimlabError(f"exit layer {layer} is outside 1..{n}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layer
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types[:layer])
    new_decoder = copy.copy(decoder)
    new_decoder._modules = dict(decoder._modules)
    new_decoder.layers = type(decoder.layers)(list(decoder.layers)[:layer])
    new_decoder.config = config
    draft = copy.copy(target)
    draft._modules = dict(target._modules)
    for name, value in vars(target).items():  # its own hooks: a hook on the target must not fire for it
        if name.startswith("_") and "hook" in name and isinstance(value, dict):
            setattr(draft, name, type(value)())
    draft.config = config
    draft.generation_config = copy.deepcopy(target.generation_config)  # generate() writes to it
    for name, module in target._modules.items():
        if module is decoder:
            draft._modules[name] = new_decoder
    return draft

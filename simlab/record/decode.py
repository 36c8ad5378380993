"""The target's own output path, produced by ``model.generate``.

Using ``generate`` itself (rather than a loop of our own) makes the recorded path exactly what
a user of transformers gets. Two details make it the *plain* distribution that speculative
decoding preserves: the model's generation config is replaced by a neutral one (a Hub config
may carry a repetition penalty or top-k/top-p that SD does not reproduce), and sampling, when
asked for, disables top-k and top-p. The raw logits of every step come back with the tokens,
so the target's probabilities cost no extra forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Seeds of different prompts must not collide; any prime above the prompt count works.
_SEED_STRIDE = 1_000_003


@dataclass
class Decoded:
    tokens: torch.Tensor  # (n,) generated token ids
    logits: torch.Tensor  # (n, V) raw target logits that produced each token
    stop: str  # "eos" or "length"


def neutralise(model, eos_token_ids: list[int], pad_token_id: int) -> None:
    """Give ``model`` a generation config with no logits processors; greedy by default."""
    from transformers import GenerationConfig

    old = model.generation_config
    model.generation_config = GenerationConfig(
        bos_token_id=old.bos_token_id, eos_token_id=list(eos_token_ids), pad_token_id=pad_token_id, do_sample=False
    )


@torch.inference_mode()
def decode(
    model, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float, seed: int, prompt_id: int
) -> Decoded:
    """Generate from ``prompt_ids`` (1, P): greedy when ``temperature`` is 0, else sampled."""
    sampling = {"do_sample": False}
    if temperature > 0:
        torch.manual_seed(seed * _SEED_STRIDE + prompt_id)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(
        input_ids=prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        max_new_tokens=max_new_tokens,
        output_logits=True,
        return_dict_in_generate=True,
        **sampling,
    )
    tokens = out.sequences[0, prompt_ids.shape[1] :]
    logits = torch.cat(out.logits, dim=0)
    eos = set(model.generation_config.eos_token_id)
    stop = "eos" if int(tokens[-1]) in eos else "length"
    if temperature == 0 and not torch.equal(logits.argmax(dim=-1), tokens):
        raise RuntimeError(
            "generate's greedy tokens are not the argmax of its raw logits: a logits processor is active"
        )
    return Decoded(tokens=tokens, logits=logits, stop=stop)

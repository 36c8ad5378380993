"""Hugging Face assisted generation on the same prompts, for ``simlab live --against-hf``.

``generate(assistant_model=draft)`` with a constant draft length γ and the confidence stop
disabled (``assistant_confidence_threshold=0``: its default of 0.4 would otherwise stop drafts
early; baselines.md §4) is what a user of transformers runs for vanilla SD, so it is the
baseline a lab decoder must be at least as fast as. Target forwards are counted with a
forward hook; times include the prefill, so simlab's figure it is compared with does too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HFRun:
    tokens: list[int]
    seconds: float  # prefill included
    target_calls: int  # decoding forwards (the prefill is not counted)


@torch.inference_mode()
def assisted_generate(target, draft, prompt_ids: list[int], max_new_tokens: int, gamma: int,
                      eos_token_ids: list[int]) -> HFRun:
    calls = []
    hook = target.register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.tensor([prompt_ids], device=target.device)
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    try:
        sync()
        t0 = time.perf_counter()
        out = target.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=draft, do_sample=False,
            max_new_tokens=max_new_tokens, num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant",
            assistant_confidence_threshold=0.0, eos_token_id=list(eos_token_ids),
            pad_token_id=eos_token_ids[0],
        )
        sync()
        seconds = time.perf_counter() - t0
    finally:
        hook.remove()
    return HFRun(out[0, len(prompt_ids):].tolist(), seconds, len(calls) - 1)

"""Hugging Face assisted generation on the same prompts, for ``simlab live --against-hf``
(``pld``: Hugging Face's prompt lookup, ``generate(prompt_lookup_num_tokens=N)``).

``generate(assistant_model=draft)`` with a constant draft length γ and the confidence stop
disabled (``assistant_confidence_threshold=0``: its default of 0.4 would otherwise stop drafts
early; docs/policies/hf.md) is what a user of transformers runs for vanilla SD, so it is the
baseline a lab decoder must be at least as fast as. Target forwards are counted with a
forward hook; times include the prefill, so simlab's figure it is compared with does too.

transformers reads these settings from the *assistant's* generation config (its
``AssistedCandidateGenerator`` copies ``assistant_model.generation_config``); passed to
``generate`` they would only reach the target's config, leaving the assistant on its defaults
(the "heuristic" schedule, whose draft length also carries over from one call to the next). So
they are set on the assistant for the call and restored after it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from simlab.policies.hf import assistant_settings


@dataclass(frozen=True)
class HFRun:
    tokens: list[int]
    seconds: float  # prefill included
    target_calls: int  # decoding forwards (the prefill is not counted)


@contextlib.contextmanager
def _constant_schedule(draft, gamma: int):
    """The assistant drafts exactly ``gamma`` tokens a round, with no confidence stop."""
    config = draft.generation_config
    wanted = assistant_settings("sd", {"gamma": gamma})
    saved = {key: getattr(config, key, None) for key in wanted}
    for key, value in wanted.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


def assisted_generate(target, draft, prompt_ids: list[int], max_new_tokens: int, gamma: int,
                      eos_token_ids: list[int]) -> HFRun:
    """``generate(assistant_model=draft)`` drafting a constant ``gamma`` tokens a round."""
    with _constant_schedule(draft, gamma):
        return _generate(target, prompt_ids, max_new_tokens, eos_token_ids, assistant_model=draft)


def lookup_generate(target, prompt_ids: list[int], max_new_tokens: int, num_tokens: int, ngram_max: int,
                    eos_token_ids: list[int]) -> HFRun:
    """``generate(prompt_lookup_num_tokens=N, max_matching_ngram_size=ngram_max)``: Hugging Face's
    prompt lookup, the baseline of the ``pld`` policy."""
    return _generate(target, prompt_ids, max_new_tokens, eos_token_ids, prompt_lookup_num_tokens=num_tokens,
                     max_matching_ngram_size=ngram_max)


@torch.inference_mode()
def _generate(target, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: list[int], **assisted) -> HFRun:
    """Greedy ``generate`` with ``assisted`` settings, timed, its target forwards counted."""
    calls = []
    hook = target.register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.tensor([prompt_ids], device=target.device)
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    try:
        sync()
        t0 = time.perf_counter()
        out = target.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=list(eos_token_ids), pad_token_id=eos_token_ids[0], **assisted,
        )
        sync()
        seconds = time.perf_counter() - t0
    finally:
        hook.remove()
    return HFRun(out[0, len(prompt_ids):].tolist(), seconds, len(calls) - 1)

"""The serving flags that ``simlab serve`` and ``simlab sweep --rate`` share: each flag's name and
help are written once here; :func:`option` makes the Typer option, in a help panel of the
command's choosing."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

DEFAULT_REQUESTS = 500

FLAGS = {
    "max_batch": ("--max-batch", "Most requests decoding at once."),
    "token_budget": ("--token-budget", "Prefill tokens plus one per running request allowed in one engine step."),
    "gamma_by_batch": ("--gamma-by-batch", "Batch-level cap on the draft length by batch size, as BATCH:GAMMA pairs, "
                       "e.g. 1:6,4:4,16:0, or a JSON file from simlab serve tune."),
    "sd_off_above": ("--sd-off-above", "No speculation in engine steps with more requests than this."),
    "smartspec": ("--smartspec", "SmartSpec: each step drafts the length in 0..N with the highest expected goodput."),
    "adaptive_verify": ("--adaptive-verify", "vLLM's adaptive verification: every request drafts N, and each step "
                        "verifies only the drafts most likely to be accepted, as many as pay for their verification "
                        "(simulated; vLLM runs it on GPUs only)."),
    "mixed_prefill": ("--mixed-prefill", "Admitted prompts ride in the running requests' verification forward, as "
                      "llama.cpp's llama-server batches them; by default they are prefilled in a forward of their own "
                      "first, as vLLM does."),
    "scheduler": ("--scheduler", "Whose scheduler decides each engine step: simlab's (default), or vllm: vLLM 0.32's "
                  "(running requests then waiting ones in one --token-budget of prompt chunks, decodes and draft "
                  "tokens, --max-batch requests, KV blocks with lookahead slots for drafts, preemption), each step one "
                  "forward priced by its tokens; serves policy vllm (and ad)."),
    "kv_blocks": ("--kv-blocks", "With --scheduler vllm: KV cache blocks of 128 tokens (vLLM's CPU block size); a "
                  "request that finds none free preempts the last running one. Default: enough for every request."),
    "slo_ttft": ("--slo-ttft", "SLO on time to first token, seconds."),
    "slo_tpot": ("--slo-tpot", "SLO on time per output token, seconds."),
    "baseline": ("--baseline/--no-baseline", "Also serve the same load without speculation (policy ad) for the speedup."),
}


def option(name: str, panel: str | None = None):
    flag, text = FLAGS[name]
    return typer.Option(flag, help=text, rich_help_panel=panel)


# serve's own (no panel)
MaxBatch = Annotated[int, option("max_batch")]
TokenBudget = Annotated[int, option("token_budget")]
GammaByBatch = Annotated[Optional[str], option("gamma_by_batch")]
SdOffAbove = Annotated[Optional[int], option("sd_off_above")]
SmartSpec = Annotated[Optional[int], option("smartspec")]
AdaptiveVerify = Annotated[Optional[int], option("adaptive_verify")]
MixedPrefill = Annotated[bool, option("mixed_prefill")]
SchedulerName = Annotated[str, option("scheduler")]
KvBlocks = Annotated[Optional[int], option("kv_blocks")]
SloTtft = Annotated[Optional[float], option("slo_ttft")]
SloTpot = Annotated[Optional[float], option("slo_tpot")]
Baseline = Annotated[bool, option("baseline")]

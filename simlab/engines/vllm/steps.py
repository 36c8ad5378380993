"""vLLM's engine steps, timed in its worker, as the latency samples a trace holds.

What one step of vLLM's speculative decoding does (``vllm/v1/worker/gpu_model_runner.py``,
``execute_model`` then ``sample_tokens``; docs/vllm.md, "One engine step"): the target's forward over
every scheduled token, rejection sampling, and the draft's proposal for the next step — a first
forward over the step's verified tokens plus one slot (K + 2 tokens a request after a
verification, the prompt and one after a prefill), then K − 1 one-token forwards batched over the
requests. simlab prices a serial round as K draft steps and one target forward of K + 1 tokens, so
a step becomes (:func:`latency_rows`):

- ``draft_step`` (k = 1): one of the K − 1 one-token draft iterations — the proposal's time less its
  first forward and that forward's logits, over K − 1;
- ``target_forward`` (k = K + 1): the rest of the step, from its start to the next step's start (so
  the engine core's scheduling and the hand-off to the worker between steps are in it) less K draft
  steps: the target's verification, the sampler, and the draft's first forward beyond one step.
  The draft's catch-up is thus inside the verification, as in a llama.cpp trace, and no round is
  charged one on top (``TableLatency.verify_feeds_draft``);
- ``target_step`` (k = 1), from an engine without speculation: one plain decoding step, start to
  start — the autoregressive baseline;
- ``target_prefill`` (k = the prompt's tokens) and ``draft_prefill``: a step that prefills one
  request alone, the target's part (start to start less the proposal) and the proposal less its
  K − 1 one-token drafts (the draft's forward over the prompt and the first token).

Only steps whose requests all do the same thing are kept: every request decoding K drafts (a
verification of batch B = their number), or one request prefilling its whole prompt; a step that
mixes prompt chunks and decodes, and each batch's last step (no next start), are left out. A
sample's ``context_len`` is its requests' mean computed tokens, to a multiple of :data:`CONTEXT_BIN`.

A verification's sample is a difference of two measured times; on a quiet machine the target's
forward keeps it well above zero, but when other processes slow the draft's one-token forwards
and not the step's others it can come out at or below zero. Such a step was disturbed, not
priced: it is left out and counted (:attr:`Samples.disturbed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median

import pandas as pd

from simlab.engines.vllm.jobs import Batch, Step
from simlab.trace.schema import NO_LAYER

CONTEXT_BIN = 32  # tokens: samples within one bin share a latency point (their median)


def _periods(batch: Batch) -> list[tuple[Step, float]]:
    """(step, seconds to the next step's start) for every step of ``batch`` but its last."""
    steps = sorted(batch.steps, key=lambda s: s.t0)
    return [(s, nxt.t0 - s.t0) for s, nxt in zip(steps, steps[1:])]


def _context(step: Step) -> int:
    computed = [r[2] for r in step.reqs.values()]
    mean = sum(computed) / len(computed)
    return int(round(mean / CONTEXT_BIN) * CONTEXT_BIN)


def _decoding(step: Step, k: int) -> bool:
    """Every request of the step verifies exactly k drafts (1 + k tokens scheduled)."""
    return all(n == 1 + k and spec == k for n, spec, _ in step.reqs.values())


def _prefill(step: Step) -> bool:
    """One request, prefilling its whole prompt (nothing computed before)."""
    (only,) = step.reqs.values() if len(step.reqs) == 1 else (None,)
    return only is not None and only[1] == 0 and only[2] == 0 and only[0] > 1


def draft_iteration(step: Step, k: int) -> float | None:
    """One of the step's K − 1 one-token draft iterations (None for K = 1 or a step without drafts)."""
    if k < 2 or not step.draft or not step.draft_logits:
        return None
    first = step.draft[0][1] + step.draft_logits[0][1]
    return (step.propose - first) / (k - 1)


@dataclass(frozen=True)
class Samples:
    table: pd.DataFrame  # latency samples, the trace schema's columns
    disturbed: int  # steps left out because a derived time came out at or below zero


def latency_rows(speculative: Mapping[int, Iterable[Batch]], plain: Iterable[Batch] = ()) -> Samples:
    """Latency samples (trace schema) from engines with speculation, by K, and one without."""
    rows: list[dict] = []
    disturbed = 0
    draft_steps: dict[tuple[int, int], list[float]] = {}  # (batch, context) -> iterations, for K = 1
    later: list[tuple[Step, float, int]] = []

    def add(op: str, k: int, ctx: int, batch: int, seconds: float) -> None:
        nonlocal disturbed
        if seconds <= 0:
            disturbed += 1
            return
        rows.append({"op": op, "k": k, "context_len": ctx, "layer": NO_LAYER, "corun": False, "batch": batch,
                     "seconds": seconds})

    for k, batches in sorted(speculative.items()):
        for batch in batches:
            for step, period in _periods(batch):
                b, ctx = len(step.reqs), _context(step)
                if _decoding(step, k):
                    d1 = draft_iteration(step, k)
                    if d1 is None:
                        later.append((step, period, k))
                        continue
                    draft_steps.setdefault((b, ctx), []).append(d1)
                    add("draft_step", 1, ctx, b, d1)
                    add("target_forward", k + 1, ctx, b, period - k * d1)
                elif _prefill(step) and step.draft:
                    d1 = draft_iteration(step, k) or 0.0
                    n = next(iter(step.reqs.values()))[0]
                    add("target_prefill", n, 0, 1, period - step.propose)
                    add("draft_prefill", n, 0, 1, step.propose - (k - 1) * d1)
    for step, period, k in later:  # K = 1 engines run no one-token draft: their draft step is the others'
        known = draft_steps.get((len(step.reqs), _context(step)))
        if known:
            add("target_forward", k + 1, _context(step), len(step.reqs), period - k * median(known))
    for batch in plain:
        for step, period in _periods(batch):
            if _decoding(step, 0):
                add("target_step", 1, _context(step), len(step.reqs), period)
    table = pd.DataFrame(rows, columns=["op", "k", "context_len", "layer", "corun", "batch", "seconds"])
    table["repeat"] = table.groupby(["op", "k", "context_len", "batch"]).cumcount()
    return Samples(table, disturbed)


def scatter(table: pd.DataFrame) -> pd.DataFrame:
    """Per latency point with several samples: their count, median and how far they spread
    (interquartile range and max − min, as fractions of the median)."""
    g = table.groupby(["op", "k", "batch", "context_len"])["seconds"]
    out = g.agg(samples="count", median="median", q25=lambda s: s.quantile(0.25), q75=lambda s: s.quantile(0.75),
                low="min", high="max").reset_index()
    out["iqr_share"] = (out["q75"] - out["q25"]) / out["median"]
    out["range_share"] = (out["high"] - out["low"]) / out["median"]
    return out[out["samples"] > 1].drop(columns=["q25", "q75", "low", "high"]).reset_index(drop=True)


__all__ = ["CONTEXT_BIN", "Samples", "latency_rows", "scatter", "draft_iteration"]

"""Serving under vLLM's synthetic acceptance: the trace's prompts and latencies, acceptance imposed.

vLLM's ``rejection_sample_method: "synthetic"`` (vLLM 0.32.0: ``vllm/config/speculative.py``,
``SpeculativeConfig._resolve_synthetic_acceptance_rates``; ``vllm/v1/sample/rejection_sampler.py``,
``rejection_greedy_sample_kernel`` with SYNTHETIC_MODE; :func:`simlab.policies.vllm.synthetic_rates`)
runs the target's forward, the draft's proposal and the sampler as always, then accepts draft
position i of a step with the conditional rate c_i = p_i / p_{i-1} on a fresh uniform draw, whatever
the drafted token is. A step's accepted count A therefore has P(A >= i) = p_i, independent of the
tokens and of every other step, and the only thing left of the model pair is its cost: a check of
the scheduler and the step prices with acceptance taken out of the question.

The prediction serves the same engine as any ``simlab serve --scheduler vllm`` run, on
:func:`profile_trace`: each prompt of the trace (its length, its token ids) with ``max_tokens``
positions and K past its end (the last step's drafts, which vLLM verifies and counts there), the
trace's latencies, and the draft path's accepted runs replaced (:func:`impose`) by one draw of A per
position: a step starting at position t accepts ``min(A_t, its drafts)``. Steps start at distinct
positions, so every step gets a draw of its own with vLLM's distribution; the draws are not vLLM's
(its are ``torch.rand`` on its own generator), so one run is predicted in distribution: the
counters by their expectation and spread (:func:`counter_moments`), the times by their mean and
range over ``draws`` imposed profiles.

The requests' lengths are ``max_tokens`` exactly: under synthetic acceptance the output is not the
target's greedy path (an accepted draft token is kept even where the target disagrees), so where its
end token falls is not in the trace; ``simlab vllm serve`` sends ``ignore_eos`` with such a profile.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from simlab.trace.replay import PromptReplay
from simlab.trace.schema import POSITION_COLUMNS
from simlab.trace.tables import Trace

FILLER_TOKEN = 0  # the positions' token: one the draft always "matches" (the runs are imposed anyway), no end token


def profile_trace(trace: Trace, max_tokens: int, k: int) -> Trace:
    """``trace``'s prompts and latencies with ``max_tokens`` positions each and ``k`` past the end
    (module docstring); its own positions, rollouts and exit layers are dropped."""
    prompts = trace.prompts.sort_values("prompt_id").reset_index(drop=True)
    prompts = prompts.assign(n_tokens=max_tokens, stop="length")

    def rows(first: int, count: int) -> pd.DataFrame:
        n = len(prompts) * count
        cols = {c: np.zeros(n) for c in POSITION_COLUMNS}
        cols.update(prompt_id=np.repeat(prompts["prompt_id"].to_numpy(), count),
                    pos=np.tile(np.arange(first, first + count), len(prompts)),
                    target_token=np.full(n, FILLER_TOKEN), draft_token=np.full(n, FILLER_TOKEN),
                    draft_conf=np.ones(n), q_target=np.ones(n), p_target=np.ones(n), p_draft=np.ones(n),
                    accept_prob=np.ones(n))
        return pd.DataFrame(cols)

    manifest = replace(trace.manifest, max_new_tokens=max_tokens, temperature=0.0, topk=0, tree_depth=0,
                       exit_layers=[], notes=f"{trace.manifest.notes} | synthetic acceptance: the trace's prompts "
                       "and latencies, acceptance imposed (simlab.serve.synthetic)")
    return Trace(manifest=manifest, prompts=prompts, positions=rows(0, max_tokens),
                 rollouts=trace.rollouts.iloc[:0], latency=trace.latency, past_end=rows(max_tokens, k))


def draw_accepted(rates: list[float], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` independent draws of a step's accepted count A, P(A >= i) = rates[i - 1]: one uniform
    u each, A = #{i: u < p_i} (the rates do not increase)."""
    p = np.asarray(rates, dtype=float)
    return (rng.random(n)[:, None] < p[None, :]).sum(axis=1)


def impose(prompts: list[PromptReplay], rates: list[float], rng: np.random.Generator) -> list[PromptReplay]:
    """Copies of ``prompts`` whose draft accepts ``A_t`` drafts from every position t (module docstring)."""
    out = []
    for p in prompts:
        run = draw_accepted(rates, len(p.draft.run), rng).tolist()
        draft = replace(p.draft, run=run, accept=[a > 0 for a in run])  # __post_init__ rebuilds its lists
        out.append(replace(p, draft=draft))
    return out


def steps_moments(rates: list[float], tokens: int) -> tuple[float, float]:
    """Mean and variance of the steps S a request takes to output ``tokens`` tokens (the prefill's
    first, then A + 1 a step, the last step's acceptances past the end counted), exactly."""
    p = np.asarray([1.0, *rates, 0.0])
    pmf = p[:-1] - p[1:]  # P(A = a), a = 0..K
    first = [0.0] * (tokens + 1)
    second = [0.0] * (tokens + 1)
    for r in range(1, tokens + 1):  # r tokens still to output after the prefill's
        m1 = m2 = 0.0
        for a, q in enumerate(pmf):
            rest = max(r - a - 1, 0)
            m1 += q * (1 + first[rest])
            m2 += q * (1 + 2 * first[rest] + second[rest])
        first[r], second[r] = m1, m2
    r = tokens - 1
    return first[r], second[r] - first[r] ** 2


def counter_moments(rates: list[float], lengths: list[int], k: int, draws: int = 4000, seed: int = 0) -> dict:
    """vLLM's spec-decode counters over requests of ``lengths`` tokens: the expectation of each
    (exact: E[drafts] from :func:`steps_moments`, the rest by Wald's identity, E[accepted at i] =
    E[drafts] p_i) and its standard deviation (exact for the drafts, from ``draws`` simulated
    loads for the others)."""
    mean_steps = var_steps = 0.0
    for n in lengths:
        m, v = steps_moments(rates, n)
        mean_steps += m
        var_steps += v
    per_pos = [mean_steps * p for p in rates]
    mean = {"num_drafts": mean_steps, "num_draft_tokens": k * mean_steps, "num_accepted_tokens": sum(per_pos),
            "num_accepted_tokens_per_pos": per_pos}
    sim = simulate_counters(rates, lengths, draws, np.random.default_rng(seed))
    sd = {"num_drafts": math.sqrt(var_steps), "num_draft_tokens": k * math.sqrt(var_steps),
          "num_accepted_tokens": float(sim["accepted"].std()),
          "num_accepted_tokens_per_pos": [float(x) for x in sim["per_pos"].std(axis=0)]}
    return {"mean": mean, "sd": sd, "draws": draws}


def simulate_counters(rates: list[float], lengths: list[int], draws: int, rng: np.random.Generator) -> dict:
    """``draws`` loads' counters, each request stepping until its length is output (vectorised over draws)."""
    k = len(rates)
    steps = np.zeros(draws)
    per_pos = np.zeros((draws, k))
    for n in lengths:
        committed = np.ones(draws, dtype=np.int64)
        active = committed < n
        while active.any():
            a = draw_accepted(rates, int(active.sum()), rng)
            steps[active] += 1
            per_pos[active] += (a[:, None] > np.arange(k)[None, :])
            committed[active] += a + 1
            active = committed < n
    return {"drafts": steps, "per_pos": per_pos, "accepted": per_pos.sum(axis=1)}


__all__ = ["profile_trace", "impose", "draw_accepted", "steps_moments", "counter_moments", "simulate_counters"]

"""``simlab serve --live``: a batch decoded for real beside ``serve``'s prediction for it.

The batch is the trace's first B prompts (prompt_id order), all arriving at t = 0 and decoding
together (``--max-batch`` B), with the trace's own prompt token ids, so live and simulated
runs serve the same requests. The prediction is ``serve`` on the same arrivals, with every
prompt admitted in the first step (the token budget is raised to cover them, as the live
decoder prefills them all before decoding) and the trace cut to ``budget`` tokens per prompt
(:func:`cut_trace`). The live side (:class:`~simlab.live.batched.BatchedDecoder`) decodes
the batch under the policy and without speculation (``ad``), alternating them ``repeats``
times so that a slow minute of a shared machine hits both; TPOT and throughput are those of
the decode phase (after the prefills), which is what ``serve`` prices from its latency model.
A short warm-up decode of the batch under the policy runs first and is not counted (as
``simlab live``'s, :data:`simlab.live.decoding.WARMUP_TOKENS` tokens per request): the first
forwards of a process touch the weights' pages and grow the allocator's pools, and on the Qwen
pair the first of three 4-token batch-2 ``sd`` decodes ran at 1.43 tokens/s where the next two
ran at 2.74 and 3.53 (2026-11-25, this project's 2-core CPU box, a mutation job on the other core).

Greedy traces only: each request's live tokens are checked against the trace's (the target's
greedy ``generate``, recorded) — the per-request losslessness check.

With ``--reprobe``, :func:`reprobe` times the forwards the batch will run (the target over k
tokens of B sequences, the draft's step of B sequences) again in the decoding process, just
before them (:mod:`simlab.record.reprobe` says why), and the prediction is made from them
before the first counted decode. Each decode's row says how much of the CPU other processes took during it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np
import pandas as pd

from simlab.common.cpu_load import OtherLoad
from simlab.common.errors import SimlabError
from simlab.record.reprobe import probe_here
from simlab.serve.run import BASELINE_POLICY, ServeConfig, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.sim.run import Simulator
from simlab.trace.io import Trace


def cut_trace(trace: Trace, budget: int) -> Trace:
    """The trace as if recorded with ``max_new_tokens = budget`` (a prompt longer than that
    stops at the budget)."""
    if budget >= trace.manifest.max_new_tokens:
        return trace

    def rows(df: pd.DataFrame | None) -> pd.DataFrame | None:
        return None if df is None else df[df["pos"] < budget].reset_index(drop=True)

    prompts = trace.prompts.copy()
    cut = prompts["n_tokens"] > budget
    prompts.loc[cut, "stop"] = "length"
    prompts["n_tokens"] = prompts["n_tokens"].clip(upper=budget)
    manifest = replace(trace.manifest, max_new_tokens=budget)
    return replace(trace, manifest=manifest, prompts=prompts, positions=rows(trace.positions),
                   rollouts=rows(trace.rollouts), layers=rows(trace.layers))


def reprobe(trace: Trace, executor, batch: int, spec: str, log: Callable[[str], None] = lambda _: None
            ) -> tuple[pd.DataFrame, float | None]:
    """Latency samples of ``spec``'s k values and contexts (``simlab record --latency-probe``
    grammar; its batch axis is ``batch``, co-running, trees and exit heads left out) at batch
    size ``batch``, timed in this process (:func:`~simlab.record.reprobe.probe_here`); and the
    share of the CPU other processes took meanwhile."""
    from simlab.record.latency import ProbePlan

    plan = ProbePlan.parse(spec)
    ks = plan.ks
    plan = replace(plan, batches=(batch,), ks=ks if batch == 1 else (), batch_ks=ks if batch > 1 else (),
                   corun=False, trees=(), exit_heads=())
    return probe_here(trace, executor, plan, log)


def predicted(sim: Simulator, n: int, policy: str, params: dict[str, Any]) -> dict:
    """``serve``'s figures for the first ``n`` prompts arriving at once in one batch."""
    lens = [p.prompt_len for p in sim.replay.prompts[:n]]
    config = ServeConfig(policy, params, Scheduler(n, sum(lens) + n))
    run = serve_once(sim, [0.0] * n, config, policy, params)
    start = min(r.first_token for r in run.requests)
    tokens = sum(r.replay.n_tokens - 1 for r in run.requests)
    tpot = [(r.finish - r.first_token) / (r.replay.n_tokens - 1) for r in run.requests if r.replay.n_tokens > 1]
    return {"tokens_per_s": tokens / (max(r.finish for r in run.requests) - start), "tpot_s": float(np.mean(tpot)),
            "target_calls": [r.counts.target_calls for r in run.requests]}


def check(trace: Trace, executor, policy: str, params: dict[str, Any], batch: int, budget: int, repeats: int,
          latency=None, log: Callable[[str], None] = lambda _: None) -> pd.DataFrame:
    """One row per live decode (policy and ``ad``, ``repeats`` each, alternating), with the
    prediction beside it."""
    from simlab.live.batched import BatchedDecoder
    from simlab.live.decoding import WARMUP_TOKENS
    from simlab.policies import make_policy

    if trace.manifest.temperature != 0:
        raise SimlabError("serve --live checks a greedy trace (temperature 0): its tokens are the reference")
    if batch > trace.n_prompts:
        raise SimlabError(f"--max-batch {batch} is more than the trace's {trace.n_prompts} prompts")
    trace = cut_trace(trace, budget)
    sim = Simulator(trace, latency)
    context = sim.context()
    prompts = trace.prompts.sort_values("prompt_id").head(batch)
    ids = [(int(p.prompt_id), [int(t) for t in p.prompt_token_ids]) for p in prompts.itertuples()]
    truth = {pid: g.sort_values("pos")["target_token"].tolist() for pid, g in trace.positions.groupby("prompt_id")}
    rows = []
    for name, kw in ((policy, params), (BASELINE_POLICY, {})):
        pred = predicted(sim, batch, name, kw)
        for repeat in range(repeats):
            rows.append({"policy": name, "repeat": repeat, "pred": pred, "kw": kw})
    order = [r for pair in zip(rows[:repeats], rows[repeats:]) for r in pair]  # policy, ad, policy, ad...
    warm = BatchedDecoder(executor).run([make_policy(policy, context, **params) for _ in ids], ids,
                                        min(WARMUP_TOKENS, budget))
    log(f"B={batch} warm-up (not counted): {policy}, {warm.tokens} tokens in {warm.prefill_s + warm.wall_s:.1f} s")
    out = []
    for row in order:
        name, kw = row["policy"], row["kw"]
        load = OtherLoad()
        run = BatchedDecoder(executor).run([make_policy(name, context, **kw) for _ in ids], ids, budget)
        other = load.share()
        pred = row["pred"]
        tpot = float(np.nanmean([r.tpot for r in run.requests]))
        lossless = all(r.tokens == truth[r.prompt_id][:len(r.tokens)] and len(r.tokens) == len(truth[r.prompt_id])
                       for r in run.requests)
        calls = [r.counts.target_calls for r in run.requests]
        out.append({"batch": batch, "policy": name, "repeat": row["repeat"],
                    "measured_tokens_per_s": run.tokens_per_s, "predicted_tokens_per_s": pred["tokens_per_s"],
                    "measured_tpot_s": tpot, "predicted_tpot_s": pred["tpot_s"],
                    "target_calls": sum(calls), "target_calls_equal": calls == pred["target_calls"],
                    "lossless": lossless, "tokens": run.tokens, "decode_s": run.wall_s, "prefill_s": run.prefill_s,
                    "other_cpu": other})
        log(f"B={batch} {name} #{row['repeat'] + 1}: {run.tokens_per_s:.2f} tok/s (predicted "
            f"{pred['tokens_per_s']:.2f}), TPOT {1e3 * tpot:.0f} ms (predicted {1e3 * pred['tpot_s']:.0f}), "
            f"lossless {lossless}, target calls as simulated {calls == pred['target_calls']}, other processes "
            f"{'?' if other is None else f'{other:.0%}'} of the CPU")
    return pd.DataFrame(out)


def load_executor(trace: Trace):
    """The trace's target and draft (a model, or an early exit of the target) on the CPU, fp32."""
    from simlab.live.executor import LiveExecutor
    from simlab.models.early_exit import early_exit_draft
    from simlab.models.load import load_model, resolve

    m = trace.manifest
    if m.device != "cpu" or m.dtype != "float32":
        raise SimlabError(f"serve --live runs on the CPU in float32; the trace was recorded on {m.device} in {m.dtype}")
    target = load_model(resolve(m.target_model), "cpu", "float32")
    draft = early_exit_draft(target, m.draft_layer) if m.draft_layer >= 0 else load_model(resolve(m.draft_model), "cpu", "float32")
    return LiveExecutor(draft, target, list(m.eos_token_ids))

"""llama.cpp's ``llama-server`` with B parallel slots measured against ``simlab serve``.

The prediction comes first, from a trace recorded earlier with llama.cpp as the engine
(``simlab llama-cpp record``, with a batch axis for B > 1): ``serve`` with the ``llama-cpp``
policy under the run's ``--draft-max``, ``--draft-min`` and ``--draft-p-min``, the trace's
first B prompts (cycled when B is larger) arriving together at t = 0 into B slots, every prompt
prefilled in the first step. Then a real ``llama-server`` with ``-np B`` gets the same prompts
at once from :func:`simlab.engines.llama_cpp.server.send`, after a short uncounted warm-up burst
(``simlab llama-cpp serve`` runs rounds over the batch sizes, a fresh server each).

Spread arrivals (``arrivals``: request i, the trace's prompt i mod N, arrives at ``arrivals[i]``
seconds) put the same B slots under a load generator's schedule instead: a request that arrives
while others decode joins their next step, its prompt in the same target forward as their
verification, as ``llama-server`` batches it; ``serve`` predicts that with its mixed scheduler
(:mod:`simlab.serve.scheduler`), at most :data:`N_BATCH` tokens a step. Per request, the time to
its first token (TTFT) and to its answer (end to end) are compared beside the counts.

Two conventions differ from ``llama-speculative-simple`` (:func:`server_view`): the server
prefills the whole prompt and samples its first token from that prefill, so the trace is read
with the prompt one token longer and position 0 the first generated token; and its end of
generation is simlab's budget rule (a slot drafts at most ``n_remaining - 1`` tokens, and
stops at ``n_predict`` generated tokens), so the policy runs without ``n_predict``.

The speedup's baseline (``--baseline``): the same bursts into a ``llama-server`` that runs the
target alone (no ``-md``: llama.cpp's plain decoding), predicted by ``serve`` with the ``ad``
policy, whose steps are the trace's ``target_step`` samples (the trace tool times the target's
one-token step without the draft that llama.cpp's verification runs beside it).

Compared per request: ``tokens`` (the server's ``predicted_n``, the first token included),
``drafted`` (``draft_n``: drafts the target verified) and ``accepted`` (``draft_n_accepted``),
and where its tokens left the trace's path; per burst: the decode phase's tokens/s (tokens after
each request's first, over the time from the first first-token to the last answer), which is
what ``serve`` prices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from simlab.common.cpu_load import OtherLoad
from simlab.common.errors import SimlabError
from simlab.engines.llama_cpp.args import ModelPair
from simlab.engines.llama_cpp.server import Answer, Drafting, running, send
from simlab.latency.batch import BatchLatency
from simlab.live.decoding import WARMUP_TOKENS
from simlab.live.serve import cut_trace
from simlab.serve.run import BASELINE_POLICY, ServeConfig, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.sim.run import Simulator
from simlab.trace.io import Trace

POLICY = "llama-cpp"
# simlab's name -> the server's (Answer's) counter
COUNTERS = {"tokens": "predicted_n", "drafted": "draft_n", "accepted": "draft_n_accepted"}
CONTEXT_ROUND = 64  # slot contexts are rounded up to this many tokens
# First tokens closer than this came from one step. A burst admitted over two steps puts a whole
# prefill step between them (hundreds of ms for these prompts on a CPU); the answers of one
# step reach the client up to ~15 ms apart at B = 8 (measured: 9 and 15 ms, Qwen pair).
SAME_STEP_S = 0.05
BURST_TRIES = 5
N_BATCH = 2048  # llama-server's default -b: the most tokens one step's batch takes


def server_view(trace: Trace, n_predict: int) -> Trace:
    """The trace as ``llama-server`` decodes it, cut to ``n_predict`` generated tokens.

    A llama.cpp trace follows ``llama-speculative-simple``: the prompt's last token is position 0
    and is fed by the first round. The server prefills it with the rest and samples the trace's
    position 1 from the prefill, so here the prompt is one token longer and every position one
    less (the rollouts too)."""
    if trace.manifest.extra.get("engine") != "llama.cpp":
        raise SimlabError("llama-server is predicted on a trace from `simlab llama-cpp record`")
    prompts = trace.prompts.copy()
    prompts["prompt_len"] += 1
    prompts["n_tokens"] -= 1
    short = prompts[(prompts["n_tokens"] < n_predict) & (prompts["stop"] != "eos")]
    if len(short):
        raise SimlabError(f"-n {n_predict} needs a trace of at least {n_predict + 1} positions per prompt; "
                          f"{short.iloc[0]['source']} has {int(short.iloc[0]['n_tokens']) + 1}")

    def shifted(df: pd.DataFrame | None) -> pd.DataFrame | None:
        if df is None:
            return None
        df = df[df["pos"] >= 1].copy()
        df["pos"] -= 1
        return df.reset_index(drop=True)

    # the recording's budget, one less (at least the longest prompt's, for a trace that states none)
    budget = max(trace.manifest.max_new_tokens - 1, int(prompts["n_tokens"].max()))
    manifest = replace(trace.manifest, max_new_tokens=budget)
    view = replace(trace, manifest=manifest, prompts=prompts, positions=shifted(trace.positions),
                   rollouts=shifted(trace.rollouts), layers=shifted(trace.layers))
    return cut_trace(view, n_predict)


def policy_of(drafting: Drafting | None) -> tuple[str, dict]:
    """The policy that predicts a server with these drafting rules (None: no draft model, ``ad``)."""
    if drafting is None:
        return BASELINE_POLICY, {}
    return POLICY, {"draft_max": drafting.draft_max, "draft_min": drafting.draft_min, "p_min": drafting.p_min}


def predict(view: Trace, batch: int, drafting: Drafting | None,
            arrivals: Sequence[float] | None = None) -> tuple[pd.DataFrame, dict]:
    """``serve``'s prediction for a burst of ``batch`` requests into ``batch`` slots (or, with
    ``arrivals``, for requests arriving then into ``batch`` slots): one row per request, and the
    run's figures (tokens/s, and the rule that priced the batched steps). ``drafting`` None: the
    server runs the target alone (:func:`policy_of`)."""
    sim = Simulator(view)
    policy, params = policy_of(drafting)
    # llama-server would split a prompt longer than its batch over steps, which the scheduler does not model
    config = ServeConfig(policy, params, Scheduler(batch, N_BATCH, mixed=True,
                                                   budget_name="llama-server's batch (-b; a prompt split over steps "
                                                               "is not predicted)"))
    latency = BatchLatency(sim.latency)
    run = serve_once(sim, [0.0] * batch if arrivals is None else arrivals, config, policy, params, latency=latency)
    rows = pd.DataFrame([{"request": r.request_id, "prompt_id": r.replay.prompt_id, "predicted_tokens": r.replay.n_tokens,
                          "predicted_drafted": r.counts.verified, "predicted_accepted": r.counts.accepted,
                          "predicted_decode_s": r.finish - r.first_token, "predicted_ttft_s": r.first_token - r.arrival,
                          "predicted_e2e_s": r.finish - r.arrival} for r in run.requests])
    start = min(r.first_token for r in run.requests)
    tokens = sum(r.replay.n_tokens - 1 for r in run.requests)
    return rows, {"tokens_per_s": tokens / (max(r.finish for r in run.requests) - start), "latency_rule": latency.rule}


def prefill_ks(view: Trace) -> tuple[int, ...]:
    """Forward sizes to time for prefills: powers of two from 16 to the first that covers the
    longest prompt. A prompt is priced between the two that bracket it, as the latency model
    interpolates in k; a probe of k ≤ 9 alone would extrapolate a prompt of hundreds of tokens."""
    longest, ks = int(view.prompts["prompt_len"].max()), [16]
    while ks[-1] < longest:
        ks.append(2 * ks[-1])
    return tuple(ks)


def slot_context(view: Trace, drafting: Drafting | None) -> int:
    """Tokens each slot must hold: the longest prompt, its generation and a last draft beyond it."""
    need = int((view.prompts["prompt_len"] + view.prompts["n_tokens"]).max()) + (drafting.draft_max if drafting else 0) + 2
    return -(-need // CONTEXT_ROUND) * CONTEXT_ROUND


def burst_figures(answers: list[Answer]) -> dict:
    """The decode phase of a burst, as measured: tokens after each request's first over the
    time from the first first-token to the last answer; and how far apart the first tokens
    came (0 when every prompt was prefilled in one step, as predicted)."""
    first = [a.first_token for a in answers]
    tokens = sum(a.predicted_n - 1 for a in answers)
    return {"tokens_per_s": tokens / (max(a.received for a in answers) - min(first)),
            "first_token_spread_s": max(first) - min(first)}


def _percent(share: float | None) -> str:
    return "?" if share is None else f"{share:.0%}"


def measure(binary: Path, pair: ModelPair, view: Trace, batch: int, n_predict: int, drafting: Drafting | None,
            log: Callable[[str], None] = lambda _: None, log_file: Path | None = None,
            arrivals: Sequence[float] | None = None) -> tuple[list[Answer], dict]:
    """One burst of ``batch`` requests of ``n_predict`` tokens on a fresh ``llama-server`` with
    ``batch`` slots, after an uncounted warm-up burst (a fresh process's first forwards touch
    the weights' pages); ``drafting`` None: the target alone. With ``arrivals``, after the same
    warm-up, request i (the trace's prompt i mod N) is sent at ``arrivals[i]`` seconds instead,
    once: spread arrivals need no step to themselves.

    The burst counts only when the server prefilled every prompt in one step, as predicted. The
    requests leave together behind a one-token gate request (:func:`send`), since the server's
    loop starts a step as soon as one request is queued and one that comes a fraction of a
    millisecond later would wait for the next step. A burst whose first tokens still came more
    than :data:`SAME_STEP_S` apart is logged, not counted, and sent again, at most
    :data:`BURST_TRIES` times. The figures include the share of the CPU that processes other
    than this one and the server took meanwhile (``other_cpu``); ``log_file`` keeps the
    server's own log."""
    texts = list(view.prompts["prompt_text"])
    prompts = [texts[i % len(texts)] for i in range(batch)]
    name = policy_of(drafting)[0]
    with running(binary, pair, batch, slot_context(view, drafting), drafting, log_file) as server:

        def timed(requests: list[str], **schedule) -> tuple[list[Answer], dict]:
            load = OtherLoad(pids=[server.pid])
            answers = send(server.url, requests, n_predict, **schedule)
            return answers, {**burst_figures(answers), "other_cpu": load.share()}

        send(server.url, prompts, WARMUP_TOKENS)
        if arrivals is not None:
            what = f"B={batch}, {len(arrivals)} arrivals"
            answers, figures = timed([texts[i % len(texts)] for i in range(len(arrivals))], at=arrivals)
        else:
            what = f"B={batch} burst"
            for attempt in range(1, BURST_TRIES + 1):
                answers, figures = timed(prompts, gate=prompts[0])
                spread = figures["first_token_spread_s"]
                if batch == 1 or spread <= SAME_STEP_S:
                    break
                log(f"{name} {what}: first tokens {1e3 * spread:.0f} ms apart (prompts prefilled in more than one "
                    f"step), not counted ({figures['tokens_per_s']:.2f} tokens/s); try {attempt}")
            else:
                raise SimlabError(f"{BURST_TRIES} bursts of {batch} requests in a row were not prefilled in one step")
    log(f"{name} {what}: {figures['tokens_per_s']:.2f} tokens/s (other processes {_percent(figures['other_cpu'])} "
        "of the CPU)")
    return answers, figures


def speedups(bursts: list[dict]) -> list[dict]:
    """Per batch size and round, the speculative server's tokens/s over the plain one's, measured
    (the two bursts ran one after the other) and predicted."""
    plain = {(r["batch"], r["repeat"]): r for r in bursts if r["policy"] == BASELINE_POLICY}
    out = []
    for r in bursts:
        base = plain.get((r["batch"], r["repeat"]))
        if r["policy"] == BASELINE_POLICY or base is None:
            continue
        measured = r["measured_tokens_per_s"] / base["measured_tokens_per_s"]
        predicted = r["predicted_tokens_per_s"] / base["predicted_tokens_per_s"]
        out.append({"batch": r["batch"], "repeat": r["repeat"], "measured_speedup": round(measured, 4),
                    "predicted_speedup": round(predicted, 4), "error_speedup": round(predicted / measured - 1.0, 4)})
    return out


def greedy_paths(view: Trace) -> dict[int, list[int]]:
    """Each prompt's tokens as the trace recorded them (the target's greedy path), from the
    server's first generated token on."""
    pos = view.positions.sort_values(["prompt_id", "pos"])
    return {int(pid): g["target_token"].astype(int).tolist() for pid, g in pos.groupby("prompt_id")}


def first_divergence(tokens: tuple[int, ...], path: list[int]) -> int:
    """The first position where the server's tokens leave the recorded path; -1 if they never do."""
    for i, (a, b) in enumerate(zip(tokens, path)):
        if a != b:
            return i
    return -1 if len(tokens) == len(path) else min(len(tokens), len(path))


def compare(predicted: pd.DataFrame, answers: list[Answer], paths: dict[int, list[int]]) -> pd.DataFrame:
    """Measured beside predicted, one row per request, with ``match_*`` and where the request's
    tokens first left the trace's greedy path (``diverged_at``, -1: never): a count that does
    not match with ``diverged_at`` -1 is a draft that decided otherwise on the same path.
    ``measured_ttft_s`` and ``measured_e2e_s`` run from when the client sent the request (in a
    burst, that includes the gate request's step, which the prediction does not have)."""
    measured = pd.DataFrame([{"request": a.index, **{f"measured_{k}": getattr(a, field) for k, field in COUNTERS.items()},
                              "measured_decode_s": a.predicted_ms / 1e3, "measured_ttft_s": a.first_token - a.sent,
                              "measured_e2e_s": a.received - a.sent, "measured_prompt_n": a.prompt_n,
                              "stop_type": a.stop_type} for a in answers])
    table = predicted.merge(measured, on="request", how="left")
    tokens = {a.index: a.tokens for a in answers}
    table["diverged_at"] = [first_divergence(tokens[r], paths[p]) for r, p in zip(table["request"], table["prompt_id"])]
    for k in COUNTERS:
        table[f"match_{k}"] = table[f"measured_{k}"] == table[f"predicted_{k}"]
    return table


def latency_figures(table: pd.DataFrame) -> dict:
    """A run's mean TTFT and end-to-end latency, measured and predicted, and the prediction's
    error on each (predicted / measured - 1), from :func:`compare`'s table."""
    out = {}
    for what in ("ttft", "e2e"):
        measured, predicted = table[f"measured_{what}_s"].mean(), table[f"predicted_{what}_s"].mean()
        out.update({f"measured_{what}_mean_s": round(float(measured), 4), f"predicted_{what}_mean_s": round(float(predicted), 4),
                    f"error_{what}_mean": round(float(predicted / measured - 1.0), 4)})
    return out

"""vLLM's speculative decoding measured against simlab's prediction of it (``simlab vllm run``).

The prediction comes first (:func:`predict`, written to the run's folder before vLLM starts): the
policy that is the method's rule (:class:`~simlab.policies.vllm.Method`: ``vllm`` for
``draft_model``, ``ngram`` and ``suffix`` with ``vllm_end`` for vLLM's two lookup proposers)
simulated on the trace with the run's settings and ``max_tokens`` gives, per request, every step's
drafted and accepted counts (a step whose lookup proposed nothing is a (0, 0) step), vLLM's
counters, the output tokens and the decode time, and the plain-decoding time of the same tokens.
Then vLLM runs the trace's prompts (their recorded token ids) with that speculation and,
alternating with it, without speculation (:func:`measure`), each engine in its own process (the
models do not fit twice beside each other in this machine's memory), and :func:`compare` puts
both side by side. A request's measured steps are read from the worker's step log (the drafts
scheduled in each of its decoding steps, empty proposals included), with the acceptances of
vLLM's ``per_step_accepted``; that the log's drafts equal vLLM's own ``per_step_drafted`` is checked.

Prompts run one at a time (groups of one) or several at once (a group of B is one
``LLM.generate`` call). Per request the counts do not depend on the group (each request's drafts
and verifications are its own). The time of a group does: its prediction is a lockstep model of
vLLM's steps — the first request is prefilled alone, the others in the next step beside its first
verification (how ``LLM.generate`` feeds a busy engine core: the first request arrives before the
others), then every running request verifies its step's drafts (K of a draft model, after its K
draft steps; a lookup's proposal; none: a plain step) each step until it ends, each step priced
from the trace's batched latencies at the number still running (:mod:`simlab.latency.batch`).
Compared is the stretch after every request has its first token: its tokens over its seconds.
Whether vLLM admitted them so is read from its step log and reported.

A single request's decode phase is from its first token to its last (the engine core's
timestamps), its tokens those after the first, as simlab's wall times are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import pandas as pd

from simlab.common.cpu_load import OtherLoad
from simlab.engines.vllm import jobs
from simlab.latency.batch import BatchLatency
from simlab.policies.vllm import Method
from simlab.sim.run import Simulator
from simlab.trace.tables import Trace

PREDICTION = "prediction.json"


def predict(trace: Trace, method: Method, max_tokens: int, groups: Sequence[Sequence[int]]) -> dict:
    """What vLLM will do (module docstring), as JSON-ready data. Per prompt also the trace's own
    tokens (``token_ids``), which vLLM's must equal for the prediction to hold (on a trace not
    recorded by vLLM: their agreement is reported)."""
    k = method.k
    sim = Simulator(trace)
    policy, params = method.policy(max_tokens)
    prompts = trace.prompts.set_index("prompt_id")
    path = trace.positions.sort_values(["prompt_id", "pos"]).groupby("prompt_id")["target_token"]
    per = {}
    for pid in sorted(int(p) for p in prompts.index):
        res = sim.run(policy, params, timeline_prompt=pid, with_cost=False)
        row = res.per_prompt.set_index("prompt_id").loc[pid]
        verify = [s for s in res.timeline if s.device == "target"]
        steps = [[int(s.args["tokens"]) - 1, int(s.args["accepted"])] for s in verify]
        out = int(row["tokens"]) + 1
        per[pid] = {"steps": steps, "output_tokens": out, "decode_s": float(row["wall_time_s"]),
                    "plain_decode_s": float(row["ad_wall_time_s"]), **_counters(steps, k),
                    "token_ids": [int(t) for t in path.get_group(pid).iloc[:out]]}
    batch = BatchLatency(sim.latency)
    lens = {pid: int(prompts.loc[pid, "prompt_len"]) for pid in per}
    draft_k = k if method.needs_draft else 0
    lockstep = {_key(g): {"speculative": _lockstep(batch, [per[p] for p in g], [lens[p] for p in g], draft_k),
                          "plain": _lockstep(batch, [_plain(per[p]) for p in g], [lens[p] for p in g], 0)}
                for g in groups if len(g) > 1}
    total = _counters([s for p in per.values() for s in p["steps"]], k)
    return {"k": k, "max_tokens": max_tokens, "method": method.name, "policy": {"name": policy, "params": params},
            "prompts": {str(p): v for p, v in per.items()}, "counters": total,
            "groups": lockstep, "latency": batch.rule, "batch_extrapolated": batch.extrapolated}


def _key(group: Sequence[int]) -> str:
    return ",".join(str(p) for p in group)


def _counters(steps: Sequence[Sequence[int]], k: int) -> dict:
    """vLLM's spec-decode counters of these (drafted, accepted) steps (``v1/spec_decode/metrics.py``)."""
    per_pos = [0] * k
    for _, accepted in steps:
        for i in range(accepted):
            per_pos[i] += 1
    return {"num_drafts": sum(1 for d, _ in steps if d), "num_draft_tokens": sum(d for d, _ in steps),
            "num_accepted_tokens": sum(a for _, a in steps), "num_accepted_tokens_per_pos": per_pos}


def _plain(p: dict) -> dict:
    """The same request decoded without speculation: one token a step."""
    return {"steps": [[0, 0]] * (p["output_tokens"] - 1), "output_tokens": p["output_tokens"]}


def _lockstep(batch: BatchLatency, reqs: list[dict], prompt_lens: list[int], draft_k: int) -> dict:
    """A group's steps after every request has its first token (module docstring): seconds and tokens.
    ``draft_k``: the K of a draft model, whose K draft steps precede every verification; 0 for a
    proposer without one (lookup: each request verifies its own step's proposal; none: a plain step)."""
    done = [0] * len(reqs)  # verifications done
    emitted = [1] * len(reqs)  # tokens out (the prefill's first)
    # step 2: the others' prefill beside the first request's first verification
    if reqs[0]["steps"]:
        done[0], emitted[0] = 1, min(reqs[0]["output_tokens"], 1 + reqs[0]["steps"][0][1] + 1)
    start = list(emitted)
    seconds = 0.0
    while True:
        running = [i for i, r in enumerate(reqs) if done[i] < len(r["steps"])]
        if not running:
            break
        ctxs = [prompt_lens[i] + emitted[i] - 1 for i in running]
        proposed = [reqs[i]["steps"][done[i]][0] for i in running]
        if not any(proposed):
            seconds += batch.step(ctxs)
        elif draft_k:
            seconds += (batch.draft_phase([draft_k] * len(running), ctxs)[0]
                        + batch.target([draft_k + 1] * len(running), ctxs))
        else:
            seconds += batch.target([d + 1 for d in proposed], ctxs)
        for i in running:
            emitted[i] = min(reqs[i]["output_tokens"], emitted[i] + reqs[i]["steps"][done[i]][1] + 1)
            done[i] += 1
    tokens = sum(e - s for e, s in zip(emitted, start))
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds if seconds else float("nan")}


@dataclass(frozen=True)
class Setup:
    """What one ``simlab vllm run`` measures: engines, requests, groups, repeats."""

    python: str
    target: str  # model directories as vLLM loads them
    draft: str | None  # None: a method without a draft model
    dtype: str
    method: Method
    max_tokens: int
    groups: list[list[int]]
    repeats: int
    prefix_caching: bool = False
    pythonpath: tuple[str, ...] = ()  # what the method's proposer imports besides vLLM (jobs.Engine)


def measure(trace: Trace, setup: Setup, out: Path, log: Callable[[str], None] = print,
            progress: Callable[[str, int, int], None] = lambda *_: None) -> dict:
    """vLLM with and without speculation on the trace's prompts, alternating engine by engine,
    ``setup.repeats`` times; every engine's results go to ``out`` (resumable). Returns
    {(kind, repeat): jobs.Output} as {"speculative": [...], "plain": [...]} and the machine's load."""
    prompts = trace.prompts.set_index("prompt_id")
    requests = [jobs.Request(f"p{int(pid)}", [int(x) for x in row.prompt_token_ids]) for pid, row in prompts.iterrows()]
    batches = [[f"p{p}" for p in g] for g in setup.groups]
    longest = int(prompts["prompt_len"].max()) + setup.max_tokens + setup.method.k + 16
    spec = jobs.Engine(setup.target, setup.dtype, longest, setup.method.config(setup.draft),
                       prefix_caching=setup.prefix_caching, pythonpath=setup.pythonpath)
    plain = jobs.Engine(setup.target, setup.dtype, longest, prefix_caching=setup.prefix_caching)
    sampling = {"temperature": 0.0, "max_tokens": setup.max_tokens}
    runs: dict[str, list] = {"speculative": [], "plain": []}
    load: dict[str, list] = {"speculative": [], "plain": []}
    for r in range(setup.repeats):
        for kind, engine in (("speculative", spec), ("plain", plain)):
            log(f"vllm run: {kind} decoding, repeat {r + 1} of {setup.repeats} ({len(batches)} batches)")
            other = OtherLoad()
            runs[kind].append(jobs.run(setup.python, engine, requests, batches, out / f"{kind}-r{r}.jsonl", sampling,
                                       progress=lambda n, kind=kind, r=r: progress(f"{kind} {r + 1}", n, len(batches))))
            load[kind].append(other.share())
    return {"runs": runs, "other_cpu": load}


def compare(predicted: dict, measured: dict, groups: Sequence[Sequence[int]]) -> dict:
    """Measured beside predicted: per request and step, the counters, tokens/s per run, the speedup."""
    k = predicted["k"]
    rows, group_rows = [], []
    counters_measured = []
    for r, (spec, plain) in enumerate(zip(measured["runs"]["speculative"], measured["runs"]["plain"])):
        for b, group in enumerate(groups):
            sb, pb = spec.batches[b], plain.batches[b]
            counters_measured.append(sb.counters)
            for pid in group:
                want = predicted["prompts"][str(pid)]
                got, base = sb.requests[f"p{pid}"], pb.requests[f"p{pid}"]
                steps, lists_agree = _steps(sb, got)
                wanted = [tuple(s) for s in want["steps"]]
                tokens = len(got.token_ids) - 1
                row = {"repeat": r, "group": _key(group), "prompt_id": pid, "steps_measured": len(steps),
                       "steps_predicted": len(wanted), "steps_equal": sum(a == b for a, b in zip(steps, wanted)),
                       "steps_all_equal": steps == wanted, "step_log_equals_per_step_lists": lists_agree,
                       "output_tokens_measured": len(got.token_ids),
                       "output_tokens_predicted": want["output_tokens"],
                       "tokens_equal_plain": got.token_ids == base.token_ids}
                if "token_ids" in want:  # a prediction made before simlab wrote the trace's tokens has none
                    row["first_difference_from_trace"] = _first_difference(base.token_ids, want["token_ids"])
                row.update({f"{c}_measured": v for c, v in _counters(steps, k).items()})
                row.update({f"{c}_predicted": want[c] for c in _counters(wanted, k)})
                if len(group) == 1:
                    row.update(decode_s_measured=got.decode_seconds, decode_s_predicted=want["decode_s"],
                               plain_decode_s_measured=base.decode_seconds,
                               plain_decode_s_predicted=want["plain_decode_s"],
                               tokens_per_s_measured=tokens / got.decode_seconds,
                               tokens_per_s_predicted=tokens / want["decode_s"],
                               plain_tokens_per_s_measured=tokens / base.decode_seconds,
                               plain_tokens_per_s_predicted=tokens / want["plain_decode_s"])
                rows.append(row)
            if len(group) > 1:
                group_rows.append({"repeat": r, "group": _key(group),
                                   **_group_measured(sb, group, "speculative"), **_group_measured(pb, group, "plain"),
                                   **_group_predicted(predicted["groups"][_key(group)])})
    table = pd.DataFrame(rows)
    return {"requests": table, "groups": pd.DataFrame(group_rows), "summary": _summary(table, group_rows, predicted,
                                                                                       counters_measured)}


def _steps(batch: jobs.Batch, got: jobs.RequestResult) -> tuple[list[tuple[int, int]], bool]:
    """Every decoding step of a request in order, (drafts scheduled, accepted), and whether they
    agree with vLLM's own ``per_step_drafted``: the drafts from the worker's step log (a step whose
    proposal was empty schedules none, and vLLM's per-step lists leave it out:
    ``Scheduler.update_from_output`` observes only scheduled drafts), the acceptances of the steps
    with drafts from ``per_step_accepted``, in order."""
    accepted = iter(got.per_step_accepted)
    steps = []
    for step in sorted(batch.steps, key=lambda s: s.t0):
        for sched_id, (_, spec, computed) in step.reqs.items():
            if sched_id.split("-")[0] == got.engine_id and computed > 0:  # a decoding step, not the prefill
                steps.append((spec, next(accepted, -1) if spec else 0))
    return steps, [d for d, _ in steps if d] == list(got.per_step_drafted) and next(accepted, None) is None


def _first_difference(tokens: Sequence[int], path: Sequence[int]) -> int:
    """Where vLLM's tokens first differ from the trace's path (-1: nowhere, lengths included)."""
    for i, (a, b) in enumerate(zip(tokens, path)):
        if a != b:
            return i
    return -1 if len(tokens) == len(path) else min(len(tokens), len(path))


def _group_measured(batch: jobs.Batch, group: Sequence[int], kind: str) -> dict:
    """The group's stretch after every request's first token: tokens, seconds, and whether vLLM
    admitted the requests as the lockstep model assumes."""
    reqs = [batch.requests[f"p{p}"] for p in group]
    start = max(r.times["first_token_ts"] for r in reqs)
    end = max(r.times["last_token_ts"] for r in reqs)
    engine = {r.engine_id: r for r in reqs}
    before = {rid: 0 for rid in engine}  # tokens each request had out at the stretch's start
    order = []
    for step in sorted(batch.steps, key=lambda s: s.t0):
        for sched_id, (n, spec, computed) in step.reqs.items():
            rid = sched_id.split("-")[0]
            if rid not in engine:
                continue
            if spec == 0 and n > 1 and computed == 0:
                order.append((step.t0, rid))
            if step.t1 <= start + 1e-6:
                before[rid] = before.get(rid, 0) + 1
    tokens_before = _tokens_before(batch, reqs, before)
    admitted = [rid for _, rid in sorted(order)]
    steps_of = {}
    for t0, rid in order:
        steps_of.setdefault(t0, []).append(rid)
    firsts = sorted(steps_of)
    as_assumed = len(firsts) <= 2 and len(steps_of[firsts[0]]) == 1 if firsts else False
    tokens = sum(len(r.token_ids) for r in reqs) - tokens_before
    return {f"{kind}_tokens_measured": tokens, f"{kind}_seconds_measured": end - start,
            f"{kind}_tokens_per_s_measured": tokens / (end - start) if end > start else float("nan"),
            f"{kind}_admitted_as_assumed": as_assumed, f"{kind}_first_admitted": admitted[:1]}


def _tokens_before(batch: jobs.Batch, reqs: list[jobs.RequestResult], steps_done: dict[str, int]) -> int:
    """Tokens the requests had emitted after ``steps_done[engine id]`` engine steps each (their
    prefill and the steps after it, accepted + 1 tokens each; one a step without drafts)."""
    total = 0
    for r in reqs:
        n = steps_done.get(r.engine_id, 0)
        if n <= 0:
            continue
        out = 1  # the prefill's token
        accepted = [a for _, a in _steps(batch, r)[0]]
        for i in range(n - 1):
            out += (accepted[i] + 1) if i < len(accepted) else 1
        total += min(out, len(r.token_ids))
    return total


def _group_predicted(pred: dict) -> dict:
    return {"speculative_tokens_predicted": pred["speculative"]["tokens"],
            "speculative_seconds_predicted": pred["speculative"]["seconds"],
            "speculative_tokens_per_s_predicted": pred["speculative"]["tokens_per_s"],
            "plain_tokens_predicted": pred["plain"]["tokens"], "plain_seconds_predicted": pred["plain"]["seconds"],
            "plain_tokens_per_s_predicted": pred["plain"]["tokens_per_s"]}


def _summary(table: pd.DataFrame, group_rows: list[dict], predicted: dict, counters_measured: list[dict]) -> dict:
    singles = table[table["group"].str.count(",") == 0] if len(table) else table
    out: dict = {"requests": len(table), "requests_all_steps_equal": int(table["steps_all_equal"].sum()),
                 "steps_equal": int(table["steps_equal"].sum()), "steps_measured": int(table["steps_measured"].sum()),
                 "tokens_equal_plain": int(table["tokens_equal_plain"].sum()),
                 "step_log_equals_per_step_lists": int(table["step_log_equals_per_step_lists"].sum())}
    if "first_difference_from_trace" in table:
        out["tokens_equal_trace"] = int((table["first_difference_from_trace"] == -1).sum())
    for c in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        out[f"{c}_measured_equals_predicted"] = bool((table[f"{c}_measured"] == table[f"{c}_predicted"]).all())
    # vLLM's own counters (LLM.get_metrics), each batch's change, against the predicted steps of its requests
    out["vllm_counters_equal_prediction"] = _vllm_counters_equal(table, counters_measured, predicted["k"])
    if len(singles):
        err = singles["tokens_per_s_predicted"] / singles["tokens_per_s_measured"] - 1
        plain_err = singles["plain_tokens_per_s_predicted"] / singles["plain_tokens_per_s_measured"] - 1
        speedup_m = singles["plain_decode_s_measured"] / singles["decode_s_measured"]
        speedup_p = singles["plain_decode_s_predicted"] / singles["decode_s_predicted"]
        out.update(single_runs=len(singles), tokens_per_s_error_median=round(float(err.median()), 4),
                   tokens_per_s_error_max_abs=round(float(err.abs().max()), 4),
                   tokens_per_s_within_5pct=int((err.abs() <= 0.05).sum()),
                   plain_tokens_per_s_error_median=round(float(plain_err.median()), 4),
                   speedup_measured=round(float(singles["plain_decode_s_measured"].sum()
                                                / singles["decode_s_measured"].sum()), 4),
                   speedup_predicted=round(float(singles["plain_decode_s_predicted"].sum()
                                                 / singles["decode_s_predicted"].sum()), 4),
                   speedup_per_run_measured_median=round(float(median(speedup_m)), 4),
                   speedup_per_run_predicted_median=round(float(median(speedup_p)), 4))
    if group_rows:
        g = pd.DataFrame(group_rows)
        err = g["speculative_tokens_per_s_predicted"] / g["speculative_tokens_per_s_measured"] - 1
        out.update(group_runs=len(g), group_tokens_per_s_error_median=round(float(err.median()), 4),
                   group_admitted_as_assumed=int(g["speculative_admitted_as_assumed"].sum()))
    return out


def _vllm_counters_equal(table: pd.DataFrame, counters_measured: list[dict], k: int) -> bool:
    """Each batch's change of vLLM's counters equals the sum of its requests' predicted steps' counters."""
    keys = {"num_drafts": "spec_decode_num_drafts", "num_draft_tokens": "spec_decode_num_draft_tokens",
            "num_accepted_tokens": "spec_decode_num_accepted_tokens"}
    grouped = table.groupby(["repeat", "group"], sort=False)
    for (key, rows), got in zip(grouped, counters_measured):
        for ours, theirs in keys.items():
            if int(rows[f"{ours}_predicted"].sum()) != int(got.get(theirs, -1)):
                return False
        per_pos = [sum(x) for x in zip(*rows["num_accepted_tokens_per_pos_predicted"])] or [0] * k
        if list(per_pos) != list(got.get("spec_decode_num_accepted_tokens_per_pos", [])):
            return False
    return True


def write_prediction(path: Path, prediction: dict) -> None:
    path.write_text(json.dumps(prediction, indent=2) + "\n")


__all__ = ["predict", "measure", "compare", "Method", "Setup", "PREDICTION", "write_prediction"]

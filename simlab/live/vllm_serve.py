"""``vllm serve`` with speculation under load, measured against ``simlab serve``'s prediction of it.

The load (:class:`Plan`): the trace's prompts (request i is prompt i mod N, in prompt_id order, as
``simlab serve`` cycles them) arriving at the times ``simlab serve --rate R --seed S`` draws
(:func:`simlab.serve.workload.poisson_arrivals`), or all at once (a burst), into a server with the
scheduler limits ``--max-num-seqs`` and ``--max-num-batched-tokens``.

The prediction comes first (:func:`predict`, written before any server starts), from two sources:

- the counts per request, from the ``vllm`` policy as ``simlab vllm run`` predicts them
  (:func:`simlab.live.vllm.predict`): under greedy decoding a request's drafts and acceptances do
  not depend on what it is batched with, and vLLM's last step drafts and counts past ``max_tokens``,
  which that prediction models; so vLLM's ``/metrics`` spec-decode counters over the run must equal
  the sum over its requests, exactly;
- the times, from ``simlab serve --scheduler vllm`` with the ``vllm`` policy (and ``ad`` for the
  server without speculation) on the same arrivals (a burst's first request ahead of the others,
  :data:`BURST_LAG_S`), at the same two limits: vLLM's scheduler (:mod:`simlab.serve.vllm_scheduler`:
  running requests then waiting ones in one step's token budget, draft slots, KV blocks with K
  lookahead slots, preemption) and its steps priced by their scheduled tokens
  (:mod:`simlab.latency.vllm_step`). :func:`compare` reports how far its TTFT, TPOT, end-to-end
  latency and throughput land from vLLM's; each run keeps vLLM's own step log (:func:`measure`).

Then :func:`measure` runs each server kind (speculative, plain) ``repeats`` times, alternating,
each time on a fresh ``vllm serve`` after one short warm-up request; every run is written to its
own file as it ends, with vLLM's step log of the measured requests (``steps``: what each engine step
scheduled and its time, :func:`simlab.engines.vllm.server.iterations`) (``runs/{kind}-r{repeat}.json``), so an interrupted run, or a server that died,
keeps what was measured and the same command resumes after it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import median

import pandas as pd

from simlab.common.cpu_load import OtherLoad
from simlab.common.errors import SimlabError
from simlab.common.jsonfile import write_json
from simlab.engines.vllm import server as vserver
from simlab.engines.vllm.jobs import Engine
from simlab.latency.batch import BatchLatency
from simlab.live import vllm as offline
from simlab.policies.vllm import SCHEDULE_KEY, Method, schedule_of, speculative_config
from simlab.serve.batch_policy import BatchSpec
from simlab.serve.run import BASELINE_POLICY, ServeConfig, latency_rule, serve_once
from simlab.serve.vllm_scheduler import VllmScheduler
from simlab.serve.workload import poisson_arrivals
from simlab.sim.run import Simulator
from simlab.trace.tables import Trace

POLICY = "vllm"
SHIM = Path(vserver.__file__).with_name("simlab_vllm_synthetic.py")  # run by vLLM's Python, in its worker
SHIM_EXTENSION = "simlab_vllm_synthetic.SyntheticKernel"
KINDS = ("speculative", "plain")
TABLE = "table"  # the server with vLLM's num_speculative_tokens_per_batch_size, where a plan has one
WARMUP_TOKENS = 4  # the warm-up request's tokens: a fresh server's first forwards touch the weights' pages
PREDICTION = offline.PREDICTION


@dataclass(frozen=True)
class Plan:
    """One ``simlab vllm serve`` run: the load, the speculation, the scheduler's limits."""

    k: int
    max_tokens: int
    requests: int
    rate: float | None  # requests per second (Poisson); None: a burst, every request at t = 0
    seed: int
    limits: vserver.Limits
    repeats: int
    # vLLM's dynamic speculation, a third server: (smallest batch size, K) pairs, from batch size 1
    table: tuple[tuple[int, int], ...] | None = None
    # vLLM's synthetic_acceptance_rates (acceptance imposed, :mod:`simlab.serve.synthetic`), resolved
    # by simlab.policies.vllm.synthetic_rates; None: the model pair's own acceptance
    synthetic: tuple[float, ...] | None = None
    draws: int = 32  # imposed profiles the synthetic prediction's times are the mean of

    def __post_init__(self) -> None:
        if self.table is not None and self.synthetic is not None:
            raise SimlabError("--gamma-by-batch serves the pair's own acceptance: drop the synthetic acceptance")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The servers run, in the order they alternate."""
        return KINDS if self.table is None else (KINDS[0], TABLE, *KINDS[1:])

    @property
    def ignore_eos(self) -> bool:
        """Requests run to ``max_tokens``: under imposed acceptance the output is not the trace's path."""
        return self.synthetic is not None

    def arrivals(self) -> list[float]:
        return [0.0] * self.requests if self.rate is None else poisson_arrivals(self.rate, self.requests, self.seed)

    def table_text(self) -> str:
        """The table as ``--gamma-by-batch`` pairs."""
        return ",".join(f"{size}:{k}" for size, k in self.table or ())

    def as_json(self) -> dict:
        out = {**asdict(self), "limits": asdict(self.limits)}
        if self.table is None:  # the plans of runs made before tables were served
            del out["table"]
        else:
            out["table"] = [list(pair) for pair in self.table]
        if self.synthetic is None:  # a plan of the pair's own acceptance is written as before synthetic plans
            del out["synthetic"], out["draws"]
        else:
            out.update(synthetic=list(self.synthetic), ignore_eos=True)
        return out


# A burst reaches vLLM's engine core one request at a time (the API server hands each over as it has
# parsed it) and the engine core starts a step as soon as one is queued: the first request of a
# burst is prefilled alone and the others join the next step, beside its first verification (as
# `simlab vllm run`'s groups are admitted; seen under `vllm serve` in results/vllm/smollm2-serve-burst4,
# first tokens at 2.3 s and 6.8 s). The prediction has the others arrive just after the first.
BURST_LAG_S = 1e-6


def engine_arrivals(plan: Plan) -> list[float]:
    """The arrival times the prediction serves: the plan's, with a burst's first request ahead."""
    arrivals = plan.arrivals()
    if plan.rate is None:
        return arrivals[:1] + [BURST_LAG_S] * (len(arrivals) - 1)
    return arrivals


def request_prompts(trace: Trace, n: int) -> list[int]:
    """Request i's prompt: the trace's prompt i mod N, in prompt_id order (as ``simlab serve``)."""
    ids = sorted(int(p) for p in trace.prompts["prompt_id"])
    return [ids[i % len(ids)] for i in range(n)]


def _scheduler(limits: vserver.Limits) -> VllmScheduler:
    return VllmScheduler(limits.max_num_seqs, limits.max_num_batched_tokens)


def predict(trace: Trace, plan: Plan) -> dict:
    """What the servers will do (module docstring), as JSON-ready data."""
    if plan.synthetic is not None:
        return predict_synthetic(trace, plan)
    sim = Simulator(trace)
    counts = offline.predict(trace, Method.of("draft_model", plan.k), plan.max_tokens, [])
    arrivals = engine_arrivals(plan)
    latency = BatchLatency(sim.latency)
    params = {"num_speculative_tokens": plan.k, "max_tokens": plan.max_tokens}
    config = ServeConfig(POLICY, params, _scheduler(plan.limits))
    servers = [("speculative", POLICY, params, config), ("plain", BASELINE_POLICY, {}, config)]
    if plan.table is not None:
        servers.insert(1, (TABLE, POLICY, params, replace(config, batch=BatchSpec(gamma_by_batch=plan.table_text()))))
    times, table_counters = {}, None
    for kind, policy, p, conf in servers:
        run = serve_once(sim, arrivals, conf, policy, p, latency=latency, record=True)
        if kind == TABLE:  # a request's drafts follow the batch sizes of its steps: the run's own counts
            table_counters = served_counters(run, plan.k)
        times[kind] = _times(run)
    prompts = request_prompts(trace, plan.requests)
    total = offline._counters([s for pid in prompts for s in counts["prompts"][str(pid)]["steps"]], plan.k)
    return {"plan": plan.as_json(), "arrivals": arrivals, "request_prompts": prompts,
            "prompts": counts["prompts"], "counters": total, "times": times, "latency": latency_rule(config, latency),
            "batch_extrapolated": latency.extrapolated,
            **({"table_counters": table_counters} if table_counters is not None else {})}


def served_counters(run, k: int) -> dict:
    """vLLM's spec-decode counters of a served run (``v1/spec_decode/metrics.py``): the verifications
    that had drafts, their draft tokens, the accepted ones, and per position how many were accepted
    (:class:`~simlab.common.metrics.PositionStats`; a verification with none checked had no drafts)."""
    per_pos = (list(run.positions.accepted) + [0] * k)[:k]
    return {"num_drafts": sum(c for n, c in run.positions.checked_hist.items() if n),
            "num_draft_tokens": sum(r.counts.drafted for r in run.requests),
            "num_accepted_tokens": sum(r.counts.accepted for r in run.requests), "num_accepted_tokens_per_pos": per_pos}


def _times(run) -> dict:
    """A predicted run's requests, figures and steps (the steps vLLM's scheduler will run, beside its
    step log after the run)."""
    frame = run.frame
    return {"requests": frame[["request_id", "prompt_id", "arrival_s", "ttft_s", "tpot_s", "e2e_s",
                               "tokens"]].to_dict("records"),
            **_figures(frame["arrival_s"], frame["ttft_s"], frame["tpot_s"], frame["e2e_s"], frame["tokens"]),
            "steps": [{"requests": s.args["batch"], "tokens": s.args["tokens"], "start_s": s.start,
                       "seconds": s.end - s.start} for s in run.slices]}


SYNTHETIC_SEED = 0  # the imposed profiles' draws (vLLM's own are its torch generator's: not these)
FIGURES = ("throughput_tokens_per_s", "ttft_mean_s", "ttft_median_s", "tpot_mean_s", "tpot_median_s", "e2e_mean_s",
           "e2e_median_s")


def predict_synthetic(trace: Trace, plan: Plan) -> dict:
    """The servers under imposed acceptance (:mod:`simlab.serve.synthetic`): the counters'
    expectation and spread; the speculative server's times, the mean over ``plan.draws`` imposed
    profiles (each figure's range over them in ``times.speculative.draws``; the requests and steps
    listed are the first draw's); the plain server on the same requests of ``max_tokens`` tokens."""
    import numpy as np

    from simlab.policies.vllm import conditional_rates
    from simlab.serve.synthetic import counter_moments, impose, profile_trace

    if plan.draws < 1:
        raise SimlabError(f"--draws must be >= 1, got {plan.draws}")
    rates = list(plan.synthetic)
    sim = Simulator(profile_trace(trace, plan.max_tokens, plan.k))
    arrivals = engine_arrivals(plan)
    latency = BatchLatency(sim.latency)
    params = {"num_speculative_tokens": plan.k, "max_tokens": plan.max_tokens}
    config = ServeConfig(POLICY, params, _scheduler(plan.limits))
    base = sim.past_end_replay(plan.k).prompts
    rng = np.random.default_rng(SYNTHETIC_SEED)
    runs = [_times(serve_once(sim, arrivals, config, POLICY, params, latency=latency, record=True,
                              prompts=impose(base, rates, rng))) for _ in range(plan.draws)]
    spec = {**runs[0]}
    for key in FIGURES:
        values = [r[key] for r in runs]
        spec[key] = float(np.mean(values))
    spec["draws"] = {key: {"min": float(min(r[key] for r in runs)), "max": float(max(r[key] for r in runs)),
                           "p10": float(np.percentile([r[key] for r in runs], 10)),
                           "p90": float(np.percentile([r[key] for r in runs], 90))} for key in FIGURES}
    for i, row in enumerate(spec["requests"]):  # each request's times: the mean over the draws
        spec["requests"][i] = {**row, **{key: float(np.mean([r["requests"][i][key] for r in runs]))
                                         for key in ("ttft_s", "tpot_s", "e2e_s")}}
    plain = _times(serve_once(sim, arrivals, config, BASELINE_POLICY, {}, latency=latency, record=True))
    moments = counter_moments(rates, [plan.max_tokens] * plan.requests, plan.k)
    return {"plan": plan.as_json(), "arrivals": arrivals, "request_prompts": request_prompts(trace, plan.requests),
            "synthetic": {"rates": rates, "conditional_rates": conditional_rates(rates), "draws": plan.draws,
                          "seed": SYNTHETIC_SEED},
            "counters": moments["mean"], "counters_sd": moments["sd"],
            "times": {"speculative": spec, "plain": plain}, "latency": latency_rule(config, latency),
            "batch_extrapolated": latency.extrapolated}


def synthetic_counters(measured: dict, prediction: dict, z: float = 3.0) -> dict:
    """A run's counters against their expectation: each counter's z-score (measured less mean, over
    the standard deviation), and per position the acceptance rate measured (accepted there over
    drafts) against the profile's p_i with its binomial standard deviation given the drafts;
    ``within`` when every z is within ``z``."""
    mean, sd, rates = prediction["counters"], prediction["counters_sd"], prediction["synthetic"]["rates"]

    def score(m, mu, s):
        return (m - mu) / s if s > 0 else (0.0 if m == mu else math.inf)

    zs = {key: score(measured[key], mean[key], sd[key]) for key in ("num_drafts", "num_draft_tokens",
                                                                     "num_accepted_tokens")}
    zs["num_accepted_tokens_per_pos"] = [score(m, mu, s) for m, mu, s in zip(
        measured["num_accepted_tokens_per_pos"], mean["num_accepted_tokens_per_pos"], sd["num_accepted_tokens_per_pos"])]
    drafts = measured["num_drafts"]
    per_pos = [a / drafts if drafts else math.nan for a in measured["num_accepted_tokens_per_pos"]]
    rate_z = [score(r, p, math.sqrt(p * (1 - p) / drafts) if drafts else 0.0) for r, p in zip(per_pos, rates)]
    flat = [zs["num_drafts"], zs["num_draft_tokens"], zs["num_accepted_tokens"], *zs["num_accepted_tokens_per_pos"],
            *rate_z]
    return {"z": zs, "acceptance_rate_per_pos_measured": per_pos, "acceptance_rate_per_pos_z": rate_z,
            "within": all(abs(x) <= z for x in flat), "z_limit": z}


def _figures(arrival, ttft, tpot, e2e, tokens) -> dict:
    """A run's throughput (generated tokens over first arrival to last token) and the mean and
    median of TTFT, TPOT and end-to-end latency."""
    arrival, ttft, tpot, e2e, tokens = (pd.Series(list(x), dtype=float) for x in (arrival, ttft, tpot, e2e, tokens))
    makespan = float((arrival + e2e).max() - arrival.min())
    out = {"throughput_tokens_per_s": float(tokens.sum()) / makespan if makespan > 0 else math.nan}
    for name, s in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[f"{name}_mean_s"] = float(s.mean())
        out[f"{name}_median_s"] = float(s.median())
    return out


@dataclass(frozen=True)
class Servers:
    """How to start the two servers: vLLM's Python, the models, the dtype."""

    python: str
    target: str
    draft: str
    dtype: str
    max_model_len: int

    def engine(self, kind: str, k: int, table: tuple[tuple[int, int], ...] | None = None,
               synthetic: tuple[float, ...] | None = None) -> Engine:
        if kind == "plain":
            return Engine(self.target, self.dtype, self.max_model_len)
        if kind == TABLE:
            return Engine(self.target, self.dtype, self.max_model_len, self.table_config(k, self.draft, table))
        spec = speculative_config(k, self.draft, None if synthetic is None else list(synthetic))
        if synthetic is None:
            return Engine(self.target, self.dtype, self.max_model_len, spec)
        # vLLM's CPU build lacks the synthetic branch of its greedy rejection kernel
        # (simlab_vllm_synthetic.py says why); this worker extension supplies it
        return Engine(self.target, self.dtype, self.max_model_len, spec, pythonpath=(str(SHIM.parent),),
                      worker_extension=SHIM_EXTENSION)

    @staticmethod
    def table_config(k: int, draft: str, table: tuple[tuple[int, int], ...]) -> dict:
        """The table server's ``--speculative-config``: K = ``k`` and the table as vLLM's ranges."""
        return {**speculative_config(k, draft), SCHEDULE_KEY: schedule_of(dict(table))}


def run_file(out: Path, kind: str, repeat: int) -> Path:
    return out / f"{kind}-r{repeat}.json"


def measure(trace: Trace, plan: Plan, servers: Servers, out: Path, port: int | None = None,
            log: Callable[[str], None] = print) -> dict[str, list[dict]]:
    """Every (repeat, kind) on a fresh server, alternating kinds; a run already in ``out`` is read
    back, not run again. Returns {kind: [run, ...]} in repeat order."""
    prompts = trace.prompts.set_index("prompt_id")
    ids = {int(pid): [int(x) for x in row.prompt_token_ids] for pid, row in prompts.iterrows()}
    requests = [ids[pid] for pid in request_prompts(trace, plan.requests)]
    arrivals = plan.arrivals()
    runs: dict[str, list[dict]] = {kind: [] for kind in plan.kinds}
    for r in range(plan.repeats):
        for kind in plan.kinds:
            file = run_file(out, kind, r)
            if file.exists():
                runs[kind].append(json.loads(file.read_text()))
                continue
            log(f"vllm serve: {kind} server, repeat {r + 1} of {plan.repeats} ({plan.requests} requests, "
                f"{'a burst' if plan.rate is None else f'{plan.rate:g} per second'})")
            engine = servers.engine(kind, plan.k, plan.table, plan.synthetic)
            with vserver.running(servers.python, engine, plan.limits, out / f"{kind}-r{r}.log", port) as srv:
                vserver.send(srv.url, [requests[0]], WARMUP_TOKENS)
                before = vserver.metrics(srv.url)
                warm_steps = len(vserver.iterations(srv.log))
                load = OtherLoad(pids=vserver.session_pids(srv.pid))
                answers = vserver.send(srv.url, requests, plan.max_tokens, arrivals, plan.ignore_eos)
                other = load.share()
                after = vserver.metrics(srv.url)
                steps = vserver.iterations(srv.log)[warm_steps:]
            result = {"kind": kind, "repeat": r, "other_cpu": other, "load_average_1min": round(os.getloadavg()[0], 2),
                      "counters": vserver.counters(before, after),
                      "metrics_change": {key: vserver.change(after.get(key), before.get(key)) for key in after},
                      "answers": [a.row() for a in answers], "steps": steps}
            write_json(result, file)
            runs[kind].append(result)
            log(f"vllm serve: {kind} repeat {r + 1}: {_measured(result)['throughput_tokens_per_s']:.2f} tokens/s "
                f"(other processes {'?' if other is None else f'{other:.0%}'} of the CPU)")
    return runs


def _measured(run: dict) -> dict:
    answers = run["answers"]
    sent = [a["sent"] for a in answers]
    ttft = [a["first"] - a["sent"] for a in answers]
    e2e = [a["last"] - a["sent"] for a in answers]
    tokens = [len(a["token_ids"]) for a in answers]
    tpot = [(a["last"] - a["first"]) / (n - 1) if n > 1 else math.nan for a, n in zip(answers, tokens)]
    return _figures(sent, ttft, tpot, e2e, tokens)


def compare(prediction: dict, runs: dict[str, list[dict]]) -> dict:
    """Measured beside predicted: one row per request and run, and the summary."""
    rows, per_run = [], []
    counters = {"speculative": prediction["counters"], TABLE: prediction.get("table_counters")}
    synthetic = "synthetic" in prediction
    for kind in runs:
        predicted = prediction["times"][kind]
        for run in runs[kind]:
            for a, p in zip(run["answers"], predicted["requests"]):
                pid = int(p["prompt_id"])
                n = len(a["token_ids"])
                rows.append({"kind": kind, "repeat": run["repeat"], "request": a["index"], "prompt_id": pid,
                             "tokens_measured": n, "tokens_predicted": int(p["tokens"]),
                             "ttft_s_measured": a["first"] - a["sent"], "ttft_s_predicted": p["ttft_s"],
                             "tpot_s_measured": (a["last"] - a["first"]) / (n - 1) if n > 1 else math.nan,
                             "tpot_s_predicted": p["tpot_s"], "e2e_s_measured": a["last"] - a["sent"],
                             "e2e_s_predicted": p["e2e_s"], "finish_reason": a["finish_reason"]})
            m = _measured(run)
            counts = {}
            if kind == "speculative" and synthetic:
                counts = {"counters_measured": run["counters"],
                          "counters_against_expectation": synthetic_counters(run["counters"], prediction)}
            elif kind != "plain":
                counts = {"counters_measured": run["counters"],
                          "counters_equal_prediction": run["counters"] == counters[kind]}
            per_run.append({"kind": kind, "repeat": run["repeat"], "other_cpu": run["other_cpu"],
                            "load_average_1min": run.get("load_average_1min"),
                            **{f"{key}_measured": v for key, v in m.items()},
                            **{f"{key}_predicted": predicted[key] for key in m}, **counts})
    table = pd.DataFrame(rows)
    summary = {"runs": per_run, "counters_predicted": prediction["counters"]}
    spec_runs = [r for r in per_run if r["kind"] == "speculative"]
    if synthetic:
        summary["counters_sd_predicted"] = prediction["counters_sd"]
        summary["counters_within_3sd_in_every_run"] = all(r["counters_against_expectation"]["within"]
                                                          for r in spec_runs)
    else:
        summary["counters_equal_in_every_run"] = all(r["counters_equal_prediction"] for r in per_run
                                                     if r["kind"] != "plain")
    if TABLE in runs:
        summary["table_counters_predicted"] = counters[TABLE]
    plain = {r["repeat"]: r["answers"] for r in runs["plain"]}
    pairs = [(a, plain[r["repeat"]][i]) for r in runs["speculative"] if r["repeat"] in plain
             for i, a in enumerate(r["answers"])]
    summary["tokens_equal_plain"] = sum(a["token_ids"] == b["token_ids"] for a, b in pairs)
    summary["answers_compared_with_plain"] = len(pairs)
    for key in FIGURES:
        for kind in runs:
            errs = [r[f"{key}_predicted"] / r[f"{key}_measured"] - 1 for r in per_run if r["kind"] == kind
                    and r[f"{key}_measured"]]
            if errs:
                summary[f"{kind}_{key}_error_median"] = round(median(errs), 4)
    if synthetic:  # where each measured figure falls among the imposed profiles' (the acceptance's luck)
        ranges = prediction["times"]["speculative"]["draws"]
        for r in spec_runs:
            r["within_draws"] = {key: ranges[key]["min"] <= r[f"{key}_measured"] <= ranges[key]["max"]
                                 for key in FIGURES}
    plain_runs = {r["repeat"]: r for r in per_run if r["kind"] == "plain"}
    for kind in runs:
        if kind == "plain":
            continue
        speedups = [(r["throughput_tokens_per_s_measured"] / plain_runs[r["repeat"]]["throughput_tokens_per_s_measured"],
                     r["throughput_tokens_per_s_predicted"] / plain_runs[r["repeat"]]["throughput_tokens_per_s_predicted"])
                    for r in per_run if r["kind"] == kind and r["repeat"] in plain_runs]
        if speedups:
            prefix = "" if kind == "speculative" else f"{kind}_"  # the speculative server's keys as they were
            summary[f"{prefix}throughput_speedup_measured_median"] = round(median(m for m, _ in speedups), 4)
            summary[f"{prefix}throughput_speedup_predicted"] = round(speedups[0][1], 4)
    if TABLE in runs:  # the order of the three servers by throughput: predicted, and in each repeat
        summary["throughput_order_predicted"] = sorted(runs, key=lambda k: -prediction["times"][k]["throughput_tokens_per_s"])
        summary["throughput_order_measured"] = [
            sorted(runs, key=lambda k: -next(r["throughput_tokens_per_s_measured"] for r in per_run
                                             if r["kind"] == k and r["repeat"] == repeat))
            for repeat in sorted(plain_runs) if all(any(r["kind"] == k and r["repeat"] == repeat for r in per_run)
                                                    for k in runs)]
    return {"requests": table, "summary": summary}


def read_prediction(out: Path, plan: Plan) -> dict | None:
    """The prediction a resumed run made before measuring; refuses a folder of another plan."""
    file = out / PREDICTION
    if not file.exists():
        return None
    prediction = json.loads(file.read_text())
    if prediction.get("plan") != plan.as_json():
        raise SimlabError(f"{out} holds a run of another plan ({prediction.get('plan')}); pass another --out")
    return prediction


__all__ = ["Plan", "Servers", "predict", "measure", "compare", "read_prediction", "request_prompts", "speculative_config",
           "PREDICTION"]

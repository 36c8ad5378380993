"""``simlab serve``: speculative decoding under load (docs/serving.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from simlab.cli import policy_options as opt
from simlab.cli import serve_options as so
from simlab.cli.app import app
from simlab.cli.output import (
    Force,
    Strict,
    check_strict,
    console,
    err_console,
    frame_output,
    print_extrapolated,
    print_json,
)
from simlab.cli.serve_options import DEFAULT_REQUESTS
from simlab.cli.simulate import load_inputs, trace_label, vllm_draft
from simlab.common.atomic import check_output
from simlab.common.errors import SimlabError
from simlab.common.openmp import wait_passively
from simlab.common.params import check_seed
from simlab.common.table_file import write_frame
from simlab.serve.scheduler import DEFAULT_MAX_BATCH, DEFAULT_TOKEN_BUDGET, Scheduler
from simlab.serve.tune import DEFAULT_BATCHES, DEFAULT_MAX_GAMMA, REQUESTS_PER_SLOT

# (label, JSON key, scale, unit) of the printed rows; the JSON output carries every figure.
LATENCY_ROWS = (("time to first token (TTFT", "ttft", 1e3, "ms"), ("time per output token after the first (TPOT", "tpot", 1e3, "ms"),
                ("end-to-end latency, arrival to last token (e2e", "e2e", 1.0, "s"))


serve_app = typer.Typer()
app.add_typer(serve_app, name="serve")


# A group whose callback is the serving command itself: ``simlab serve --trace ...`` serves, as it
# did when serve was a plain command, and ``simlab serve tune ...`` runs the subcommand instead.
@serve_app.callback(invoke_without_command=True)
@opt.with_policy_flags
def serve(
    ctx: typer.Context,
    params: dict[str, Any],
    policy: opt.Policy = "sd",
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Trace directory; request i replays its prompt i mod N.", show_default="the shipped trace")] = None,
    latency: Annotated[Optional[Path], typer.Option("--latency", help="Latency profile JSON; a roofline profile prices batches from shapes.", show_default="the trace's own samples")] = None,
    rate: Annotated[str, typer.Option("--rate", help="Poisson arrival rate, requests per second (ignored with --arrivals); several, comma-separated, sweep the rates.")] = "1.0",
    requests: Annotated[Optional[int], typer.Option("--requests", help="Requests to serve (at each rate).", show_default=f"{DEFAULT_REQUESTS}, or every time in --arrivals")] = None,
    arrivals: Annotated[Optional[Path], typer.Option("--arrivals", help="Text file of arrival times in seconds, one per line, sorted.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the Poisson arrivals and of stochastic replay.")] = 0,
    max_batch: so.MaxBatch = DEFAULT_MAX_BATCH,
    token_budget: so.TokenBudget = DEFAULT_TOKEN_BUDGET,
    gamma_by_batch: so.GammaByBatch = None,
    sd_off_above: so.SdOffAbove = None,
    smartspec: so.SmartSpec = None,
    adaptive_verify: so.AdaptiveVerify = None,
    mixed_prefill: so.MixedPrefill = False,
    scheduler_name: so.SchedulerName = "simlab",
    kv_blocks: so.KvBlocks = None,
    slo_ttft: so.SloTtft = None,
    slo_tpot: so.SloTpot = None,
    baseline: so.Baseline = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write per-request results (.csv or .parquet); with several rates, one row per rate and served policy.")] = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", help="Write the engine's draft/target forwards (Chrome trace JSON).")] = None,
    live: Annotated[bool, typer.Option("--live", help="Decode the trace's first --max-batch prompts for real as one batch (all at t=0), under the policy and without speculation, and print measured against serve's prediction.")] = False,
    live_tokens: Annotated[Optional[int], typer.Option("--live-tokens", help="With --live: tokens per request (the trace is cut to this budget).", show_default="the trace's max_new_tokens")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="With --live: live decodes of each of policy and ad, alternating.")] = 1,
    reprobe: Annotated[Optional[str], typer.Option("--reprobe", help="With --live: time the batch's forwards again first, in this process (SPEC as record's --latency-probe: its k values and contexts, e.g. 'k=1-5;ctx=128,256;repeats=3'), and predict from them; with --out, kept in OUT.latency.csv.")] = None,
    force: Force = False,
    strict: Strict = False,
) -> None:
    """Serve a trace's prompts under load: continuous batching, batched drafting and verification.

    Requests arrive (Poisson, or replayed times), queue, are prefilled, and decode together:
    each engine step runs batched draft steps and one batched verification. Prints throughput, TTFT, TPOT and end-to-end latency percentiles, SLO attainment and
    goodput, per-position acceptance, and the speedup over the same load without speculation.

    Several rates (--rate 0.5,1,2,4) serve each rate and print one row per rate and policy.
    `simlab serve tune` finds the best draft length per batch size.
    """
    if ctx.invoked_subcommand is not None:
        return
    from simlab.serve.batch_policy import BatchSpec, gamma_by_batch_pairs
    from simlab.serve.metrics import Slo
    from simlab.serve.rates import parse_rates
    from simlab.serve.run import ServeConfig, check_policy
    from simlab.serve.run import serve as serve_run
    from simlab.serve.workload import check_requests, poisson_arrivals, read_arrivals
    from simlab.sim.run import Simulator
    from simlab.sim.timeline import write_chrome_trace

    # every input is checked before the trace is read or anything runs
    check_policy(policy)
    slo = Slo(slo_ttft, slo_tpot)
    scheduler = _scheduler(scheduler_name, max_batch, token_budget, mixed_prefill, kv_blocks,
                           sd_off_above or smartspec or adaptive_verify, live)
    batch = BatchSpec(gamma_by_batch_pairs(gamma_by_batch) if gamma_by_batch else None, sd_off_above, smartspec,
                      adaptive_verify)
    if arrivals is not None and "," in rate:
        raise SimlabError("several --rate values sweep Poisson loads; drop --arrivals")
    rates = [] if arrivals else parse_rates(rate)  # --rate is ignored with --arrivals
    if out:
        frame_output(out, force)
    if timeline:
        check_output(timeline, "--timeline", force=force)
    check_seed(seed)
    if requests is not None:
        check_requests(requests)
    config = ServeConfig(policy, params, scheduler, batch, slo)
    if len(rates) > 1:
        for flag, given in (("--timeline", timeline), ("--live", live), ("--reprobe", reprobe)):
            if given:
                raise SimlabError(f"several --rate values sweep Poisson loads; drop {flag}")
        poisson_arrivals(rates[0], requests or DEFAULT_REQUESTS, seed)  # the lowest rate's arrivals fit the clock
        return _serve_rates(trace, latency, rates, requests or DEFAULT_REQUESTS, seed, config, baseline, json_out, out,
                            strict)
    times = read_arrivals(arrivals) if arrivals else poisson_arrivals(rates[0], requests or DEFAULT_REQUESTS, seed)
    if requests is not None:
        if requests > len(times):
            raise SimlabError(f"--requests {requests} is more than the {len(times)} times in {arrivals}")
        times = times[:requests]

    if live:
        return _serve_live(trace, latency, policy, params, max_batch, live_tokens, repeats, arrivals, out, reprobe)
    if reprobe is not None:
        raise SimlabError("--reprobe times the forwards of a --live batch; add --live, or re-probe the trace with "
                          "simlab record --resume --reprobe")
    tr, lat = load_inputs(trace, latency)
    sim = Simulator(tr, lat, seed=seed)
    res = serve_run(sim, times, config, baseline=baseline, record=timeline is not None)
    run = res.run
    priced = res.priced.to_dict()
    check_strict(priced, strict, f"serve {policy} on {tr.path}")
    if out:
        write_frame(run.frame, out)
    if timeline:
        write_chrome_trace(run.slices, timeline, title=f"serve {policy}, {len(times)} requests")
    stats = run.stats
    mean_batch = stats.batch_sizes / stats.decode_steps if stats.decode_steps else 0.0
    acceptance = run.positions.rates()
    if res.extrapolated and max_batch > 1:
        err_console.print(f"[yellow]warning:[/] {res.latency_rule}; {batch_probe_hint(tr.manifest)}")
    if json_out:
        print_json({
            "policy": policy, "params": run.params, "trace": str(tr.path), "latency": sim.latency.name,
            "latency_rule": res.latency_rule, "batch_latency_extrapolated": res.extrapolated,
            "arrivals": str(arrivals) if arrivals else {"poisson_rate": rates[0], "seed": seed},
            "max_batch": max_batch, "token_budget": token_budget, "mixed_prefill": mixed_prefill,
            **({"scheduler": "vllm", "kv_blocks": kv_blocks} if scheduler_name == "vllm" else {}),
            "batch_policy": run.batch_policy,
            "slo_ttft_s": slo_ttft, "slo_tpot_s": slo_tpot,
            **run.summary, "mean_batch": mean_batch, "engine_steps": stats.steps,
            "per_position_acceptance": acceptance,
            "baseline": res.baseline.summary if res.baseline else None, **res.speedups, **priced,
        })
        return
    s = run.summary
    console.print(f"trace: {trace_label(tr)}")
    console.print(f"latency: {sim.latency.name}; {res.latency_rule}")
    console.print(f"{policy} ({', '.join(f'{k}={v}' for k, v in run.params.items() if k != 'policy')}), "
                  f"{s['requests']} requests, batch policy {run.batch_policy}, max batch {max_batch}, mean decoding batch {mean_batch:.2f}")
    console.print(f"  throughput {s['throughput_tokens_per_s']:.2f} tokens/s, "
                  f"{s['throughput_requests_per_s']:.4f} requests/s over {s['makespan_s']:.1f} s")
    for label, key, scale, unit in LATENCY_ROWS:
        figures = ", ".join(f"p{p} {s[f'{key}_p{p}_s'] * scale:.2f}" for p in (50, 90, 99))
        console.print(f"  {label}, {unit}): mean {s[f'{key}_mean_s'] * scale:.2f}, {figures}")
    console.print(f"  SLO attainment {s['slo_attainment']:.3f} (share of requests within the TTFT and TPOT SLOs), "
                  f"goodput {s['goodput_requests_per_s']:.4f} requests/s (those requests per second)")
    console.print(f"  acceptance rate {s['acceptance_rate']:.3f} (accepted / draft tokens); per draft position "
                  "(drafts whose token i was accepted / drafts, vLLM's): "
                  + " ".join(f"{a:.2f}" for a in acceptance[:12]))
    if res.baseline:
        b = res.baseline.summary
        sp = res.speedups
        console.print(f"without speculation (ad): TPOT mean {b['tpot_mean_s'] * 1e3:.2f} ms, end-to-end mean "
                      f"{b['e2e_mean_s']:.2f} s -> speedup at this load: end-to-end {sp['e2e_speedup']:.3f}x, "
                      f"TPOT {sp['tpot_speedup']:.3f}x, throughput {sp['throughput_ratio']:.3f}x")
    print_extrapolated(priced)


def _scheduler(name: str, max_batch: int, token_budget: int, mixed_prefill: bool, kv_blocks: int | None,
               batch_policy: object, live: bool):
    """``--scheduler``'s scheduler, or the one line that says which flags it cannot take."""
    if name == "simlab":
        if kv_blocks is not None:
            raise SimlabError("--kv-blocks sizes vLLM's KV cache; add --scheduler vllm")
        return Scheduler(max_batch, token_budget, mixed_prefill)
    if name != "vllm":
        raise SimlabError(f"--scheduler is simlab or vllm, got {name!r}")
    for flag, given in (("--mixed-prefill", mixed_prefill),
                        ("--sd-off-above, --smartspec or --adaptive-verify", batch_policy),
                        ("--live", live)):
        if given:
            raise SimlabError(f"--scheduler vllm does not take {flag} (vLLM's steps batch prompt chunks with decodes "
                              "and draft the same K for every request, or --gamma-by-batch's K of the step's batch "
                              "size as vLLM's dynamic speculation does; simlab vllm serve measures vLLM)")
    from simlab.serve.vllm_scheduler import VllmScheduler

    return VllmScheduler(max_batch, token_budget, kv_blocks)


@serve_app.command("tune")
def tune(
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON file to write; simlab serve --gamma-by-batch reads it.")],
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Trace directory: the draft/target pair and its acceptance.", show_default="the shipped trace")] = None,
    latency: Annotated[Optional[Path], typer.Option("--latency", help="Latency profile JSON; a roofline profile prices batches from shapes.", show_default="the trace's own samples")] = None,
    batch: Annotated[str, typer.Option("--batch", help="Batch sizes to tune, comma-separated, increasing.")] = ",".join(map(str, DEFAULT_BATCHES)),
    max_gamma: Annotated[int, typer.Option("--max-gamma", help="Longest draft length tried (every length from 0, no speculation, to this).")] = DEFAULT_MAX_GAMMA,
    requests_per_slot: Annotated[int, typer.Option("--requests-per-slot", help="Requests per batch slot: batch size B serves B times this many requests, all arriving at once.")] = REQUESTS_PER_SLOT,
    token_budget: so.TokenBudget = DEFAULT_TOKEN_BUDGET,
    scheduler_name: Annotated[str, typer.Option("--scheduler", help="simlab: serve's own engine, policy sd capped at each γ; vllm: vLLM 0.32's scheduler, policy vllm with dynamic speculation drafting γ (γ = 0 still runs the draft's first pass), beside the server without speculation.")] = "simlab",
    seed: Annotated[int, typer.Option("--seed", help="Seed of stochastic replay (temperature > 0 traces).")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the written JSON instead of a table.")] = False,
    force: Force = False,
) -> None:
    """The best draft length per batch size for a trace's pair and a latency profile, as a JSON file.

    For every batch size B and draft length γ from 0 to --max-gamma, serve's engine serves a
    saturated batch: B x --requests-per-slot requests arriving together, at most B decoding at
    once, policy sd with every draft capped at γ (0: no speculation). The best γ for B has the
    highest tokens/s. `simlab serve --gamma-by-batch FILE` reads the file back (docs/serving.md).
    """
    from rich.table import Table

    from simlab.common.jsonfile import write_json
    from simlab.serve.tune import check_tune
    from simlab.serve.tune import tune as tune_run
    from simlab.sim.run import Simulator

    try:
        batches = [int(b) for b in batch.split(",")]
    except ValueError:
        raise SimlabError(f"--batch takes comma-separated batch sizes, e.g. 1,2,4,8, got {batch!r}") from None
    check_tune(batches, max_gamma, requests_per_slot)
    if scheduler_name not in ("simlab", "vllm"):
        raise SimlabError(f"--scheduler is simlab or vllm, got {scheduler_name!r}")
    Scheduler(batches[-1], token_budget)  # checks --token-budget
    check_seed(seed)
    check_output(out, "--out", force=force)
    tr, lat = load_inputs(trace, latency)
    sim = Simulator(tr, lat, seed=seed)
    tuned = tune_run(sim, batches, max_gamma, requests_per_slot, token_budget, scheduler=scheduler_name)
    draft = vllm_draft(tr.manifest)
    data = tuned.to_json(sim, draft)
    write_json(data, out)
    if tuned.extrapolated and batches[-1] > 1:
        err_console.print(f"[yellow]warning:[/] {tuned.latency_rule}")
    if json_out:
        print_json(data)
        return
    console.print(f"trace: {trace_label(tr)}")
    console.print(f"latency: {sim.latency.name}; {tuned.latency_rule}")
    served = ("vllm with dynamic speculation drafting γ, under vLLM's scheduler" if scheduler_name == "vllm"
              else "sd capped at γ")
    table = Table(title=f"best draft length per batch size ({served}; tokens/s of a saturated batch)",
                  header_style="bold")
    for col in ("batch", "best γ", "tokens/s", "without SD", "speedup"):
        table.add_column(col, justify="right")
    for b, g in tuned.best.items():
        tps = tuned.tokens_per_s[b]
        plain = tuned.plain_tokens_per_s[b] if tuned.plain_tokens_per_s else tps[0]
        table.add_row(str(b), str(g), f"{tps[g]:.2f}", f"{plain:.2f}", f"{tuned.speedup[b]:.3f}")
    console.print(table)
    console.print(f"wrote {out}: simlab serve --gamma-by-batch {out} (= {tuned.table()})")
    if draft:
        from simlab.policies.vllm import schedule_config

        vllm = schedule_config(tuned.best, draft)
        console.print("vLLM: " + (f"--speculative-config '{json.dumps(vllm)}'" if vllm else
                                  "no speculation at any batch size (no --speculative-config)"), soft_wrap=True)


# Columns of the rate sweep's printed table: (header, column, scale, format); --out and --json carry every figure.
RATE_COLUMNS = (("rate", "rate_per_s", 1.0, "{:g}"), ("tok/s", "throughput_tokens_per_s", 1.0, "{:.2f}"),
                ("goodput", "goodput_requests_per_s", 1.0, "{:.4f}"), ("SLO", "slo_attainment", 1.0, "{:.2f}"),
                ("TPOT\np50", "tpot_p50_s", 1e3, "{:.0f}"), ("\np90", "tpot_p90_s", 1e3, "{:.0f}"),
                ("e2e\np50", "e2e_p50_s", 1.0, "{:.1f}"), ("\np90", "e2e_p90_s", 1.0, "{:.1f}"))


def _serve_rates(trace, latency, rates, requests, seed, config, baseline, json_out, out, strict) -> None:
    """``serve --rate R1,R2,...``: one serve run per rate (simlab.serve.rates), one row per rate and policy."""
    from simlab.serve.rates import rate_sweep
    from simlab.sim.run import Simulator
    from simlab.sweep.result_table import extrapolated_rows

    tr, lat = load_inputs(trace, latency)
    sim = Simulator(tr, lat, seed=seed)
    frame = rate_sweep(sim, rates, requests, seed, config, baseline)
    frame["trace"], frame["latency"], frame["max_batch"] = str(tr.path), sim.latency.name, config.scheduler.max_batch
    frame["slo_ttft_s"], frame["slo_tpot_s"], frame["seed"] = config.slo.ttft_s, config.slo.tpot_s, seed
    extrapolated = extrapolated_rows(frame).replace("configurations", "rows")
    if strict and extrapolated:
        raise SimlabError(f"--strict: {extrapolated}; probe the missing sizes and contexts, or drop --strict")
    if out:
        write_frame(frame, out)
    if json_out:
        print_json(frame.to_dict(orient="records"))
        return
    show_rates(frame, tr, sim.latency.name, requests, seed, config.scheduler.max_batch, config.slo)
    if extrapolated:
        console.print(f"[yellow]note:[/] {extrapolated}")
    if out:
        console.print(f"wrote {out}")


def show_rates(frame, tr, latency_name: str, requests: int, seed: int, max_batch: int, slo) -> None:
    """Print a rate sweep's table (``serve --rate`` and ``sweep --rate``): one row per rate and served configuration."""
    from rich.table import Table

    console.print(f"trace: {trace_label(tr)}")
    console.print(f"latency: {latency_name}; {requests} Poisson requests per rate (seed {seed}), max batch "
                  f"{max_batch}; SLOs: TTFT {_seconds(slo.ttft_s)}, TPOT {_seconds(slo.tpot_s)}")
    table = Table(header_style="bold", caption="rate: requests arriving per second; tok/s: tokens decoded per second; "
                  "goodput: requests per second within both SLOs; SLO: share of requests within both; TPOT: time per "
                  "output token after the first, ms; e2e: end-to-end latency, arrival to last token, s", caption_justify="left")
    table.add_column("served", no_wrap=True)
    for header, *_ in RATE_COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    for row in frame.itertuples(index=False):
        table.add_row(row.label, *(form.format(getattr(row, key) * scale) for _, key, scale, form in RATE_COLUMNS))
    console.print(table)


def batch_probe_hint(manifest) -> str:
    """How a trace without a batch axis gets one (a llama.cpp trace has its own recorder)."""
    if manifest.extra.get("engine") == "llama.cpp":
        return ("time its steps again with a batch axis (simlab llama-cpp record --out TRACE --reprobe --batch 1,2,4,8) "
                "or pass a roofline profile with --latency")
    return ("probe the trace's batch axis on a copy of it (simlab record ... --resume --reprobe --keep-rollouts "
            "--latency-probe 'batch=2,4,8', or 'batch=1,2,4,8' on other hardware than the trace's) or pass a "
            "roofline profile with --latency")


def _seconds(slo: float | None) -> str:
    return "none" if slo is None else f"{slo:g} s"


def _warn_if_priced_elsewhere(tr, lat) -> None:
    """Say so when the prediction is priced from another machine's latency samples: the counts
    still compare, the timings do not."""
    from simlab.record.machine import hardware_name

    here = hardware_name("cpu")
    if lat is None and tr.manifest.hardware != here:
        err_console.print(f"[yellow]warning:[/] the trace's latencies were measured on {tr.manifest.hardware}, "
                          f"this is {here}: predicted timings are that machine's (counts are unaffected); "
                          "re-probe a copy of the trace here first (docs/serving.md)")


def _serve_live(trace, latency, policy, params, batch, tokens, repeats, arrivals, out, reprobe) -> None:
    """``serve --live``: simlab.live.serve decodes the batch; print measured beside predicted."""
    from rich.table import Table

    wait_passively()  # before torch loads OpenMP, as the latency probe it is compared with waited
    from simlab.live.serve import check, load_executor
    from simlab.live.serve import reprobe as time_forwards
    from simlab.record.latency import ProbePlan
    from simlab.record.reprobe import with_points

    if arrivals is not None:
        raise SimlabError("--live serves one batch arriving at t=0; drop --arrivals")
    if reprobe is not None:
        ProbePlan.parse(reprobe)  # a bad spec fails before the models load
        if latency is not None:
            raise SimlabError("--reprobe prices the batch from the samples it times; drop --latency")
    if repeats < 1:
        raise SimlabError(f"--repeats must be at least 1, got {repeats}")
    if tokens is not None and tokens < 2:
        raise SimlabError(f"--live-tokens must be at least 2, got {tokens}")
    tr, lat = load_inputs(trace, latency)
    budget = min(tokens or tr.manifest.max_new_tokens, tr.manifest.max_new_tokens)
    executor = load_executor(tr)
    if reprobe is not None:
        err_console.print(f"B={batch}: timing the batch's forwards again ({reprobe})...")
        samples, other = time_forwards(tr, executor, batch, reprobe, log=lambda m: err_console.print(m))
        err_console.print(f"B={batch}: re-probed {len(samples)} forwards; other processes took "
                          f"{'?' if other is None else f'{other:.0%}'} of the CPU meanwhile")
        tr = replace(tr, latency=with_points(tr.latency, samples))
        if out:  # the prediction's own latencies, kept beside its table
            samples.assign(other_cpu=other).to_csv(out.with_suffix(".latency.csv"), index=False)
    else:
        _warn_if_priced_elsewhere(tr, lat)
    frame = check(tr, executor, policy, params, batch, budget, repeats, lat,
                  log=lambda m: err_console.print(m))
    if out:
        write_frame(frame, out)
    console.print(f"trace: {trace_label(tr)}; batch {batch}, {budget} tokens per request")
    table = Table(header_style="bold")
    for col in ("policy", "tok/s measured", "predicted", "TPOT ms measured", "predicted", "lossless", "target calls = sim"):
        table.add_column(col)
    for name, g in frame.groupby("policy", sort=False):
        tps, tpot = g["measured_tokens_per_s"], 1e3 * g["measured_tpot_s"]
        table.add_row(name, f"{tps.median():.2f} ({tps.min():.2f}-{tps.max():.2f})", f"{g['predicted_tokens_per_s'].iat[0]:.2f}",
                      f"{tpot.median():.0f} ({tpot.min():.0f}-{tpot.max():.0f})", f"{1e3 * g['predicted_tpot_s'].iat[0]:.0f}",
                      f"{g['lossless'].sum()}/{len(g)}", f"{g['target_calls_equal'].sum()}/{len(g)}")
    console.print(table)

"""``simlab llama-cpp serve``: ``llama-server`` with B parallel slots against ``simlab serve``.

Every prediction is made (and printed) before the first server starts; then, in ``--repeats``
rounds over the batch sizes (B = 1, 2, 4, 8, 1, 2, ...: a slow minute of a shared machine falls
on all of them alike), a fresh ``llama-server`` with ``-np B`` gets a warm-up burst and one
counted burst of B requests from a load generator on loopback (:mod:`simlab.live.llama_server`), or,
with ``--rate``, the requests of a Poisson schedule (the same for every B and round).
With ``--baseline`` each speculative server is followed by one that runs the target alone
(plain decoding, predicted by the ``ad`` policy), so the speedup is measured against predicted
within each round.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import typer

from simlab.cli.llama_cpp import _batches, _pair, llama_app
from simlab.cli.output import Force, frame_output
from simlab.common.errors import SimlabError
from simlab.common.locations import portable_path

ARRIVALS_DEFAULTS = (8, 0)  # --requests, --seed: given without --rate, they are refused rather than ignored


@llama_app.command("serve")
def serve_command(
    trace_path: Path = typer.Option(..., "--trace", help="A trace from `simlab llama-cpp record` (record it with "
                                    "--batch 1,2,4,... to price batched steps from measurements)."),
    batch: str = typer.Option("1,2,4", "--batch", help="Batch sizes: a llama-server with -np B per B, bursts of B "
                              "requests (the trace's first B prompts, cycled)."),
    n_predict: int = typer.Option(64, "--n-predict", "-n", help="Tokens each request generates (its n_predict)."),
    draft_max: int = typer.Option(3, "--draft-max", help="llama.cpp's --spec-draft-n-max (the policy's draft_max)."),
    p_min: float = typer.Option(0.0, "--p-min", help="llama.cpp's --spec-draft-p-min (the policy's p_min)."),
    draft_min: int = typer.Option(0, "--draft-min", help="llama.cpp's --spec-draft-n-min (the policy's draft_min)."),
    repeats: int = typer.Option(2, "--repeats", help="Rounds over the batch sizes: each starts a fresh llama-server "
                                "per B and counts one burst after an uncounted warm-up."),
    reprobe: bool = typer.Option(False, "--reprobe", help="Time the steps again, with the batch axis of --batch, "
                                 "before predicting (not the trace's); with --out, kept in OUT.latency.csv."),
    out: Path | None = typer.Option(None, "--out", help="Per-request table of every burst, measured beside "
                                    "predicted (.csv)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    server_logs: Path | None = typer.Option(None, "--server-logs", help="Keep each llama-server's log here "
                                            "(bB-rR.log, timestamped)."),
    baseline: bool = typer.Option(False, "--baseline", help="After each speculative server, the same burst into a "
                                  "llama-server with the target alone (plain decoding), predicted by `ad`: the "
                                  "speedup, measured against predicted (needs a trace or --reprobe whose trace "
                                  "tool timed the plain step)."),
    rate: float | None = typer.Option(None, "--rate", help="Spread arrivals instead of bursts: a Poisson process of this "
                                      "many requests per second (request i: the trace's prompt i mod N) into each "
                                      "server's B slots; TTFT and end-to-end latency compared per request."),
    requests: int = typer.Option(ARRIVALS_DEFAULTS[0], "--requests", help="With --rate: requests per run."),
    seed: int = typer.Option(ARRIVALS_DEFAULTS[1], "--seed", help="With --rate: seed of the Poisson arrivals."),
    jobs: int = typer.Option(2, "--jobs", help="Parallel compile jobs, if llama.cpp must be built."),
    force: Force = False,
) -> None:
    """Predict llama-server under bursts of B requests in B slots (or under Poisson arrivals,
    --rate), then run it and compare."""
    import pandas as pd

    from simlab.engines.llama_cpp import build as llama_cpp
    from simlab.engines.llama_cpp.server import Drafting
    from simlab.live import llama_server as compare
    from simlab.trace.io import read_trace

    if out is not None:
        out = frame_output(out, force)
    sizes = _batches(batch)
    if n_predict < 2 or draft_max < 1 or draft_min < 0 or not 0.0 <= p_min <= 1.0 or repeats < 1:
        raise SimlabError("-n must be >= 2, --draft-max and --repeats >= 1, --draft-min >= 0 and --p-min within [0, 1]")
    arrivals = None
    if rate is not None:
        from simlab.serve.workload import poisson_arrivals

        arrivals = poisson_arrivals(rate, requests, seed)
    elif (requests, seed) != ARRIVALS_DEFAULTS:
        raise SimlabError("--requests and --seed set the arrivals of --rate; add --rate R")
    trace = read_trace(trace_path)
    drafting = Drafting(draft_max, draft_min, p_min)
    compare.server_view(trace, n_predict)  # a trace that cannot be served fails before anything is built
    if baseline and not reprobe and not (trace.latency["op"] == "target_step").any():
        raise SimlabError(f"--baseline: {trace_path}'s latencies have no plain target step (the trace tool times it "
                          "since 2026-11-28): add --reprobe, or keep new ones in it (simlab llama-cpp record --out TRACE --reprobe)")
    log = lambda line: typer.echo(line, err=True)  # noqa: E731
    m = trace.manifest
    pair = _pair(m.target_model, m.draft_model, int(m.extra.get("threads", 2)))
    log("building llama.cpp's llama-server if not cached (a few minutes the first time)...")
    server = llama_cpp.build_server(jobs=jobs).binary
    if reprobe:
        from simlab.engines.llama_cpp.record import EnginePrompt, Probe
        from simlab.engines.llama_cpp.record import reprobe as time_steps

        tool = llama_cpp.build_trace_tool(jobs=jobs).binary
        first = trace.prompts.iloc[0]
        probe = Probe(batches=tuple(sorted({1, *sizes})))
        if arrivals is not None:  # prompts are prefilled beside running slots: time prompt-sized forwards too
            probe = replace(probe, ks=probe.ks + compare.prefill_ks(compare.server_view(trace, n_predict)))
        log(f"re-probing the steps (batch sizes {','.join(map(str, sizes))}; k = {','.join(map(str, probe.ks))})...")
        latency = time_steps(tool, pair, EnginePrompt(int(first.prompt_id), first.source, first.prompt_text), probe)
        trace = replace(trace, latency=latency)
        if out is not None:  # the prediction's latencies, kept beside its table
            latency.to_csv(out.with_suffix(".latency.csv"), index=False)
    view = compare.server_view(trace, n_predict)
    servers = [drafting, *([None] if baseline else [])]  # None: the target alone
    # every prediction is made before anything is measured
    predictions = {(d, b): compare.predict(view, b, d, arrivals) for d in servers for b in sizes}
    for (d, b), (rows, figures) in predictions.items():
        log(f"{compare.policy_of(d)[0]} B={b} predicted: {figures['tokens_per_s']:.2f} tokens/s"
            + (f", mean TTFT {rows['predicted_ttft_s'].mean():.2f} s" if arrivals else ""))
    paths = compare.greedy_paths(view)
    if server_logs is not None:
        server_logs.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    tables, bursts = [], []
    for rep in range(repeats):  # rounds over the batch sizes, so that a slow minute hits them alike
        for b in sizes:
            for d in servers:
                policy = compare.policy_of(d)[0]
                rows, figures = predictions[(d, b)]
                name = f"b{b}-r{rep + 1}.log" if d is drafting else f"{policy}-b{b}-r{rep + 1}.log"
                log_file = server_logs / name if server_logs else None
                answers, measured = compare.measure(server, pair, view, b, n_predict, d, log, log_file, arrivals)
                table = compare.compare(rows, answers, paths).assign(policy=policy, batch=b, repeat=rep)
                tables.append(table)
                matched = int(table[[f"match_{k}" for k in compare.COUNTERS]].all(axis=1).sum())
                bursts.append({"policy": policy, "batch": b, "repeat": rep,
                               "measured_tokens_per_s": round(measured["tokens_per_s"], 3),
                               "predicted_tokens_per_s": round(figures["tokens_per_s"], 3),
                               "error_tokens_per_s": round(figures["tokens_per_s"] / measured["tokens_per_s"] - 1.0, 4),
                               **(compare.latency_figures(table) if arrivals else {}),
                               "other_cpu": measured["other_cpu"],
                               "requests_matching_counts": f"{matched}/{len(table)}",
                               "requests_on_the_traces_path": f"{int((table['diverged_at'] == -1).sum())}/{len(table)}"})
    frame = pd.concat(tables, ignore_index=True)
    if out is not None:
        frame.to_csv(out, index=False)
    summary = {"trace": portable_path(trace_path), "n_predict": n_predict, "draft_max": draft_max,
               "draft_min": draft_min, "p_min": p_min, "latency": "re-probed before the run" if reprobe else "the trace's",
               "latency_rule": predictions[(drafting, max(sizes))][1]["latency_rule"],
               **({"arrivals": {"poisson_rate": rate, "requests": requests, "seed": seed}} if arrivals else {}),
               "bursts": bursts,
               **({"speedups": compare.speedups(bursts)} if baseline else {}),
               "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
               "command": shlex.join(["simlab", *sys.argv[1:]]),
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    typer.echo(f"latency: {summary['latency']}; {summary['latency_rule']}")
    for r in bursts:
        latencies = "".join(f"; mean {label} {r[f'measured_{what}_mean_s']:.2f} s measured / {r[f'predicted_{what}_mean_s']:.2f} s "
                            f"predicted ({r[f'error_{what}_mean']:+.1%})" for what, label in (("ttft", "TTFT"), ("e2e", "end to end"))
                            if f"error_{what}_mean" in r)
        typer.echo(f"{r['policy']} B={r['batch']} {'run' if arrivals else 'burst'} {r['repeat'] + 1}: tokens/s "
                   f"{r['measured_tokens_per_s']:7.2f} measured / {r['predicted_tokens_per_s']:7.2f} predicted "
                   f"({r['error_tokens_per_s']:+.1%}){latencies}; requests with tokens, drafted and accepted exact: "
                   f"{r['requests_matching_counts']}, on the trace's greedy path: {r['requests_on_the_traces_path']}")
    for r in summary.get("speedups", []):
        typer.echo(f"B={r['batch']} round {r['repeat'] + 1}: speedup over plain decoding {r['measured_speedup']:.3f}x "
                   f"measured / {r['predicted_speedup']:.3f}x predicted ({r['error_speedup']:+.1%})")

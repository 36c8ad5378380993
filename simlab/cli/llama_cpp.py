"""``simlab llama-cpp``: llama.cpp as a second engine (build, record a trace, run and compare).

llama.cpp is built from the ``llama-cpp-python`` sdist on the package index
(:mod:`simlab.engines.llama_cpp.build`); models are the catalog's GGUF files. ``record`` writes a
trace with llama.cpp's own numerics and latencies; ``run`` predicts ``llama-speculative-simple``
on that trace with the ``llama-cpp`` policy, then runs the real binary on the same prompts and
prints both.
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
from simlab.cli.output import Force, frame_output, positive_ints
from simlab.common.errors import SimlabError
from simlab.common.locations import portable_path

llama_app = typer.Typer(help="llama.cpp as the engine: build it, record traces with it, predict its runs.",
                        no_args_is_help=True)
app.add_typer(llama_app, name="llama-cpp")

THREADS_HELP = "Threads of each model (-t, -td)."
BATCH_HELP = ("Batch sizes to probe, e.g. 1,2,4,8: for each B > 1 the trace tool also times B sequences decoded "
              "together (-np B), as llama-server steps B slots, for `simlab serve` to price batches from "
              "(batch 1, one sequence, is always probed).")


def _batches(spec: str) -> tuple[int, ...]:
    """``--batch 1,2,4,8`` -> (1, 2, 4, 8)."""
    return positive_ints(spec, "--batch")


def _tools(jobs: int) -> tuple[Path, Path]:
    """(llama-speculative-simple, the trace tool), built once into the simlab cache."""
    from simlab.engines.llama_cpp import build as llama_cpp

    typer.echo("building llama.cpp if not cached (a few minutes the first time)...", err=True)
    return llama_cpp.build(jobs=jobs).binary, llama_cpp.build_trace_tool(jobs=jobs).binary


def _pair(target: str, draft: str, threads: int):
    from simlab.engines.llama_cpp.args import ModelPair
    from simlab.models.install import gguf_file

    log = lambda line: typer.echo(line, err=True)  # noqa: E731
    return ModelPair(gguf_file(target, log), gguf_file(draft, log), threads)


@llama_app.command("build")
def build_command(jobs: int = typer.Option(2, "--jobs", help="Parallel compile jobs.")) -> None:
    """Build llama-speculative-simple, simlab's trace tool and llama-server (for `llama-cpp serve`)
    from the package index (cached): set up once, so that no later command waits for a build."""
    from simlab.engines.llama_cpp import build as llama_cpp

    binary, tool = _tools(jobs)
    typer.echo(f"{binary}\n{tool}\n{llama_cpp.build_server(jobs=jobs).binary}")


@llama_app.command("record")
def record_command(
    out: Path = typer.Option(..., "--out", help="Trace directory to write (e.g. traces/NAME)."),
    target: str = typer.Option("smollm2", "--target", help="Target: a catalog model name (its GGUF file is used)."),
    draft: str = typer.Option("smollm2", "--draft", help="Draft: a catalog model name."),
    prompts: str = typer.Option("humaneval:4", "--prompts", help="humaneval[:N], mtbench[:N], or a .jsonl/.txt file."),
    max_new_tokens: int = typer.Option(72, "--max-new-tokens", help="Positions recorded per prompt (the prompt's "
                                       "last token is position 0); a run with -n N and --draft-max D needs N + D + 2."),
    rollout: int = typer.Option(8, "--rollout", help="Draft continuation length after each divergence."),
    threads: int = typer.Option(2, "--threads", help=THREADS_HELP),
    chat_template: bool = typer.Option(True, "--chat-template/--no-chat-template",
                                       help="Wrap prompts in the target's chat template (needs it installed)."),
    batch: str | None = typer.Option(None, "--batch", help=f"{BATCH_HELP} Default 1; with --reprobe, the trace's."),
    reprobe: bool = typer.Option(False, "--reprobe", help="Time the steps of the llama.cpp trace at --out again on "
                                 "this machine and keep them in it (its prompts, tokens and rollouts unchanged; "
                                 "--target, --draft, --prompts, --max-new-tokens, --rollout are the trace's)."),
    jobs: int = typer.Option(2, "--jobs", help="Parallel compile jobs, if llama.cpp must be built."),
    force: Force = False,
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Record a greedy trace with llama.cpp as the engine: its logits, its latencies."""
    from tqdm import tqdm

    from simlab.common.atomic import check_output
    from simlab.engines.llama_cpp import build as llama_cpp
    from simlab.engines.llama_cpp.record import DRAFT_CONF, Probe, record
    from simlab.models.catalog import CATALOG
    from simlab.record.machine import hardware_name
    from simlab.trace.schema import MANIFEST, Manifest, Topology

    if reprobe:
        _reprobe(out, batch, jobs)
        return
    check_output(out, "--out", directory=True, force=force, owned=MANIFEST)
    if rollout < 0:
        raise SimlabError(f"--rollout must be >= 0, got {rollout}")
    probe = Probe(batches=_batches(batch or "1"))
    pair = _pair(target, draft, threads)
    texts = _prompt_texts(prompts, target, pair.target, chat_template)
    _, tool = _tools(jobs)
    manifest = Manifest(
        kind="recorded", draft_model=draft, target_model=target, dataset=prompts, hardware=hardware_name("cpu"),
        device="cpu", dtype="gguf", tokenizer=f"{target} (llama.cpp, GGUF vocabulary)",
        max_new_tokens=max_new_tokens, rollout_len=rollout, topology=Topology.ONE_DEVICE.value,
        eos_token_ids=list(CATALOG[target].eos_token_ids), command=shlex.join(["simlab", *sys.argv[1:]]),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        libraries={"llama.cpp": f"vendored in llama-cpp-python {llama_cpp.VERSION}"},
        notes="llama.cpp engine: position 0 is the prompt's last token (llama-speculative-simple drafts from it)",
        extra={"engine": "llama.cpp", "draft_conf": DRAFT_CONF, "threads": threads, "chat_template": chat_template},
    )
    with tqdm(total=len(texts), desc="llama.cpp trace", unit="prompt", disable=quiet, file=sys.stderr) as bar:
        trace = record(tool, pair, texts, manifest, out, probe, progress=lambda n: bar.update(n - bar.n))
    agree = (trace.positions["draft_token"] == trace.positions["target_token"]).mean()
    typer.echo(f"wrote {out}: {len(trace.prompts)} prompts, {len(trace.positions)} positions, "
               f"draft agrees with target on {agree:.1%}")


def _reprobe(out: Path, batch: str | None, jobs: int) -> None:
    """``record --reprobe``: the trace at ``out`` with its steps timed again here."""
    from simlab.engines.llama_cpp.record import Probe, reprobe_trace
    from simlab.record.machine import hardware_name
    from simlab.trace.io import read_trace, write_trace

    trace = read_trace(out)
    m = trace.manifest
    if m.extra.get("engine") != "llama.cpp":
        raise SimlabError(f"{out} was not recorded with llama.cpp; re-probe it with `simlab record --resume --reprobe`")
    probe = Probe(batches=_batches(batch) if batch else tuple(sorted({1, *trace.latency["batch"].astype(int)})))
    pair = _pair(m.target_model, m.draft_model, int(m.extra.get("threads", 2)))
    _, tool = _tools(jobs)
    typer.echo(f"timing the steps of {m.target_model} and {m.draft_model} again (batch sizes "
               f"{','.join(map(str, probe.batches))})...", err=True)
    trace = reprobe_trace(tool, pair, trace, probe, hardware_name("cpu"), shlex.join(["simlab", *sys.argv[1:]]))
    write_trace(trace, out)
    figures = trace.manifest.extra["reprobe"]
    other = figures["probe_other_cpu"]
    typer.echo(f"wrote {out}: {len(trace.latency)} latency samples in {figures['probe_seconds']} s (other processes "
               f"{'?' if other is None else f'{other:.0%}'} of the CPU); its prompts and tokens unchanged")


def _prompt_texts(spec: str, target: str, gguf: Path, chat: bool):
    """The prompts as llama.cpp is given them: the target's chat template applied, as ``simlab
    record`` does, from the installed tokenizer, else the GGUF file's (slower to load)."""
    from simlab.engines.llama_cpp.record import EnginePrompt
    from simlab.record.prompts import load_prompts, render

    prompts = load_prompts(spec)
    tokenizer = None
    if chat:
        from simlab.models.cache import installed_path
        from simlab.models.load import load_tokenizer, resolve

        tokenizer = load_tokenizer(resolve(target if installed_path(target) else str(gguf)))
    return [EnginePrompt(p.prompt_id, p.source, render(p, tokenizer, True).text if tokenizer else p.text)
            for p in prompts]


@llama_app.command("run")
def run_command(
    trace_path: Path = typer.Option(..., "--trace", help="A trace from `simlab llama-cpp record` (its prompts, models)."),
    n_predict: int = typer.Option(64, "--n-predict", "-n", help="llama.cpp's -n: tokens to generate per prompt."),
    draft_max: int = typer.Option(3, "--draft-max", help="llama.cpp's --draft-max (the policy's draft_max)."),
    p_min: float = typer.Option(0.0, "--p-min", help="llama.cpp's --draft-p-min (the policy's p_min)."),
    draft_min: int = typer.Option(0, "--draft-min", help="llama.cpp's --draft-min (the policy's draft_min): shorter "
                                  "drafts are discarded."),
    out: Path | None = typer.Option(None, "--out", help="Per-prompt table, measured beside predicted (.csv)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    reprobe: bool = typer.Option(False, "--reprobe", help="Time the steps again before predicting (not the trace's)."),
    jobs: int = typer.Option(2, "--jobs", help="Parallel compile jobs, if llama.cpp must be built."),
    force: Force = False,
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Predict llama-speculative-simple on a llama.cpp trace, then run it and compare its counters."""
    from tqdm import tqdm

    from simlab.live import llama_cpp as compare
    from simlab.trace.io import read_trace

    if out is not None:
        out = frame_output(out, force)
    trace = read_trace(trace_path)
    m = trace.manifest
    if m.extra.get("engine") != "llama.cpp":
        raise SimlabError(f"{trace_path} was not recorded with llama.cpp; record one with `simlab llama-cpp record`")
    if n_predict < 1 or draft_max < 1 or draft_min < 0 or not 0.0 <= p_min <= 1.0:
        raise SimlabError("-n and --draft-max must be >= 1, --draft-min >= 0 and --p-min within [0, 1]")
    binary, tool = _tools(jobs)
    pair = _pair(m.target_model, m.draft_model, int(m.extra.get("threads", 2)))
    latency = None
    if reprobe:
        from simlab.engines.llama_cpp.record import EnginePrompt
        from simlab.engines.llama_cpp.record import reprobe as time_steps

        first = trace.prompts.iloc[0]
        latency = time_steps(tool, pair, EnginePrompt(int(first.prompt_id), first.source, first.prompt_text))
    # the prediction is made (and kept) before anything is measured
    predicted = compare.predict(trace, n_predict, draft_max, p_min, draft_min, latency)
    load_before = os.getloadavg()[0]
    with tqdm(total=len(trace.prompts), desc="llama-speculative-simple", unit="prompt", disable=quiet,
              file=sys.stderr) as bar:
        measured = compare.measure(binary, pair, trace, n_predict, draft_max, p_min, draft_min,
                                   progress=lambda n: bar.update(n - bar.n))
    table = compare.compare(predicted, measured)
    summary = {"trace": portable_path(trace_path), "n_predict": n_predict, "draft_max": draft_max,
               "draft_min": draft_min, "p_min": p_min,
               "latency": "re-probed before the run" if reprobe else "the trace's",
               "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
               "command": shlex.join(["simlab", *sys.argv[1:]]),
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **compare.summary(table)}
    if out is not None:
        table.to_csv(out, index=False)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    for row in table.itertuples(index=False):
        typer.echo(f"{row.source:<28} drafted {row.measured_n_drafted:>4} / {row.predicted_n_drafted:<4} "
                   f"accepted {row.measured_n_accept:>4} / {row.predicted_n_accept:<4} "
                   f"tokens/s {row.measured_tokens_per_s:7.2f} / {row.predicted_tokens_per_s:7.2f} "
                   f"({row.error_tokens_per_s:+.1%})")
    typer.echo(f"measured / predicted over {summary['prompts']} prompts: drafted {summary['measured_n_drafted']} / "
               f"{summary['predicted_n_drafted']}, accepted {summary['measured_n_accept']} / "
               f"{summary['predicted_n_accept']}, tokens/s {summary['measured_tokens_per_s']} / "
               f"{summary['predicted_tokens_per_s']} ({summary['error_tokens_per_s']:+.1%})")

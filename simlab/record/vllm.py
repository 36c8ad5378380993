"""``simlab vllm record``: a trace whose tokens and latencies come from vLLM itself.

Three stages, each resumable (their results are kept in the trace directory's ``vllm/`` folder
and in the trace, which is rewritten after every prompt):

1. **Tokens.** vLLM's target alone (no speculation) decodes every prompt greedily, one request
   at a time, for ``max_new_tokens + tail`` tokens with ``ignore_eos``: the prompt's own output is
   the path up to its first end token or the budget, and the ``tail`` tokens after it are the
   target's continuation past the end, which vLLM verifies drafts against in a request's last
   step (``past_end.parquet``; docs/vllm.md). The same engine then times plain decoding steps at
   each probe batch size (B requests of the recorded prompts at once): the ``target_step``
   baseline.
2. **Latencies.** For each probed K, vLLM with ``draft_model`` speculation decodes B of the
   recorded prompts at once for each probe batch size; its worker times every step
   (:mod:`simlab.engines.vllm.simlab_vllm_runner`) and :mod:`simlab.engines.vllm.steps` turns them
   into draft steps and (K + 1)-token verifications as simlab prices them.
3. **Signals.** The draft's per-position signals given the true prefix (its greedy token,
   confidence, entropy, the probabilities sampling needs) and its rollouts after divergences, from
   teacher-forced passes of both models over vLLM's path with transformers, the math of
   ``simlab record`` (:func:`simlab.record.prompt_rows.path_rows`). vLLM's own draft is not asked:
   its forwards differ from transformers' only in float rounding, and ``simlab vllm run`` checks the
   result step by step against vLLM's counts.

:func:`token_agreement` runs step 1 on an existing trace's prompts instead and reports where
vLLM's tokens and the trace's differ.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from simlab.common.atomic import check_output
from simlab.common.cpu_load import OtherLoad
from simlab.common.errors import SimlabError
from simlab.engines.vllm import jobs, steps
from simlab.engines.vllm.install import locate
from simlab.record import machine
from simlab.record.prompt_rows import Models, path_rows
from simlab.record.prompts import Prompt, load_prompts, render
from simlab.record.writer import TraceWriter
from simlab.trace.io import Trace, read_trace
from simlab.trace.schema import MANIFEST, Manifest, Topology

WORK = "vllm"  # the trace directory's folder of vLLM's raw results (the runner's JSON lines)
PROBE_BATCHES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Probe:
    """What stage 2 times: K values, batch sizes, and how many tokens each probe request decodes
    (``steps`` decode steps at least: a step emits at most K + 1 tokens)."""

    ks: tuple[int, ...] = (4,)
    batches: tuple[int, ...] = PROBE_BATCHES
    steps: int = 8

    def __post_init__(self):
        if not self.ks or min(self.ks) < 1 or not self.batches or min(self.batches) < 1 or self.steps < 2:
            raise SimlabError(f"probe K values and batch sizes must be >= 1 and steps >= 2, got {self}")
        if max(self.ks) < 2:
            raise SimlabError("the probe needs a K of 2 or more among its K values: a one-token draft step is "
                              "timed only when the draft runs more than one forward a step")


@dataclass(frozen=True)
class VllmRecordConfig:
    target: str
    draft: str
    prompts: str
    out: Path
    max_new_tokens: int = 128
    tail: int = 8  # tokens recorded past each prompt's end: enough for a last step of K <= tail
    rollout: int = 16
    probe: Probe = field(default_factory=Probe)
    dtype: str = "float32"
    chat_template: bool = True
    python: str | None = None
    resume: bool = False
    force: bool = False
    command: str = ""


def _models(target: str, draft: str):
    from simlab.models.load import load_tokenizer, resolve
    from simlab.record.recorder import check_vocab

    target_ref, draft_ref = resolve(target), resolve(draft)
    for ref in (target_ref, draft_ref):
        if ref.source in ("gguf", "hub"):
            raise SimlabError(f"{ref.spec!r}: vLLM loads a model directory of safetensors here; pass an installed "
                              "model (`simlab models list`) or a local directory")
    tokenizer = load_tokenizer(target_ref)
    check_vocab(load_tokenizer(draft_ref), tokenizer, draft, target)
    return target_ref, draft_ref, tokenizer


def _eos(path: str, tokenizer) -> list[int]:
    """The target's end tokens (its generation config's and its tokenizer's), as vLLM stops on them."""
    import json

    config = Path(path) / "generation_config.json"
    ids = json.loads(config.read_text()).get("eos_token_id") if config.exists() else None
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids})


def _end(tokens: Sequence[int], budget: int, eos: set[int]) -> tuple[int, str]:
    """Where a prompt's own output ends in a path decoded past it: one past its first end token
    within the budget, else the budget."""
    for i, t in enumerate(tokens[:budget]):
        if t in eos:
            return i + 1, "eos"
    return budget, "length"


def record(cfg: VllmRecordConfig, log: Callable[[str], None] = print,
           progress: Callable[[str, int, int], None] = lambda *_: None) -> Trace:
    """Record the trace (module docstring); returns it as written."""
    if cfg.max_new_tokens < 1 or cfg.tail < 1 or cfg.rollout < 0:
        raise SimlabError("--max-new-tokens and --tail must be >= 1 and --rollout >= 0")
    if max(cfg.probe.ks) > cfg.tail:
        raise SimlabError(f"--tail {cfg.tail} is shorter than the probe's K {max(cfg.probe.ks)}: a request's last "
                          "step verifies K drafts past its end, so record at least K tokens past it")
    if not cfg.resume:
        check_output(cfg.out, "--out", directory=True, force=cfg.force, owned=MANIFEST)
        shutil.rmtree(_work_dir(cfg.out), ignore_errors=True)  # a new recording: no earlier run's results
    prompts = load_prompts(cfg.prompts)
    target_ref, draft_ref, tokenizer = _models(cfg.target, cfg.draft)
    python = locate(cfg.python)
    rendered = {p.prompt_id: render(p, tokenizer, cfg.chat_template) for p in prompts}
    eos = _eos(target_ref.path, tokenizer)
    longest = max(len(r.ids) for r in rendered.values())
    max_model_len = longest + cfg.max_new_tokens + cfg.tail + max(cfg.probe.ks) * (cfg.probe.steps + 2) + 8
    work = _work_dir(cfg.out)
    started = time.perf_counter()

    # 1. tokens, and the plain decoding steps
    requests = [jobs.Request(f"p{p.prompt_id}", rendered[p.prompt_id].ids) for p in prompts]
    ids = [r.id for r in requests]
    # the probes' requests: the recorded prompts again (q...), cycled to fill each batch size, decoding
    # probe.steps steps (a plain step emits one token; a speculative one up to K + 1)
    probe_batches = [[f"q{ids[j % len(ids)][1:]}" for j in range(b)] for b in cfg.probe.batches]
    plain = jobs.Engine(target_ref.path, cfg.dtype, max_model_len)
    sampling = {"temperature": 0.0, "ignore_eos": True}
    batches = [[i] for i in ids] + probe_batches
    requests_plain = [jobs.Request(r.id, r.prompt_token_ids, {"max_tokens": cfg.max_new_tokens + cfg.tail})
                      for r in requests] + _probe_requests(requests, cfg.probe.steps)
    log(f"vllm record: {len(prompts)} prompts through vLLM's {cfg.target} (no speculation), then its plain steps at "
        f"batch sizes {','.join(map(str, cfg.probe.batches))}")
    load = OtherLoad()
    generated = jobs.run(python, plain, requests_plain, batches, work / "generate.jsonl", sampling,
                         progress=lambda n: progress("tokens", n, len(batches)))
    generate_other = load.share()
    paths = {rid: generated.batches[i].requests[rid] for i, rid in enumerate(ids)}

    # 2. speculative steps, by K and batch size
    probes = {}
    load = OtherLoad()
    for k in cfg.probe.ks:
        engine = jobs.Engine(target_ref.path, cfg.dtype, max_model_len,
                             {"method": "draft_model", "model": draft_ref.path, "num_speculative_tokens": k})
        log(f"vllm record: timing vLLM's steps with K={k} drafts at batch sizes "
            f"{','.join(map(str, cfg.probe.batches))}")
        out = jobs.run(python, engine, _probe_requests(requests, cfg.probe.steps * (k + 1)), probe_batches,
                       work / f"probe-k{k}.jsonl", sampling,
                       progress=lambda n, k=k: progress(f"steps K={k}", n, len(probe_batches)))
        probes[k] = list(out.batches.values())
    probe_other = load.share()
    samples = steps.latency_rows(probes, plain=list(generated.batches.values()))
    latency, spread = samples.table, steps.scatter(samples.table)

    # 3. signals with transformers, prompt by prompt (each committed)
    manifest = _manifest(cfg, tokenizer, eos, generated.engine, {
        "probe": {"ks": list(cfg.probe.ks), "batches": list(cfg.probe.batches), "steps": cfg.probe.steps,
                  "other_cpu": probe_other, "disturbed_steps": samples.disturbed,
                  "median_iqr_share": _median(spread, "iqr_share"),
                  "median_range_share": _median(spread, "range_share")},
        "generate_other_cpu": generate_other})
    existing = _existing(cfg)
    if existing is not None:
        _carry(existing.manifest, manifest)
    writer = TraceWriter(cfg.out, manifest, latency, with_layers=False, fresh=existing is None)
    if existing is not None:
        writer.add({name: existing.table(name) for name in ("prompts", "positions", "rollouts", "past_end")
                    if existing.table(name) is not None})
    done = set(writer.table("prompts")["prompt_id"].tolist())
    writer.commit(started)
    if work != cfg.out / WORK:  # the trace exists now: its raw results go inside it
        shutil.rmtree(cfg.out / WORK, ignore_errors=True)
        shutil.move(str(work), str(cfg.out / WORK))
    todo = [p for p in prompts if p.prompt_id not in done]
    if todo:
        log(f"vllm record: the draft's signals and rollouts on vLLM's paths ({len(todo)} prompts, transformers)")
        models = _load_models(cfg, target_ref, draft_ref, tokenizer)
        for i, prompt in enumerate(todo):
            writer.add(_prompt_rows(models, prompt, rendered[prompt.prompt_id], paths[f"p{prompt.prompt_id}"],
                                    cfg.max_new_tokens, set(eos)))
            writer.commit(started)
            progress("signals", i + 1, len(todo))
    return read_trace(cfg.out)


def _probe_requests(requests: list[jobs.Request], tokens: int) -> list[jobs.Request]:
    return [jobs.Request(f"q{r.id[1:]}", r.prompt_token_ids, {"max_tokens": tokens}) for r in requests]


def _work_dir(out: Path) -> Path:
    """Where vLLM's raw results go: inside the trace once it exists (written last, so a trace
    directory is whole or absent), beside it until then."""
    inside = out / WORK
    if (out / MANIFEST).exists():
        return inside
    return out.parent / f".{out.name}.{WORK}"


def _median(table: pd.DataFrame, column: str) -> float | None:
    return round(float(table[column].median()), 4) if len(table) else None


def _existing(cfg: VllmRecordConfig) -> Trace | None:
    if not cfg.resume or not (cfg.out / MANIFEST).exists():
        return None
    trace = read_trace(cfg.out, allow_empty=True)
    m = trace.manifest
    if m.extra.get("engine") != "vllm" or (m.target_model, m.draft_model, m.dataset, m.max_new_tokens) != (
            cfg.target, cfg.draft, cfg.prompts, cfg.max_new_tokens):
        raise SimlabError(f"--resume: {cfg.out} holds another recording ({m.target_model} <- {m.draft_model}, "
                          f"{m.dataset}, {m.max_new_tokens} tokens); pass the same options or another --out")
    return trace


# what a resumed recording keeps of the run it resumes: its running figures (TraceWriter adds this
# run's to them) and when it began
_RUNNING = ("wall_seconds", "peak_rss_mb", "other_cpu", "other_cpu_seconds")


def _carry(before: Manifest, manifest: Manifest) -> None:
    """Keep, in a resumed recording's ``manifest``, what the earlier run measured: its running
    figures, its start, and the load beside vLLM's jobs where this run re-ran none of them (their
    results came from disk, so this run's share is None: it saw no job)."""
    manifest.created = before.created
    for key in _RUNNING:
        if key in before.extra:
            manifest.extra[key] = before.extra[key]
    if manifest.extra.get("generate_other_cpu") is None:
        manifest.extra["generate_other_cpu"] = before.extra.get("generate_other_cpu")
    probe, old = manifest.extra["probe"], before.extra.get("probe") or {}
    if probe.get("other_cpu") is None:
        probe["other_cpu"] = old.get("other_cpu")


def _manifest(cfg: VllmRecordConfig, tokenizer, eos: list[int], engine: dict | None, extra: dict) -> Manifest:
    versions = machine.library_versions()
    if engine:
        versions["vllm"] = engine.get("vllm", "")
    return Manifest(
        kind="recorded", draft_model=cfg.draft, target_model=cfg.target, dataset=cfg.prompts,
        hardware=machine.hardware_name("cpu"), device="cpu", dtype=cfg.dtype,
        tokenizer=f"{cfg.target} ({type(tokenizer).__name__}, {len(tokenizer)} tokens)", temperature=0.0,
        max_new_tokens=cfg.max_new_tokens, rollout_len=cfg.rollout, topology=Topology.ONE_DEVICE.value,
        eos_token_ids=eos, command=cfg.command, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        libraries=versions,
        notes="vLLM engine: tokens and latencies from vLLM; signals and rollouts from transformers on vLLM's path",
        extra={"engine": "vllm", "chat_template": bool(cfg.chat_template and tokenizer.chat_template),
               "tail": cfg.tail, "prefix_caching": False,
               "omp_threads": engine.get("omp_threads") if engine else None, **extra},
    )


def _load_models(cfg: VllmRecordConfig, target_ref, draft_ref, tokenizer) -> Models:
    from simlab.models.load import load_model

    return Models(tokenizer=tokenizer, target=load_model(target_ref, "cpu", cfg.dtype),
                  draft=load_model(draft_ref, "cpu", cfg.dtype), exit_layers=[], draft_layer=-1,
                  chat_template=cfg.chat_template, max_new_tokens=cfg.max_new_tokens, temperature=0.0, seed=0,
                  rollout=cfg.rollout)


def _prompt_rows(m: Models, prompt: Prompt, rendered, result: jobs.RequestResult, budget: int,
                 eos: set[int]) -> dict[str, pd.DataFrame]:
    path = np.asarray(result.token_ids, dtype=np.int64)
    end, stop = _end(result.token_ids, budget, eos)
    t0 = time.perf_counter()
    rows, rollout = path_rows(m, prompt.prompt_id, rendered.ids, path, end)
    signals = time.perf_counter() - t0 - rollout
    rows["prompts"] = pd.DataFrame({
        "prompt_id": [prompt.prompt_id], "source": [prompt.source], "prompt_len": [len(rendered.ids)],
        "n_tokens": [end], "stop": [stop], "prompt_text": [rendered.text], "prompt_token_ids": [list(rendered.ids)],
        "generate_seconds": [result.decode_seconds], "signals_seconds": [signals], "rollout_seconds": [rollout]})
    return rows


@dataclass(frozen=True)
class Agreement:
    """vLLM's greedy tokens beside a trace's, per prompt."""

    table: pd.DataFrame  # prompt_id, positions, equal, first_difference (-1: none)

    @property
    def equal(self) -> int:
        return int(self.table["equal"].sum())

    @property
    def positions(self) -> int:
        return int(self.table["positions"].sum())


def token_agreement(trace: Trace, target: str, python: str | None, out: Path,
                    progress: Callable[[int], None] = lambda _: None) -> Agreement:
    """vLLM's target decodes the trace's prompts (their recorded token ids) greedily, as many
    tokens as the trace holds for each, stopping at its end tokens; where do the tokens differ?"""
    from simlab.models.load import resolve

    ref = resolve(target)
    check_tokenizer(trace, ref)
    prompts = trace.prompts.sort_values("prompt_id")
    reqs = [jobs.Request(f"p{int(p.prompt_id)}", [int(x) for x in p.prompt_token_ids], {"max_tokens": int(p.n_tokens)})
            for p in prompts.itertuples(index=False)]
    longest = max(len(r.prompt_token_ids) for r in reqs) + int(prompts["n_tokens"].max()) + 8
    engine = jobs.Engine(ref.path, trace.manifest.dtype if trace.manifest.dtype in ("float32", "bfloat16",
                                                                                  "float16") else "float32", longest)
    result = jobs.run(locate(python), engine, reqs, [[r.id] for r in reqs], out, {"temperature": 0.0},
                      progress=progress)
    rows = []
    positions = trace.positions.sort_values(["prompt_id", "pos"])
    for b, r in enumerate(reqs):
        got = result.batches[b].requests[r.id].token_ids
        want = positions.loc[positions["prompt_id"] == int(r.id[1:]), "target_token"].tolist()
        same = [a == w for a, w in zip(got, want)]
        first = next((i for i, s in enumerate(same) if not s), -1 if len(got) == len(want) else min(len(got), len(want)))
        rows.append({"prompt_id": int(r.id[1:]), "positions": len(want), "vllm_tokens": len(got),
                     "equal": int(np.sum(same)), "first_difference": first})
    return Agreement(pd.DataFrame(rows))


def check_tokenizer(trace: Trace, ref) -> None:
    """The trace's prompt token ids must be what the model's tokenizer makes of its prompt texts:
    vLLM is given the ids, and another tokenizer's ids are other words."""
    from simlab.models.load import load_tokenizer

    tokenizer = load_tokenizer(ref)
    first = trace.prompts.sort_values("prompt_id").iloc[0]
    if "prompt_token_ids" not in trace.prompts.columns:
        raise SimlabError("the trace holds no prompt token ids (prompts.parquet prompt_token_ids); record it again")
    ids = [int(x) for x in first.prompt_token_ids]
    mine = tokenizer(first.prompt_text, add_special_tokens=False)["input_ids"]
    if not mine or list(mine) != ids[-len(mine):]:
        raise SimlabError(f"the trace's prompts were tokenized by another tokenizer than {ref.spec!r}'s ("
                          f"{trace.manifest.tokenizer}); pass the trace's own target model")

"""The recording loop: real models, real prompts, one trace written after every prompt.

Per prompt:

1. the target decodes with ``generate`` (its output path and raw logits, see ``decode``);
2. the draft runs one teacher-forced pass over the prompt and that path, giving its greedy
   token, confidence, entropy and probabilities at every position (``forward``, ``signals``);
   for self-speculative traces the target's own teacher-forced pass gives every exit layer's
   early-exit token and confidence, and the chosen ``draft_layer`` fills the draft columns;
3. after every divergence the draft continues on its own for ``rollout`` tokens, all of a
   prompt's rollouts in one batch branching from the teacher-forced cache (``rollouts``);
4. the trace is rewritten crash-safely, so an interrupted recording loses at most the prompt
   in flight and ``resume`` continues from what is on disk.

Latencies are probed once, before the first prompt, and committed with an empty prompt list
so that a long recording interrupted early keeps its probe. The share of CPU time other
processes took meanwhile is stored with it; ``reprobe`` measures again on a quieter machine
without recording the prompts again.

Every problem with the user's input (unknown model or prompts, vocabularies that differ, a
trace recorded with other settings) is found before any model runs, and raised as
:class:`~simlab.errors.SimlabError`.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from simlab.errors import SimlabError
from simlab.models.load import ModelRef, eos_token_ids, load_model, load_tokenizer, resolve
from simlab.record import machine
from simlab.record.decode import decode, neutralise
from simlab.record.forward import exit_logits, forced_pass, n_layers, truncated
from simlab.record.latency import DEFAULT_PROBE, ProbePlan, probe_latency
from simlab.record.prompts import Prompt, load_prompts, render
from simlab.record.ranges import int_ranges
from simlab.record.rollouts import Rollout, rollouts
from simlab.record.signals import GreedyStats, greedy_stats, position_signals
from simlab.trace.io import Trace, empty_table, read_trace, write_trace
from simlab.trace.schema import MANIFEST, NO_LAYER, Manifest

# Manifest fields that must match for --resume to append to an existing trace.
RESUME_FIELDS = (
    "draft_model",
    "target_model",
    "dataset",
    "hardware",
    "device",
    "dtype",
    "temperature",
    "seed",
    "max_new_tokens",
    "rollout_len",
    "exit_layers",
    "draft_layer",
)


@dataclass
class RecordConfig:
    """What ``simlab record`` was asked to do."""

    target: str
    prompts: str
    out: Path
    draft: str | None = None
    max_new_tokens: int = 128
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str | None = None  # None: float32 on cpu, bfloat16 on cuda
    temperature: float = 0.0
    seed: int = 0
    rollout: int = 16
    exit_layers: str | None = None  # "all", "20-29", "8,16,24"
    draft_layer: int | None = None  # self-speculative: default the deepest exit layer
    latency_probe: str = DEFAULT_PROBE
    resume: bool = False
    reprobe: bool = False  # with resume: measure latencies again, keep the recorded prompts
    chat_template: bool = True
    command: str = ""
    progress: bool = True


@dataclass
class RecordResult:
    path: Path
    recorded: int  # prompts recorded by this call
    total: int  # prompts in the trace now
    tokens: int  # positions in the trace now
    agreement: float  # fraction of positions where the draft's greedy token is the target's
    seconds: float  # wall time of this call


@dataclass
class _Tables:
    """The trace's rows so far, one list of frames per table."""

    prompts: list[pd.DataFrame] = field(default_factory=list)
    positions: list[pd.DataFrame] = field(default_factory=list)
    rollouts: list[pd.DataFrame] = field(default_factory=list)
    layers: list[pd.DataFrame] = field(default_factory=list)

    def frame(self, name: str) -> pd.DataFrame:
        frames = [f for f in getattr(self, name) if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else empty_table(name)


def _check_args(cfg: RecordConfig) -> None:
    if cfg.max_new_tokens < 1:
        raise SimlabError(f"--max-new-tokens must be at least 1, got {cfg.max_new_tokens}")
    if cfg.rollout < 0:
        raise SimlabError(f"--rollout must be >= 0, got {cfg.rollout}")
    if not cfg.temperature >= 0:
        raise SimlabError(f"--temperature must be >= 0, got {cfg.temperature}")
    if cfg.draft is None and cfg.exit_layers is None:
        raise SimlabError("pass --draft, or --exit-layers for a self-speculative trace (the target's first layers)")
    if cfg.draft is not None and cfg.draft_layer is not None:
        raise SimlabError("--draft-layer is for self-speculative traces; drop it or drop --draft")


def _check_vocab(draft_tok, target_tok, draft: str, target: str) -> None:
    """Speculative decoding compares token ids: both models must share one vocabulary."""
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if dv == tv:
        return
    only = sorted(set(dv.items()) ^ set(tv.items()), key=lambda kv: kv[1])[:1]
    raise SimlabError(
        f"draft {draft!r} and target {target!r} have different vocabularies ({len(dv)} vs {len(tv)} tokens; "
        f"e.g. {only[0][0]!r} -> {only[0][1]} in only one); speculative decoding needs one tokenizer"
    )


def _exit_layers(spec: str | None, layers: int) -> list[int]:
    if spec is None:
        return []
    if spec.strip() == "all":
        return list(range(1, layers))
    try:
        chosen = list(int_ranges(spec))
    except ValueError as exc:
        raise SimlabError(f"--exit-layers: {exc} (or 'all')") from None
    if chosen[0] < 1 or chosen[-1] >= layers:
        raise SimlabError(f"--exit-layers must lie in 1..{layers - 1} (the target has {layers} layers)")
    return chosen


def _target_layers(ref: ModelRef) -> int:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(ref.path, **ref.pretrained_kwargs())
    return int(config.get_text_config().num_hidden_layers)


def _open_existing(cfg: RecordConfig, manifest: Manifest) -> Trace | None:
    """The trace to continue (``--resume``), or None when ``cfg.out`` holds no trace yet."""
    if not (cfg.out / MANIFEST).exists():
        if cfg.out.exists() and any(cfg.out.iterdir()):
            raise SimlabError(f"--out {cfg.out} exists and is not a trace; choose another directory")
        return None
    if not cfg.resume:
        raise SimlabError(f"{cfg.out} already holds a trace; pass --resume to continue it, or choose another --out")
    trace = read_trace(cfg.out)
    old, new = trace.manifest.to_dict(), manifest.to_dict()
    for name in RESUME_FIELDS:
        if old[name] != new[name]:
            raise SimlabError(
                f"cannot resume {cfg.out}: it was recorded with {name}={old[name]!r}, this run has {new[name]!r}"
            )
    if old["extra"].get("chat_template") != new["extra"]["chat_template"]:
        raise SimlabError(f"cannot resume {cfg.out}: its chat-template setting differs from this run's")
    return trace


def record(cfg: RecordConfig) -> RecordResult:
    """Record (or continue) the trace ``cfg.out``; see the module docstring for the steps."""
    started = time.perf_counter()
    _check_args(cfg)
    prompts = load_prompts(cfg.prompts)
    target_ref = resolve(cfg.target)
    draft_ref = resolve(cfg.draft) if cfg.draft is not None else None
    device = cfg.device or machine.default_device()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SimlabError("--device cuda: no CUDA device is available here (use --device cpu)")
    dtype = cfg.dtype or ("float32" if device == "cpu" else "bfloat16")
    plan = ProbePlan.parse(cfg.latency_probe)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = load_tokenizer(target_ref)
    if draft_ref is not None:
        _check_vocab(load_tokenizer(draft_ref), tokenizer, cfg.draft, cfg.target)
    layers = _target_layers(target_ref)
    exits = _exit_layers(cfg.exit_layers, layers)
    draft_layer = NO_LAYER
    if draft_ref is None:
        draft_layer = cfg.draft_layer if cfg.draft_layer is not None else exits[-1]
        if draft_layer not in exits:
            raise SimlabError(f"--draft-layer {draft_layer} must be one of --exit-layers {exits}")

    manifest = Manifest(
        kind="recorded",
        draft_model=cfg.draft if cfg.draft is not None else f"{cfg.target}[:{draft_layer}]",
        target_model=cfg.target,
        dataset=cfg.prompts,
        hardware=machine.hardware_name(device),
        device=device,
        dtype=dtype,
        tokenizer=f"{cfg.target} ({type(tokenizer).__name__}, {len(tokenizer)} tokens)",
        temperature=float(cfg.temperature),
        seed=cfg.seed,
        max_new_tokens=cfg.max_new_tokens,
        rollout_len=cfg.rollout,
        exit_layers=exits,
        n_layers=layers,
        draft_layer=draft_layer,
        command=cfg.command,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        libraries=machine.library_versions(),
        extra={
            "chat_template": bool(cfg.chat_template and tokenizer.chat_template),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        },
    )
    existing = _open_existing(cfg, manifest)

    target = load_model(target_ref, device, dtype)
    draft = load_model(draft_ref, device, dtype) if draft_ref is not None else None
    eos = eos_token_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    neutralise(target, eos, pad)
    manifest.eos_token_ids = eos

    tables = _Tables()
    if existing is not None:
        latency = existing.latency
        manifest = replace(
            existing.manifest,
            extra={**existing.manifest.extra, "resumed": [*existing.manifest.extra.get("resumed", []), cfg.command]},
        )
        for name in ("prompts", "positions", "rollouts", "layers"):
            df = existing.table(name)
            if df is not None:
                getattr(tables, name).append(df)
    if existing is None or cfg.reprobe:
        probe_started = time.perf_counter()
        load = machine.OtherLoad()
        latency = probe_latency(target, draft, exits, plan, len(tokenizer), log=_log if cfg.progress else _quiet)
        manifest.extra.update(
            latency_probe=plan.to_dict(),
            probe_seconds=round(time.perf_counter() - probe_started, 1),
            probe_other_cpu=load.share(),
            threads=torch.get_num_threads(),
        )
    done = set(tables.frame("prompts")["prompt_id"].tolist())
    todo = [p for p in prompts if p.prompt_id not in done]
    previous_wall = float(manifest.extra.get("wall_seconds", 0.0))
    previous_rss = float(manifest.extra.get("peak_rss_mb", 0.0))
    cfg.out.mkdir(parents=True, exist_ok=True)
    load = machine.OtherLoad()

    def commit() -> None:
        prompts_df = tables.frame("prompts")
        positions = tables.frame("positions")
        manifest.extra.update(
            wall_seconds=round(previous_wall + time.perf_counter() - started, 1),
            peak_rss_mb=round(max(previous_rss, machine.peak_rss_mb()), 1),
            other_cpu=load.share(),  # of this run's recording (after the probe)
            **_summary(prompts_df, positions),
        )
        trace = Trace(
            manifest=manifest,
            prompts=prompts_df,
            positions=positions,
            rollouts=tables.frame("rollouts"),
            latency=latency,
            layers=tables.frame("layers") if exits else None,
        )
        write_trace(trace, cfg.out)

    commit()
    recording = _Recording(cfg, tokenizer, target, draft, exits, draft_layer, set(eos))
    tokens = 0
    loop_started = time.perf_counter()
    from tqdm import tqdm

    with tqdm(total=len(todo), unit="prompt", desc=cfg.out.name, file=sys.stderr, disable=not cfg.progress) as bar:
        for prompt in todo:
            rows = recording.prompt(prompt)
            for name, df in rows.items():
                getattr(tables, name).append(df)
            commit()
            tokens += len(rows["positions"])
            agree = _agreement(tables.frame("positions"))
            bar.set_postfix_str(f"{tokens / (time.perf_counter() - loop_started):.2f} tok/s, agree {agree:.2f}")
            bar.update(1)
    positions = tables.frame("positions")
    return RecordResult(
        path=cfg.out,
        recorded=len(todo),
        total=len(tables.frame("prompts")),
        tokens=len(positions),
        agreement=_agreement(positions),
        seconds=time.perf_counter() - started,
    )


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _quiet(message: str) -> None:
    return None


def _agreement(positions: pd.DataFrame) -> float:
    if positions.empty:
        return float("nan")
    return float((positions["draft_token"] == positions["target_token"]).mean())


def _summary(prompts: pd.DataFrame, positions: pd.DataFrame) -> dict:
    """Manifest figures: agreement and what recording cost relative to plain generation."""
    if prompts.empty:
        return {}
    gen = float(prompts["generate_seconds"].sum())
    signals = float(prompts["signals_seconds"].sum())
    roll = float(prompts["rollout_seconds"].sum())
    return {
        "agreement": round(_agreement(positions), 4),
        "cost": {
            "generate_seconds": round(gen, 2),
            "signals_seconds": round(signals, 2),
            "rollout_seconds": round(roll, 2),
            "ratio_without_rollouts": round((gen + signals) / gen, 3),
            "ratio_with_rollouts": round((gen + signals + roll) / gen, 3),
        },
    }


@dataclass
class _Recording:
    """Records one prompt at a time with loaded models."""

    cfg: RecordConfig
    tokenizer: object
    target: object
    draft: object | None
    exits: list[int]
    draft_layer: int
    eos: set[int]

    def prompt(self, prompt: Prompt) -> dict[str, pd.DataFrame]:
        rendered = render(prompt, self.tokenizer, self.cfg.chat_template)
        device = self.target.device
        ids = torch.tensor([rendered.ids], device=device)
        t0 = time.perf_counter()
        out = decode(self.target, ids, self.cfg.max_new_tokens, self.cfg.temperature, self.cfg.seed, prompt.prompt_id)
        t1 = time.perf_counter()
        layer_rows = None
        if self.exits:
            tforced = forced_pass(self.target, ids, out.tokens, hidden=True)
            layer_rows = self._layer_rows(prompt.prompt_id, tforced.hidden)
        if self.draft is not None:
            forced = forced_pass(self.draft, ids, out.tokens)
            draft_logits = forced.logits
        else:
            forced = tforced
            draft_logits = exit_logits(self.target, tforced.hidden, self.draft_layer)
        signals = position_signals(draft_logits, out.logits, out.tokens, self.cfg.temperature)
        t2 = time.perf_counter()
        target_tokens = out.tokens.cpu().numpy()
        diverged = [int(t) for t in np.flatnonzero(signals.draft.token != target_tokens)]
        runs: list[Rollout] = []
        if diverged and self.cfg.rollout > 0:
            first = [int(signals.draft.token[t]) for t in diverged]
            with self._drafter() as drafter:
                runs = rollouts(drafter, forced.cache, len(rendered.ids), diverged, first, self.cfg.rollout, self.eos)
        t3 = time.perf_counter()
        n = len(target_tokens)
        pid = prompt.prompt_id
        tables = {
            "prompts": pd.DataFrame(
                {
                    "prompt_id": [pid],
                    "source": [prompt.source],
                    "prompt_len": [len(rendered.ids)],
                    "n_tokens": [n],
                    "stop": [out.stop],
                    "prompt_text": [rendered.text],
                    "prompt_token_ids": [list(rendered.ids)],
                    "generate_seconds": [t1 - t0],
                    "signals_seconds": [t2 - t1],
                    "rollout_seconds": [t3 - t2],
                }
            ),
            "positions": pd.DataFrame(
                {
                    "prompt_id": pid,
                    "pos": np.arange(n),
                    "target_token": target_tokens,
                    "draft_token": signals.draft.token,
                    "draft_conf": signals.draft.conf,
                    "draft_entropy": signals.draft.entropy,
                    "q_target": signals.q_target,
                    "p_target": signals.p_target,
                    "p_draft": signals.p_draft,
                    "accept_prob": signals.accept_prob,
                }
            ),
            "rollouts": _rollout_rows(pid, runs),
        }
        if layer_rows is not None:
            tables["layers"] = layer_rows
        return tables

    def _drafter(self) -> AbstractContextManager:
        """The draft model as it is, or the target cut at the draft layer."""
        if self.draft is not None:
            return nullcontext(self.draft)
        return truncated(self.target, self.draft_layer)

    def _layer_rows(self, prompt_id: int, hidden: tuple[torch.Tensor, ...]) -> pd.DataFrame:
        frames = []
        for layer in self.exits:
            stats: GreedyStats = greedy_stats(exit_logits(self.target, hidden, layer))
            frames.append(
                pd.DataFrame(
                    {
                        "prompt_id": prompt_id,
                        "pos": np.arange(len(stats.token)),
                        "layer": layer,
                        "token": stats.token,
                        "draft_conf": stats.conf,
                        "draft_entropy": stats.entropy,
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)


def _rollout_rows(prompt_id: int, runs: list[Rollout]) -> pd.DataFrame:
    if not runs:
        return empty_table("rollouts")
    return pd.DataFrame(
        {
            "prompt_id": prompt_id,
            "pos": np.concatenate([np.full(len(r.tokens), r.pos) for r in runs]),
            "step": np.concatenate([np.arange(1, len(r.tokens) + 1) for r in runs]),
            "token": np.concatenate([r.tokens for r in runs]),
            "draft_conf": np.concatenate([r.conf for r in runs]),
            "draft_entropy": np.concatenate([r.entropy for r in runs]),
        }
    )

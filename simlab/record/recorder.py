"""``simlab record``: check the request, load the models, probe latencies, record prompts.

Every problem with the user's input (unknown model or prompts, vocabularies that differ, a
trace recorded with other settings) is found before any model runs, and raised as
:class:`~simlab.common.errors.SimlabError`. Then the models load, latencies are probed (once, before
the first prompt, and committed with an empty prompt list so that a long recording
interrupted early keeps its probe; ``reprobe`` measures them again on a quieter machine,
or on another one, whose name the manifest then carries, without recording the prompts again) and the prompts are recorded one by one
(``prompt_rows``), the trace being rewritten after each (``writer``).

``--rollout-layers`` gives exit layers their own divergence rollouts (what DEL or LayerSkip
see drafting past a mistake with a layer other than the draft's). ``--resume`` adds them to the
prompts already recorded, committing each prompt and layer as it is done, before recording any
new prompt with all of them; a layer the trace already lists (the manifest's
``rollout_layers``) is kept for new prompts without being asked again. ``--resume`` also
records again the rollouts of prompts recorded before rollouts had a tail past the path's end
(``simlab.record.rollouts``), or at another length than ``--rollout`` asks for, the draft's
and each listed layer's, prompt by prompt.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from simlab.common.atomic import check_output
from simlab.common.cpu_load import OtherLoad
from simlab.common.errors import SimlabError
from simlab.common.params import check_device, check_seed, check_temperature
from simlab.models.load import ModelRef, eos_token_ids, load_model, load_tokenizer, resolve, torch_dtype
from simlab.record import machine
from simlab.record.decode import neutralise
from simlab.record.latency import DEFAULT_PROBE, ProbePlan, probe_latency
from simlab.record.prompt_rows import Models, draft_rollouts, forced_cache, layer_rollouts, record_prompt
from simlab.record.prompts import Prompt, load_prompts
from simlab.record.ranges import int_ranges
from simlab.record.writer import ROW_TABLES, TraceWriter, agreement
from simlab.trace.io import Trace, read_trace
from simlab.trace.schema import MANIFEST, NO_LAYER, Manifest, Topology, with_defaults

DEFAULT_ROLLOUT = 16  # draft tokens after each divergence, and past the path's end

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
    "exit_layers",
    "draft_layer",
    "topk",
    "tree_depth",
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
    rollout: int | None = None  # None: 16, or with resume the trace's; another on resume records them again
    exit_layers: str | None = None  # "all", "20-29", "8,16,24"
    rollout_layers: str | None = None  # exit layers with their own rollouts: "all", "1-3"; None: the draft's only
    draft_layer: int | None = None  # self-speculative: default the deepest exit layer
    topk: int = 0  # the draft's top-K per position (tree policies); 0: none
    tree_depth: int = 0  # EAGLE-2 candidate trees of top-k ``topk`` and this depth; 0: none
    latency_probe: str = DEFAULT_PROBE
    resume: bool = False
    reprobe: bool = False  # with resume: measure latencies again, keep the recorded prompts
    # with resume: record again the rollouts this version records otherwise (before tails, another length);
    # False keeps them as they are (a re-probe that is to change nothing but the latencies)
    rollouts_again: bool = True
    force: bool = False  # replace a trace already in out
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
    layer_rollouts: int = 0  # (prompt, exit layer) rollout sets recorded by this call


def _check_args(cfg: RecordConfig) -> None:
    if cfg.max_new_tokens < 1:
        raise SimlabError(f"--max-new-tokens must be at least 1, got {cfg.max_new_tokens}")
    if cfg.rollout is not None and cfg.rollout < 0:
        raise SimlabError(f"--rollout must be >= 0, got {cfg.rollout}")
    check_seed(cfg.seed)
    check_temperature(cfg.temperature)
    check_device(cfg.device)
    if cfg.draft is None and cfg.exit_layers is None:
        raise SimlabError("pass --draft, or --exit-layers for a self-speculative trace (the target's first layers)")
    if cfg.topk < 0 or cfg.tree_depth < 0:
        raise SimlabError(f"--topk and --tree-depth must be >= 0, got {cfg.topk} and {cfg.tree_depth}")
    if cfg.tree_depth and cfg.topk < 1:
        raise SimlabError("--tree-depth expands each tree node into its top-K candidates: pass --topk K too")
    if cfg.draft is not None and cfg.draft_layer is not None:
        raise SimlabError("--draft-layer is for self-speculative traces; drop it or drop --draft")


def check_vocab(draft_tok, target_tok, draft: str, target: str) -> None:
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


def _rollout_layers(spec: str | None, exits: list[int], draft_layer: int) -> list[int]:
    """The exit layers to give their own rollouts; the draft layer's are the draft's, recorded anyway."""
    if spec is None:
        return []
    if not exits:
        raise SimlabError("--rollout-layers needs --exit-layers: a layer's rollouts start where its recorded "
                          "early-exit token differs from the target's")
    if spec.strip() == "all":
        chosen = exits
    else:
        try:
            chosen = list(int_ranges(spec))
        except ValueError as exc:
            raise SimlabError(f"--rollout-layers: {exc} (or 'all')") from None
    unknown = sorted(set(chosen) - set(exits))
    if unknown:
        raise SimlabError(f"--rollout-layers {unknown} are not among the exit layers {exits}")
    return [layer for layer in chosen if layer != draft_layer]


def _target_layers(ref: ModelRef) -> int:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(ref.path, **ref.pretrained_kwargs())
    return int(config.get_text_config().num_hidden_layers)


def _open_existing(cfg: RecordConfig, manifest: Manifest, prompt_ids: set[int]) -> Trace | None:
    """The trace to continue (``--resume``), or None when this run starts a new one in ``cfg.out``
    (an existing trace there is replaced only with ``--force``, once the first commit is written).

    A trace from other hardware is continued only to measure its latencies here (``--reprobe``),
    or to add exit layers' rollouts when it holds every prompt already: that run measures no
    latency and records no prompt, and the manifest says where the rollouts were computed.
    """
    if (cfg.out / MANIFEST).exists() and not cfg.force:
        if not cfg.resume:
            raise SimlabError(f"{cfg.out} already holds a trace; pass --resume to continue it, --force to "
                              "replace it, or choose another --out")
    else:
        check_output(cfg.out, "--out", force=cfg.force, directory=True, owned=MANIFEST)
        return None
    trace = read_trace(cfg.out, allow_empty=True)
    old, new = trace.manifest.to_dict(), manifest.to_dict()
    layers_only = cfg.rollout_layers is not None and prompt_ids <= set(trace.prompts["prompt_id"].tolist())
    for name in RESUME_FIELDS:
        if name == "hardware" and (cfg.reprobe or layers_only):
            continue
        if old[name] != new[name]:
            raise SimlabError(
                f"cannot resume {cfg.out}: it was recorded with {name}={old[name]!r}, this run has {new[name]!r}"
            )
    if old["extra"].get("chat_template") != new["extra"]["chat_template"]:
        raise SimlabError(f"cannot resume {cfg.out}: its chat-template setting differs from this run's")
    return trace


@dataclass
class _Setup:
    """Everything decided before a model loads."""

    prompts: list[Prompt]
    target_ref: ModelRef
    draft_ref: ModelRef | None
    tokenizer: object
    device: str
    dtype: str
    probe: ProbePlan
    exit_layers: list[int]
    draft_layer: int
    rollout_layers: list[int]  # asked for now, and those the trace to resume lists
    manifest: Manifest
    existing: Trace | None


def _prepare(cfg: RecordConfig) -> _Setup:
    _check_args(cfg)
    prompts = load_prompts(cfg.prompts)
    target_ref = resolve(cfg.target)
    draft_ref = resolve(cfg.draft) if cfg.draft is not None else None
    device = cfg.device or machine.default_device()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SimlabError("--device cuda: no CUDA device is available here (use --device cpu)")
    dtype = cfg.dtype or ("float32" if device == "cpu" else "bfloat16")
    torch_dtype(dtype)  # an unknown --dtype fails here, before any model loads
    probe = ProbePlan.parse(cfg.latency_probe, trees=cfg.topk > 0, exits=cfg.exit_layers is not None)
    tokenizer = load_tokenizer(target_ref)
    if draft_ref is not None:
        check_vocab(load_tokenizer(draft_ref), tokenizer, cfg.draft, cfg.target)
    layers = _target_layers(target_ref)
    exits = _exit_layers(cfg.exit_layers, layers)
    draft_layer = NO_LAYER
    if draft_ref is None:
        draft_layer = cfg.draft_layer if cfg.draft_layer is not None else exits[-1]
        if draft_layer not in exits:
            raise SimlabError(f"--draft-layer {draft_layer} must be one of --exit-layers {exits}")
    asked = _rollout_layers(cfg.rollout_layers, exits, draft_layer)
    manifest = Manifest(
        kind="recorded",
        draft_model=cfg.draft if cfg.draft is not None else f"{cfg.target}[:{draft_layer}]",
        target_model=cfg.target,
        dataset=cfg.prompts,
        hardware=machine.hardware_name(device),
        device=device,
        topology=Topology.ONE_DEVICE.value,  # both models are loaded on ``device``
        dtype=dtype,
        tokenizer=f"{cfg.target} ({type(tokenizer).__name__}, {len(tokenizer)} tokens)",
        temperature=float(cfg.temperature),
        seed=cfg.seed,
        max_new_tokens=cfg.max_new_tokens,
        rollout_len=DEFAULT_ROLLOUT if cfg.rollout is None else cfg.rollout,
        exit_layers=exits,
        n_layers=layers,
        draft_layer=draft_layer,
        topk=cfg.topk,
        tree_depth=cfg.tree_depth,
        command=cfg.command,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        libraries=machine.library_versions(),
        extra={
            "chat_template": bool(cfg.chat_template and tokenizer.chat_template),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        },
    )
    existing = _open_existing(cfg, manifest, {p.prompt_id for p in prompts})
    if not probe.single and (existing is None or not cfg.reprobe):
        raise SimlabError(f"--latency-probe {cfg.latency_probe!r}: a new trace needs the single-sequence series "
                          "(batch=1 among the batch sizes); leaving it out is for --resume --reprobe of a trace")
    if not probe.single and existing.manifest.hardware != manifest.hardware:
        # the kept series would be another machine's under this machine's name
        raise SimlabError(f"--latency-probe {cfg.latency_probe!r}: the trace's latencies were measured on "
                          f"{existing.manifest.hardware}, this is {manifest.hardware}; put batch=1 among the batch "
                          "sizes so that every series is measured here")
    rollout_layers = set(asked)
    if existing is not None:
        rollout_layers |= set(existing.manifest.rollout_layers)
        manifest.rollout_len = _resumed_rollout(cfg, existing.manifest.rollout_len)
    if rollout_layers and manifest.rollout_len < 1:
        raise SimlabError("--rollout-layers records rollouts of --rollout tokens: --rollout must be at least 1")
    return _Setup(prompts, target_ref, draft_ref, tokenizer, device, dtype, probe, exits, draft_layer,
                  sorted(rollout_layers), manifest, existing)


def _resumed_rollout(cfg: RecordConfig, recorded: int) -> int:
    """The rollout length of a resumed trace: its own, or ``--rollout`` when it asks for another,
    whose rollouts ``record`` then records again prompt by prompt (``_renew_rollouts``; not to or from none: a trace
    without rollouts is another recording)."""
    if cfg.rollout is None or cfg.rollout == recorded:
        return recorded
    if 0 in (cfg.rollout, recorded):
        raise SimlabError(f"cannot resume {cfg.out}: it was recorded with rollout_len={recorded}, this run has "
                          f"{cfg.rollout}; rollouts can be made longer or shorter, not added or removed")
    return cfg.rollout


def record(cfg: RecordConfig) -> RecordResult:
    """Record (or continue) the trace ``cfg.out``; see the module docstring for the steps."""
    started = time.perf_counter()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    setup = _prepare(cfg)
    target = load_model(setup.target_ref, setup.device, setup.dtype)
    draft = load_model(setup.draft_ref, setup.device, setup.dtype) if setup.draft_ref is not None else None
    eos = eos_token_ids(target, setup.tokenizer)
    pad = setup.tokenizer.pad_token_id if setup.tokenizer.pad_token_id is not None else eos[0]
    neutralise(target, eos, pad)
    models = Models(
        tokenizer=setup.tokenizer,
        target=target,
        draft=draft,
        exit_layers=setup.exit_layers,
        draft_layer=setup.draft_layer,
        chat_template=cfg.chat_template,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
        rollout=setup.manifest.rollout_len,
        topk=cfg.topk,
        tree_depth=cfg.tree_depth,
    )

    manifest, latency = setup.manifest, None
    manifest.eos_token_ids = eos
    if setup.existing is not None:
        old = setup.existing.manifest
        extra = {**old.extra, "resumed": [*old.extra.get("resumed", []), cfg.command]}
        if cfg.reprobe and old.hardware != manifest.hardware:  # the latencies become this machine's
            extra["tokens_recorded_on"] = extra.get("tokens_recorded_on", old.hardware)
            old = replace(old, hardware=manifest.hardware)
        if old.rollout_len != manifest.rollout_len:  # every prompt's rollouts are recorded again (_renew_rollouts)
            if not cfg.rollouts_again:
                raise SimlabError(f"cannot keep {cfg.out}'s rollouts of {old.rollout_len} steps at --rollout "
                                  f"{manifest.rollout_len}")
            extra["rollout_len_before"] = extra.get("rollout_len_before", old.rollout_len)
        manifest = replace(old, extra=extra, rollout_len=manifest.rollout_len)
        latency = setup.existing.latency
    if latency is None or cfg.reprobe:
        probe_started, load = time.perf_counter(), OtherLoad()
        probed = probe_latency(target, draft, setup.exit_layers, setup.probe, len(setup.tokenizer), log=_log(cfg),
                               draft_layer=setup.draft_layer)
        figures = {"probe_seconds": round(time.perf_counter() - probe_started, 1), "probe_other_cpu": load.share(),
                   "threads": torch.get_num_threads()}
        if setup.probe.single:
            latency = probed
            manifest.extra.pop("batch_probe", None)  # an earlier batch-axis re-probe's samples are gone
            manifest.extra.update(latency_probe=setup.probe.to_dict(), **figures)
        else:  # a batch-axis re-probe: the batch sizes it measured replace theirs, the others are kept
            kept = latency[~latency["batch"].isin(setup.probe.batches)]
            latency = pd.concat([kept, probed], ignore_index=True)
            manifest.extra.update(batch_probe={**setup.probe.to_dict(), **figures})
    writer = TraceWriter(cfg.out, manifest, latency, with_layers=bool(setup.exit_layers),
                         fresh=setup.existing is None)
    if setup.existing is not None:
        writer.add({name: setup.existing.table(name) for name in ROW_TABLES if setup.existing.table(name) is not None})
    done = set(writer.table("prompts")["prompt_id"].tolist())
    todo = [p for p in setup.prompts if p.prompt_id not in done]
    writer.commit(started)
    here = setup.manifest.hardware  # this machine (the manifest written keeps the trace's)
    layer_sets = 0
    if cfg.rollouts_again:
        _renew_rollouts(cfg, models, writer, started, here)
        layer_sets = _add_layer_rollouts(cfg, setup.rollout_layers, models, writer, started, here)

    tokens, loop_started = 0, time.perf_counter()
    with tqdm(total=len(todo), unit="prompt", desc=cfg.out.name, file=sys.stderr, disable=not cfg.progress) as bar:
        for prompt in todo:
            rows = record_prompt(models, prompt)
            writer.add(rows)
            if setup.rollout_layers:  # committed with the prompt, so every prompt holds the listed layers'
                for _, layer_rows in _layer_rollouts(models, writer, rows["prompts"], rows["positions"],
                                                     rows["layers"], setup.rollout_layers, here):
                    writer.add({"rollouts": layer_rows})
                    layer_sets += 1
            writer.commit(started)
            tokens += len(rows["positions"])
            rate = tokens / (time.perf_counter() - loop_started)
            bar.set_postfix_str(f"{rate:.2f} tok/s, agree {agreement(writer.table('positions')):.2f}")
            bar.update(1)
    positions = writer.table("positions")
    return RecordResult(
        path=cfg.out,
        recorded=len(todo),
        total=len(writer.table("prompts")),
        tokens=len(positions),
        agreement=agreement(positions),
        seconds=time.perf_counter() - started,
        layer_rollouts=layer_sets,
    )


def _renew_rollouts(cfg: RecordConfig, models: Models, writer: TraceWriter, started: float, hardware: str) -> None:
    """Record the draft's rollouts again, as this version records them (with the tail past the
    path's end, not stopped at the draft's end token) and at the trace's rollout length, for
    every prompt already in the trace whose rollouts are not so, committing each prompt as it is
    done; the manifest's ``extra["rollouts_rerecorded"]`` sums what that cost and says where it
    ran."""
    if not models.rollout:
        return
    prompts, positions = writer.table("prompts"), writer.table("positions")
    todo = sorted(set(prompts["prompt_id"].tolist()) - _renewed(writer.table("rollouts"), NO_LAYER, models.rollout))
    if not todo:
        return
    cost = writer.manifest.extra.setdefault("rollouts_rerecorded", {"prompts": 0, "seconds": 0.0})
    cost["computed_on"] = sorted({*cost.get("computed_on", []), hardware})
    with tqdm(total=len(todo), unit="prompt", desc=f"{cfg.out.name} rollouts again", file=sys.stderr,
              disable=not cfg.progress) as bar:
        for pid in todo:
            t0 = time.perf_counter()
            ids = [int(t) for t in prompts.loc[prompts["prompt_id"] == pid, "prompt_token_ids"].iat[0]]
            rows = positions[positions["prompt_id"] == pid].sort_values("pos")
            path, tokens = (rows[c].to_numpy(np.int64) for c in ("target_token", "draft_token"))
            writer.replace_rollouts(pid, NO_LAYER, draft_rollouts(models, pid, ids, path, tokens))
            cost["prompts"] += 1
            cost["seconds"] = round(cost["seconds"] + time.perf_counter() - t0, 2)
            writer.commit(started)
            bar.update(1)


def prompts_before_tails(trace: Trace) -> list[int]:
    """The prompts whose draft rollouts ``record --resume`` would record again: without the
    tail, or of another length than the trace's (none for a trace without rollouts)."""
    if not trace.manifest.rollout_len:
        return []
    rolled = _renewed(with_defaults("rollouts", trace.rollouts), NO_LAYER, trace.manifest.rollout_len)
    return sorted(set(trace.prompts["prompt_id"].tolist()) - rolled)


def _renewed(rollouts: pd.DataFrame, layer: int, steps: int) -> set[int]:
    """The prompts whose rollouts of one drafter this version would record so: with the tail
    (step 0, :mod:`simlab.record.rollouts`) of ``steps`` steps. A commit writes all of a
    prompt's rollouts of a drafter at once, from one batch of one length, so the tail speaks
    for them all."""
    rows = with_defaults("rollouts", rollouts)
    rows = rows[rows["layer"] == layer]
    tails = rows.merge(rows.loc[rows["step"] == 0, ["prompt_id", "pos"]], on=["prompt_id", "pos"])
    last = tails.groupby("prompt_id")["step"].max()
    return set(last.index[last == steps - 1].tolist())


def _add_layer_rollouts(cfg: RecordConfig, wanted: list[int], models: Models, writer: TraceWriter,
                        started: float, hardware: str) -> int:
    """Give the prompts already in the trace the rollouts of each ``wanted`` exit layer they lack,
    committing each prompt and layer as it is done; return how many were added.

    A prompt holds a layer's rollouts when the rollouts table has that prompt's tail of that
    layer at the trace's rollout length (:func:`_renewed`; others are recorded again). The
    manifest's ``rollout_layers`` lists a layer once no prompt lacks it.
    """
    prompts, manifest = writer.table("prompts"), writer.manifest
    if not wanted or prompts.empty:
        manifest.rollout_layers = list(wanted)
        return 0
    rolled = writer.table("rollouts")
    have = {layer: _renewed(rolled, layer, models.rollout) for layer in wanted}
    positions, layers = writer.table("positions"), writer.table("layers")
    lacking = {pid: [layer for layer in wanted if pid not in have[layer]] for pid in prompts["prompt_id"].tolist()}
    pending = {layer: {pid for pid, todo in lacking.items() if layer in todo} for layer in wanted}
    manifest.rollout_layers = [layer for layer in wanted if not pending[layer]]
    added = 0
    with tqdm(total=sum(map(len, lacking.values())), unit="layer", desc=f"{cfg.out.name} layer rollouts",
              file=sys.stderr, disable=not cfg.progress) as bar:
        for pid, todo in lacking.items():
            if not todo:
                continue
            one = prompts[prompts["prompt_id"] == pid]
            for layer, rows in _layer_rollouts(models, writer, one, positions, layers, todo, hardware):
                writer.replace_rollouts(pid, layer, rows)
                pending[layer].discard(pid)
                manifest.rollout_layers = [layer for layer in wanted if not pending[layer]]
                writer.commit(started)
                added += 1
                bar.set_postfix_str(f"prompt {pid}, layer {layer}")
                bar.update(1)
    return added


def _path(positions: pd.DataFrame, prompt_id: int) -> np.ndarray:
    """The target's tokens of one prompt, in order."""
    return positions[positions["prompt_id"] == prompt_id].sort_values("pos")["target_token"].to_numpy(np.int64)


def _layer_tokens(layers: pd.DataFrame, prompt_id: int, wanted: list[int]) -> dict[int, np.ndarray]:
    """Each ``wanted`` exit layer's early-exit tokens of one prompt, in order of position."""
    rows = layers[(layers["prompt_id"] == prompt_id) & layers["layer"].isin(wanted)].sort_values(["layer", "pos"])
    return {int(layer): g["token"].to_numpy(np.int64) for layer, g in rows.groupby("layer", sort=True)}


def _layer_rollouts(models: Models, writer: TraceWriter, prompt: pd.DataFrame, positions: pd.DataFrame,
                    layers: pd.DataFrame, wanted: list[int], hardware: str) -> Iterator[tuple[int, pd.DataFrame]]:
    """:func:`~simlab.record.prompt_rows.layer_rollouts` of the one prompt in ``prompt`` (a row of
    prompts.parquet), each layer's cost summed into the manifest's ``extra["layer_rollouts"]``:
    seconds and prompts per layer, the seconds of the teacher-forced passes they branch from, and
    the ``hardware`` they were computed on (another than the trace's, see ``_open_existing``)."""
    pid, ids = int(prompt["prompt_id"].iat[0]), [int(t) for t in prompt["prompt_token_ids"].iat[0]]
    path = _path(positions, pid)
    cost = writer.manifest.extra.setdefault("layer_rollouts", {"forced_pass_seconds": 0.0, "layers": {}})
    cost["computed_on"] = sorted({*cost.get("computed_on", []), hardware})
    t0 = time.perf_counter()
    cache = forced_cache(models, ids, path)
    cost["forced_pass_seconds"] = round(cost["forced_pass_seconds"] + time.perf_counter() - t0, 2)
    for layer, rows, seconds in layer_rollouts(models, pid, len(ids), cache, path, _layer_tokens(layers, pid, wanted)):
        entry = cost["layers"].setdefault(str(layer), {"prompts": 0, "seconds": 0.0})
        entry["prompts"] += 1
        entry["seconds"] = round(entry["seconds"] + seconds, 2)
        yield layer, rows


def _log(cfg: RecordConfig) -> Callable[[str], None]:
    if not cfg.progress:
        return lambda _: None
    return lambda message: print(message, file=sys.stderr, flush=True)

"""Finding, or recording, the trace a live run is compared with.

``--trace``, or by default a shipped (or earlier cached) trace recorded with the same models,
dtype, device, temperature, budget and chat template that holds every prompt of this run
(matched by source and prompt length) and, for a tree policy, tree data (``record --topk K
--tree-depth D``). If it was recorded on other hardware, or with
``--reprobe``, its latencies (and nothing else) are measured again now, at the points its own
recording probed (:func:`~simlab.record.latency.recorded_probe`), into a cached copy
(``$SIMLAB_CACHE/live-traces``), once per machine: later runs here use that copy until
``--reprobe`` asks again. With no such trace, one is recorded there once.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from simlab.common.errors import SimlabError
from simlab.common.locations import TRACES, cache_root
from simlab.live.setup import LiveSetup
from simlab.trace.io import Trace, read_trace
from simlab.trace.schema import MANIFEST


def _manifest_matches(trace_dir: Path, want: dict[str, Any], trees: bool = False) -> bool:
    """The manifest has ``want``'s settings (and, with ``trees``, EAGLE-2 tree data)."""
    try:
        data = json.loads((trace_dir / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    plain = all(data.get(k) == v for k, v in want.items() if k != "chat_template")
    plain = plain and (not trees or data.get("tree_depth", 0) > 0)
    return plain and data.get("extra", {}).get("chat_template") == want["chat_template"]


def _holds(trace_dir: Path, sources: set[tuple[str, int]]) -> bool:
    try:
        prompts = pd.read_parquet(trace_dir / "prompts.parquet", columns=["source", "prompt_len"])
    except (OSError, ValueError):
        return False
    return sources <= set(zip(prompts["source"], prompts["prompt_len"].astype(int)))


def find_trace(want: dict[str, Any], sources: set[tuple[str, int]], roots: list[Path],
               trees: bool = False) -> Path | None:
    """The first trace under ``roots`` whose manifest matches ``want`` (with ``trees``: that has
    tree data) and that holds ``sources``."""
    for root in roots:
        if not root.is_dir():
            continue
        for d in sorted(p for p in root.iterdir() if (p / MANIFEST).is_file()):
            if _manifest_matches(d, want, trees) and _holds(d, sources):
                return d
    return None


def live_cache() -> Path:
    return cache_root() / "live-traces"


def _record(setup: LiveSetup, out: Path, dataset: str, **overrides: Any) -> None:
    from simlab.record.recorder import RecordConfig, record

    cfg = setup.cfg
    layer = cfg.draft_layer
    settings = dict(target=cfg.target, draft=cfg.draft, prompts=dataset, out=out,
                    max_new_tokens=cfg.max_new_tokens, device=setup.target_device, dtype=setup.dtype,
                    temperature=cfg.temperature, seed=cfg.seed,
                    exit_layers=str(layer) if layer else None, draft_layer=layer,
                    chat_template=cfg.chat_template, progress=cfg.progress)
    record(RecordConfig(**{**settings, **overrides}))  # a re-probe keeps the trace's own seed and layers


def _note_rollouts_before_tails(trace: Trace, log: Callable[[str], None]) -> None:
    """A re-probe changes only the latencies: rollouts recorded before tails stay as they are
    (re-recording them takes as long as a recording's rollouts), and the prediction reads them
    as ``simulate`` reads the trace; say so, and how to record them again."""
    from simlab.record.recorder import prompts_before_tails

    stale = prompts_before_tails(trace)
    if stale:
        log(f"note: {len(stale)} of {len(trace.prompts)} prompts' rollouts predate tails (what the draft says past "
            f"the path's end), kept as recorded; `simlab record --resume --out COPY` on a copy records them again")


def _reprobed_here(cached: Path, setup: LiveSetup) -> bool:
    """True when ``cached`` holds a copy of the trace whose latencies were measured on this machine."""
    return (cached / MANIFEST).is_file() and read_trace(cached).manifest.hardware == setup.hardware


def comparison_trace(setup: LiveSetup, log: Callable[[str], None]) -> Trace:
    """The comparison trace, restricted to this run's prompts (see the module docstring)."""
    cfg = setup.cfg
    sources = {(p.source, len(setup.ids[p.prompt_id])) for p in setup.prompts}
    want = setup.trace_settings()
    if cfg.trace is not None:
        found = Path(cfg.trace)
        read_trace(found)  # a clear error if it is not a trace
        if not _manifest_matches(found, want):
            raise SimlabError(f"--trace {found} was recorded with other models or settings than this run ({want})")
        if not _holds(found, sources):
            raise SimlabError(f"--trace {found} does not hold every prompt of --prompts {cfg.prompts}")
    else:
        found = find_trace(want, sources, [TRACES, live_cache()], trees=setup.trees)
    trees = setup.tree_data()
    reprobed = False  # the latencies measured again now, into a cached copy
    # a recording is keyed by its prompts (and tree data); a re-probed copy by the trace it copies
    of = {"prompts": cfg.prompts, **({"trees": trees} if trees else {})} if found is None \
        else {"copy_of": str(found.resolve())}
    key = hashlib.sha256(json.dumps({**want, **of, "hardware": setup.hardware}, sort_keys=True).encode()).hexdigest()[:12]
    cached = live_cache() / key
    if found is None:
        log(f"recording a comparison trace of {len(setup.prompts)} prompts into {cached} (once)")
        tree_flags = dict(topk=trees[0], tree_depth=trees[1]) if trees else {}
        _record(setup, cached, cfg.prompts, resume=(cached / MANIFEST).exists(),
                command="simlab live: comparison trace", **tree_flags)
        found = cached
    else:
        manifest = read_trace(found).manifest
        if manifest.hardware != setup.hardware and not cfg.reprobe and _reprobed_here(cached, setup):
            found, manifest = cached, read_trace(cached).manifest  # re-probed on this machine before
        if manifest.hardware != setup.hardware or cfg.reprobe:
            why = "--reprobe" if cfg.reprobe else f"it was recorded on {manifest.hardware}"
            log(f"measuring latencies again for {found} ({why}) into {cached}")
            if found != cached:
                shutil.rmtree(cached, ignore_errors=True)
                shutil.copytree(found, cached)
            from simlab.record.latency import recorded_probe

            _record(setup, cached, manifest.dataset, seed=manifest.seed, rollout=manifest.rollout_len,
                    latency_probe=recorded_probe(manifest.extra),
                    exit_layers=",".join(map(str, manifest.exit_layers)) or None, topk=manifest.topk,
                    tree_depth=manifest.tree_depth, resume=True, reprobe=True, rollouts_again=False,
                    command="simlab live --reprobe")
            found, reprobed = cached, True
    trace = read_trace(found)
    if reprobed:
        _note_rollouts_before_tails(trace, log)
    keep = trace.prompts[trace.prompts["source"].isin({s for s, _ in sources})]["prompt_id"]
    return trace.select_prompts(keep)

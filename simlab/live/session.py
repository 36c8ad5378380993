"""``simlab live`` end to end: load the pair, decode every prompt three times (autoregressive,
under the policy, autoregressive again), simulate the same policy on a trace of the same
prompts, and put measured beside predicted.

The autoregressive baseline runs through the same executor with the ``ad`` policy (one target
forward per token, the same KV-cache code), so the measured speedup compares like with like.
Its time is the mean of the decodes before and after the policy's: on a shared machine the
speed drifts over minutes, and a baseline taken on one side only carried that drift into the
speedup (a Qwen prompt's baseline ran 34% slower than its trace predicted while the policy's
decode just after it ran 6% slower). Before-and-after cancels a drift that is linear over the
prompt; their spread (``measured_ad_spread``) says how unsteady the machine was, prompt by
prompt. A short warm-up decode runs first and is not counted: the first forwards of a process
allocate memory.

Comparison trace: ``--trace``, or by default a shipped (or earlier cached) trace recorded with
the same models, dtype, device, temperature, budget and chat template that holds every
prompt of this run (matched by source and prompt length). If it was recorded on other
hardware, or with ``--reprobe``, its latencies are measured again now into a cached copy
(``$SIMLAB_CACHE/live-traces``); with no such trace, one is recorded there once.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

from simlab.errors import SimlabError
from simlab.paths import TRACES, cache_root
from simlab.sim.devices import Topology
from simlab.trace.io import Trace, read_trace
from simlab.trace.schema import MANIFEST

WARMUP_TOKENS = 8


@dataclass
class LiveConfig:
    policy: str
    params: dict[str, Any]
    target: str
    prompts: str
    draft: str | None = None
    draft_layer: int | None = None
    max_new_tokens: int = 128
    device: str | None = None
    draft_device: str | None = None
    target_device: str | None = None
    dtype: str | None = None
    temperature: float = 0.0
    seed: int = 0
    compare: bool = True
    trace: Path | None = None
    reprobe: bool = False
    latency: Path | None = None
    chat_template: bool = True
    progress: bool = True


@dataclass
class PromptOutcome:
    """One prompt decoded for real: the policy's run and the autoregressive baseline's."""

    prompt_id: int
    source: str
    policy: Any  # LiveRun
    ad: Any  # LiveRun, before the policy's
    ad_after: Any  # LiveRun, after the policy's
    lossless: bool  # the policy emitted exactly the autoregressive tokens

    @property
    def ad_spread(self) -> float:
        """|before − after| / their mean: how far the machine's speed moved during the prompt."""
        a, b = self.ad.counts.wall_time_s, self.ad_after.counts.wall_time_s
        return abs(a - b) / ((a + b) / 2)


@dataclass
class Comparison:
    """Per-prompt measured and predicted figures (one row each) and the simulated timeline."""

    table: pd.DataFrame
    trace_path: Path | None
    simulated: Any = None  # SimResult
    notes: list[str] = field(default_factory=list)


def _manifest_matches(trace_dir: Path, want: dict[str, Any]) -> bool:
    try:
        data = json.loads((trace_dir / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    plain = all(data.get(k) == v for k, v in want.items() if k != "chat_template")
    return plain and data.get("extra", {}).get("chat_template") == want["chat_template"]


def _holds(trace_dir: Path, sources: set[tuple[str, int]]) -> bool:
    try:
        prompts = pd.read_parquet(trace_dir / "prompts.parquet", columns=["source", "prompt_len"])
    except (OSError, ValueError):
        return False
    return sources <= set(zip(prompts["source"], prompts["prompt_len"].astype(int)))


def find_trace(want: dict[str, Any], sources: set[tuple[str, int]], roots: list[Path]) -> Path | None:
    """The first trace under ``roots`` whose manifest matches ``want`` and that holds ``sources``."""
    for root in roots:
        if not root.is_dir():
            continue
        for d in sorted(p for p in root.iterdir() if (p / MANIFEST).is_file()):
            if _manifest_matches(d, want) and _holds(d, sources):
                return d
    return None


def live_cache() -> Path:
    return cache_root() / "live-traces"


def relative_error(predicted: float, measured: float) -> float:
    if not measured or math.isnan(measured) or math.isnan(predicted):
        return math.nan
    return predicted / measured - 1.0


class LiveSession:
    """Everything ``simlab live`` does; the CLI only parses options and prints."""

    def __init__(self, cfg: LiveConfig, log: Callable[[str], None] = print):
        import torch

        from simlab.models.load import load_tokenizer, resolve
        from simlab.policies import REGISTRY
        from simlab.record import machine
        from simlab.record.prompts import load_prompts, render
        from simlab.record.recorder import check_vocab

        self.cfg, self.log = cfg, log
        if cfg.max_new_tokens < 2:
            raise SimlabError(f"--max-new-tokens must be at least 2, got {cfg.max_new_tokens}")
        if (cfg.draft is None) == (cfg.draft_layer is None):
            raise SimlabError("pass either --draft, or --draft-layer to draft with the target's first layers")
        if cfg.temperature < 0:
            raise SimlabError(f"--temperature must be >= 0, got {cfg.temperature}")
        if cfg.policy not in REGISTRY:
            raise SimlabError(f"unknown policy {cfg.policy!r}; known policies: {', '.join(sorted(REGISTRY))}")
        if REGISTRY[cfg.policy].needs_future:
            raise SimlabError(f"policy {cfg.policy!r} sees the future; it exists only in simulation")
        if REGISTRY[cfg.policy].needs_shadows and cfg.draft_layer is None:
            raise SimlabError(f"policy {cfg.policy!r} drafts with the target's own exit layers: pass --draft-layer "
                              "instead of --draft")
        self.prompts = load_prompts(cfg.prompts)
        self.target_ref = resolve(cfg.target)
        self.draft_ref = resolve(cfg.draft) if cfg.draft else None
        device = cfg.device or machine.default_device()
        self.target_device = cfg.target_device or device
        self.draft_device = cfg.draft_device or device
        for d in {self.target_device, self.draft_device}:
            if d.startswith("cuda") and not torch.cuda.is_available():
                raise SimlabError(f"device {d}: no CUDA device is available here (use cpu)")
        # Where both models compute on one device (a CPU's cores, one GPU), parallel rounds share
        # it: the simulation that predicts this run, and the windows policies size from latencies,
        # use the one-device topology and its co-running latencies.
        self.topology = Topology.ONE_DEVICE if _same_device(self.draft_device, self.target_device) \
            else Topology.TWO_DEVICES
        self.dtype = cfg.dtype or ("float32" if self.target_device == "cpu" else "bfloat16")
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.tokenizer = load_tokenizer(self.target_ref)
        if self.draft_ref is not None:
            check_vocab(load_tokenizer(self.draft_ref), self.tokenizer, cfg.draft, cfg.target)
        self.chat = bool(cfg.chat_template and self.tokenizer.chat_template)
        self.ids = {p.prompt_id: render(p, self.tokenizer, self.chat).ids for p in self.prompts}
        self.hardware = machine.hardware_name(self.target_device)
        self.trace: Trace | None = None
        self.executor = None

    # -- the comparison trace -------------------------------------------------------------

    def draft_name(self) -> str:
        return self.cfg.draft if self.cfg.draft else f"{self.cfg.target}[:{self.cfg.draft_layer}]"

    def trace_settings(self) -> dict[str, Any]:
        return {
            "draft_model": self.draft_name(),
            "target_model": self.cfg.target,
            "device": self.target_device,
            "dtype": self.dtype,
            "temperature": float(self.cfg.temperature),
            "max_new_tokens": self.cfg.max_new_tokens,
            "chat_template": self.chat,
        }

    def _record(self, out: Path, dataset: str, **overrides: Any) -> None:
        from simlab.record.recorder import RecordConfig, record

        cfg = self.cfg
        layer = cfg.draft_layer
        record(RecordConfig(target=cfg.target, draft=cfg.draft, prompts=dataset, out=out,
                            max_new_tokens=cfg.max_new_tokens, device=self.target_device, dtype=self.dtype,
                            temperature=cfg.temperature, seed=cfg.seed,
                            exit_layers=str(layer) if layer else None, draft_layer=layer,
                            chat_template=cfg.chat_template, progress=cfg.progress, **overrides))

    def load_trace(self) -> Trace:
        """The comparison trace, restricted to this run's prompts (see the module docstring)."""
        sources = {(p.source, len(self.ids[p.prompt_id])) for p in self.prompts}
        want = self.trace_settings()
        if self.cfg.trace is not None:
            found = Path(self.cfg.trace)
            read_trace(found)  # a clear error if it is not a trace
            if not _manifest_matches(found, want):
                raise SimlabError(f"--trace {found} was recorded with other models or settings than this run ({want})")
            if not _holds(found, sources):
                raise SimlabError(f"--trace {found} does not hold every prompt of --prompts {self.cfg.prompts}")
        else:
            found = find_trace(want, sources, [TRACES, live_cache()])
        key = hashlib.sha256(json.dumps({**want, "prompts": self.cfg.prompts, "hardware": self.hardware},
                                        sort_keys=True).encode()).hexdigest()[:12]
        cached = live_cache() / key
        if found is None:
            self.log(f"recording a comparison trace of {len(self.prompts)} prompts into {cached} (once)")
            self._record(cached, self.cfg.prompts, resume=(cached / MANIFEST).exists(),
                         command="simlab live: comparison trace")
            found = cached
        else:
            manifest = read_trace(found).manifest
            if manifest.hardware != self.hardware or self.cfg.reprobe:
                why = "--reprobe" if self.cfg.reprobe else f"it was recorded on {manifest.hardware}"
                self.log(f"measuring latencies again for {found} ({why}) into {cached}")
                if found != cached:
                    shutil.rmtree(cached, ignore_errors=True)
                    shutil.copytree(found, cached)
                self._record(cached, manifest.dataset, seed=manifest.seed, rollout=manifest.rollout_len,
                             exit_layers=",".join(map(str, manifest.exit_layers)) or None,
                             resume=True, reprobe=True, command="simlab live --reprobe")
                found = cached
        trace = read_trace(found)
        keep = trace.prompts[trace.prompts["source"].isin({s for s, _ in sources})]["prompt_id"]
        self.trace = trace.select_prompts(keep)
        return self.trace

    # -- decoding -------------------------------------------------------------------------

    def load_models(self) -> None:
        from simlab.live.executor import LiveExecutor
        from simlab.models.early_exit import early_exit_draft
        from simlab.models.load import eos_token_ids, load_model

        target = load_model(self.target_ref, self.target_device, self.dtype)
        exit_layers = None
        if self.draft_ref is not None:
            draft = load_model(self.draft_ref, self.draft_device, self.dtype)
        else:
            draft = early_exit_draft(target, self.cfg.draft_layer)
            recorded = list(self.trace.manifest.exit_layers) if self.trace is not None else []
            exit_layers = recorded or list(range(1, target.config.num_hidden_layers))
        self.eos = eos_token_ids(target, self.tokenizer)
        self.executor = LiveExecutor(draft, target, self.eos, self.cfg.temperature, self.cfg.seed,
                                     exit_layers=exit_layers)

    def make_policy(self, name: str, params: dict[str, Any]):
        from simlab.latency.model import load_profile
        from simlab.policies import PolicyContext, make_policy
        from simlab.sim.run import latency_of

        latency = None
        if self.cfg.latency is not None:
            latency = load_profile(self.cfg.latency)
        elif self.trace is not None:
            latency = latency_of(self.trace)
        m = self.trace.manifest if self.trace is not None else None
        typical = int(sum(len(v) for v in self.ids.values()) / len(self.ids) + self.cfg.max_new_tokens / 2)
        best_gamma = None  # vanilla SD's best γ on the session's trace, as the simulator finds it
        if self.trace is not None:
            from simlab.sim.run import Simulator

            best_gamma = lambda: Simulator(self.trace, latency, topology=self.topology).reference().gamma  # noqa: E731
        context = PolicyContext(latency=latency, exit_layers=list(m.exit_layers) if m else [],
                                n_layers=m.n_layers if m else 0, context_len=typical, best_gamma=best_gamma,
                                corun=self.topology is Topology.ONE_DEVICE)
        return make_policy(name, context, **params)

    def decode(self) -> Iterator[PromptOutcome]:
        """Decode every prompt (autoregressive, the policy, autoregressive); yields as each finishes."""
        if self.executor is None:
            self.load_models()
        policy = self.make_policy(self.cfg.policy, self.cfg.params)
        ad = self.make_policy("ad", {})
        first = self.prompts[0]
        self.executor.run(ad, -1, self.ids[first.prompt_id], WARMUP_TOKENS)  # warm-up, not counted
        for p in self.prompts:
            ids = self.ids[p.prompt_id]
            before = self.executor.run(ad, p.prompt_id, ids, self.cfg.max_new_tokens)
            run = self.executor.run(policy, p.prompt_id, ids, self.cfg.max_new_tokens)
            after = self.executor.run(ad, p.prompt_id, ids, self.cfg.max_new_tokens)
            run.counts.ad_wall_time_s = (before.counts.wall_time_s + after.counts.wall_time_s) / 2
            yield PromptOutcome(p.prompt_id, p.source, run, before, after, run.tokens == before.tokens)

    # -- measured vs predicted ------------------------------------------------------------

    def compare(self, outcomes: list[PromptOutcome]) -> Comparison:
        from simlab.latency.model import load_profile
        from simlab.metrics import Summary
        from simlab.sim.run import Simulator

        rows = []
        sim = None
        pid_of = {}
        if self.trace is not None:
            latency = load_profile(self.cfg.latency) if self.cfg.latency is not None else None
            sim = Simulator(self.trace, latency, seed=self.cfg.seed, topology=self.topology).run(
                self.cfg.policy, self.cfg.params, with_cost=False)
            pid_of = dict(zip(self.trace.prompts["source"], self.trace.prompts["prompt_id"]))
            predicted = sim.per_prompt.set_index("prompt_id")
        for o in outcomes:
            m = Summary.from_counts(o.policy.counts)
            row = {"prompt_id": o.prompt_id, "source": o.source, "lossless": o.lossless,
                   "measured_tokens": m.tokens, "measured_tokens_per_s": m.tokens_per_s,
                   "measured_speedup": m.speedup, "measured_target_calls": m.target_calls, "measured_mat": m.mat,
                   "measured_wall_time_s": m.wall_time_s, "measured_ad_wall_time_s": m.ad_wall_time_s,
                   "measured_ad_spread": o.ad_spread}
            if sim is not None and o.source in pid_of:
                pr = predicted.loc[pid_of[o.source]]
                row.update({"predicted_tokens": int(pr["tokens"]), "predicted_tokens_per_s": pr["tokens_per_s"],
                            "predicted_speedup": pr["speedup"], "predicted_target_calls": int(pr["target_calls"]),
                            "predicted_mat": pr["mat"], "predicted_wall_time_s": pr["wall_time_s"],
                            "predicted_ad_wall_time_s": pr["ad_wall_time_s"]})
                for key in ("tokens_per_s", "speedup"):
                    row[f"error_{key}"] = relative_error(row[f"predicted_{key}"], row[f"measured_{key}"])
            rows.append(row)
        return Comparison(pd.DataFrame(rows), self.trace.path if self.trace is not None else None, sim)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()


def _same_device(a: str, b: str) -> bool:
    """``cuda`` and ``cuda:0`` are one device."""
    import torch

    da, db = torch.device(a), torch.device(b)
    return (da.type, da.index or 0) == (db.type, db.index or 0)

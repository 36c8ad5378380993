"""What a ``simlab live`` run is: its options, checked, and the facts derived from them once
(prompts and their token ids, devices, topology, dtype, hardware), which the other parts of a
session read: the comparison trace, the model pair, the decoder and the prediction."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simlab.common.errors import SimlabError
from simlab.common.params import check_device, check_temperature
from simlab.sim.devices import Topology
from simlab.trees.draft_tree import parse_shape


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
    probe: str | None = None  # a --latency-probe plan timed again in this process before decoding
    reprobe_drift: float | None = None  # with probe: re-probe after a prompt whose baselines drifted this far
    spread_traces: list[Path] = field(default_factory=list)  # other record --seed traces (T > 0)
    spread_seeds: int = 20
    repeats: int = 1
    latency: Path | None = None
    chat_template: bool = True
    progress: bool = True


class LiveSetup:
    """A checked :class:`LiveConfig` and what follows from it; loads the tokenizer, not the models."""

    def __init__(self, cfg: LiveConfig):
        import torch

        from simlab.models.load import layer_count, load_tokenizer, resolve
        from simlab.policies import REGISTRY
        from simlab.record import machine
        from simlab.record.prompts import load_prompts, render
        from simlab.record.recorder import check_vocab

        self.cfg = cfg
        if cfg.max_new_tokens < 2:
            raise SimlabError(f"--max-new-tokens must be at least 2, got {cfg.max_new_tokens}")
        if (cfg.draft is None) == (cfg.draft_layer is None):
            raise SimlabError("pass either --draft, or --draft-layer to draft with the target's first layers")
        if cfg.repeats < 1:
            raise SimlabError(f"--repeats must be at least 1, got {cfg.repeats}")
        if cfg.reprobe_drift is not None and (cfg.probe is None or not 0 < cfg.reprobe_drift < 1):
            raise SimlabError("--reprobe-drift times the forwards of --probe again: pass --probe, and a fraction "
                              f"in (0, 1) such as 0.03 (got {cfg.reprobe_drift})")
        if cfg.spread_seeds < 1:
            raise SimlabError(f"--spread-seeds must be at least 1, got {cfg.spread_seeds}")
        check_temperature(cfg.temperature)
        for option, device in (("--device", cfg.device), ("--draft-device", cfg.draft_device),
                               ("--target-device", cfg.target_device)):
            check_device(device, option)
        if cfg.draft_layer is not None and cfg.draft_layer < 1:
            raise SimlabError(f"--draft-layer must be a layer number >= 1 (the target's first N layers draft), "
                              f"got {cfg.draft_layer}")
        if cfg.policy not in REGISTRY:
            raise SimlabError(f"unknown policy {cfg.policy!r}; known policies: {', '.join(sorted(REGISTRY))}")
        if REGISTRY[cfg.policy].needs_future:
            raise SimlabError(f"policy {cfg.policy!r} sees the future; it exists only in simulation")
        if REGISTRY[cfg.policy].checked_by:
            raise SimlabError(f"policy {cfg.policy!r} models an engine whose last step drafts and counts past the "
                              f"budget, which simlab's decoder does not do: check it on that engine with "
                              f"`{REGISTRY[cfg.policy].checked_by}`")
        if cfg.params.get("vllm_end") is True:
            raise SimlabError(f"{cfg.policy} with vllm_end=true models vLLM's last step, which drafts and counts past "
                              f"the budget, which simlab's decoder does not do: check it on vLLM with "
                              f"`simlab vllm run --method {cfg.policy}`")
        self.trees = REGISTRY[cfg.policy].drafts_trees
        if self.trees and cfg.temperature > 0 and cfg.compare:
            raise SimlabError(f"policy {cfg.policy!r} drafts trees, which the simulator replays under greedy "
                              "verification only: at --temperature > 0 decode it with --no-compare")
        if REGISTRY[cfg.policy].needs_shadows and cfg.draft_layer is None:
            raise SimlabError(f"policy {cfg.policy!r} drafts with the target's own exit layers: pass --draft-layer "
                              "instead of --draft")
        self.probe_auto = False  # --probe 'k=auto': the k values are the prediction's verification sizes
        self.probe_plan = self._probe_plan() if cfg.probe is not None else None
        self.prompts = load_prompts(cfg.prompts)
        self.target_ref = resolve(cfg.target)
        layers = layer_count(self.target_ref) if cfg.draft_layer is not None else None
        if layers is not None and cfg.draft_layer > layers:
            raise SimlabError(f"--draft-layer {cfg.draft_layer}: the target {cfg.target} has {layers} decoder layers")
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

    def _probe_plan(self):
        """``--probe``'s plan: one sequence (a live run decodes one), no trees or exit heads (their
        samples stay the trace's), and co-running forwards only for a policy that runs parallel
        rounds (serial rounds never co-run). ``k=auto`` leaves the k values to the session: every
        size the prediction verifies (:meth:`~simlab.live.prediction.Prediction.verified_sizes`),
        since a CPU forward's cost is not linear between probed k (``probe_auto``)."""
        from simlab.policies import REGISTRY
        from simlab.record.latency import ProbePlan

        cfg = self.cfg
        if not cfg.compare:
            raise SimlabError("--probe prices the comparison with the forwards it times; drop --no-compare")
        if cfg.reprobe or cfg.latency is not None:
            raise SimlabError("--probe times the run's forwards in this process and predicts from them; "
                              "drop --reprobe and --latency")
        items = [item.strip() for item in cfg.probe.split(";") if item.strip()]
        self.probe_auto = any(item.replace(" ", "") == "k=auto" for item in items)
        plan = ProbePlan.parse(";".join(item for item in items if item.replace(" ", "") != "k=auto"))
        return replace(plan, batches=(1,), batch_ks=(), trees=(), exit_heads=(),
                       corun=plan.corun and REGISTRY[cfg.policy].parallel)

    def tree_data(self) -> tuple[int, int] | None:
        """For a tree policy, the ``--topk K --tree-depth D`` a comparison trace is recorded with
        when none is found, and the trees a run without one (``--no-compare``) may draft: the
        policy's ``top_k`` (a fixed shape's widest level) and depth if given, else the shipped
        tree trace's 4 and 4; None for other policies."""
        if not self.trees:
            return None
        params = self.cfg.params
        shape = params.get("shape")
        widest = max(parse_shape(str(shape))) if shape else 0
        return params.get("top_k") or max(widest, 4), params.get("depth") or params.get("max_draft") or 4

    def draft_name(self) -> str:
        return self.cfg.draft if self.cfg.draft else f"{self.cfg.target}[:{self.cfg.draft_layer}]"

    def trace_settings(self) -> dict[str, Any]:
        """The manifest fields a comparison trace must share with this run."""
        return {
            "draft_model": self.draft_name(),
            "target_model": self.cfg.target,
            "device": self.target_device,
            "dtype": self.dtype,
            "temperature": float(self.cfg.temperature),
            "max_new_tokens": self.cfg.max_new_tokens,
            "chat_template": self.chat,
        }


def _same_device(a: str, b: str) -> bool:
    """``cuda`` and ``cuda:0`` are one device."""
    import torch

    da, db = torch.device(a), torch.device(b)
    return (da.type, da.index or 0) == (db.type, db.index or 0)

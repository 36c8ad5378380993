"""Roofline latencies: forward durations predicted from model shapes and a GPU's datasheet.

At batch size 1 a decoder forward over k new tokens reads every weight once and the KV cache
of the context, and does about 2 FLOPs per weight per token plus the attention products. It
can go no faster than its memory traffic or its arithmetic allows (the roofline)::

    bytes = dtype · (ℓ·P_layer + V·h) + ℓ · 2·kv_heads·head_dim · (ctx + k) · dtype
    flops = 2k · (ℓ·P_layer + V·h) + ℓ · 4k·(ctx + k) · heads·head_dim
    ideal = max(bytes / memory bandwidth, flops / matmul rate)

with ℓ decoder layers (all of them, or an exit layer's prefix), P_layer the parameters of one
layer, V·h the LM head (the embedding lookup reads only k rows). Norms and biases are
left out (<0.1% of the weights).

Real frameworks add a fixed cost per layer and per forward — kernel launches and Python
dispatch, which at batch 1 in eager PyTorch is as large as the weight traffic of a 7B model
on an A100. :class:`Overhead` holds those two constants; :func:`fit_overhead` sets them by
non-negative least squares from published latencies (``calibrate/roofline/published.csv``,
rows with ``role=fit``), and :func:`check_published` compares the model with the other rows.
``--framework ideal`` leaves the overhead out (a CUDA-graph engine comes closer to that).

Co-running (both models on one GPU) is not modelled: the papers run draft and target on
separate GPUs, and co-running questions get the solo figure. A model larger than one GPU's
memory is assumed split layer-wise over several GPUs that run one after another (Hugging
Face's ``device_map="auto"``), which at batch 1 takes the time of one GPU reading all weights.

Draft trees: a tree verification over k tokens is the chain forward of k tokens plus the
reads of the tree attention mask (:func:`ideal_seconds` says why nothing else differs), and the
draft's expansion of w nodes is the drafter's own w-token forward under a mask (the measured
tables, which have no such forward unless the probe's tree axis timed it, stand the target's
k-growth in for it: :func:`~simlab.latency.model.chain_factor`).

Exit heads (DEL's shadow tokens: the target's final norm and LM head over the rows a forward
settled, one per exit layer): the LM head's weights read once and 2·rows·V·h FLOPs, with no
framework overhead (:meth:`RooflineLatency.exit_head`).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simlab.common.errors import SimlabError
from simlab.common.jsonfile import read_json
from simlab.common.locations import CALIBRATE
from simlab.latency.model import PROFILE_KINDS, check_k, profile_header
from simlab.trace.schema import NO_LAYER

if TYPE_CHECKING:  # pandas is imported by the published figures' check, not by every simulation
    import pandas as pd

ROOFLINE_DIR = CALIBRATE / "roofline"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
FRAMEWORK_IDEAL = "ideal"


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that set its forward cost."""

    name: str
    layers: int
    hidden: int
    ffn: int
    vocab: int
    heads: int
    kv_heads: int = 0  # 0: as many as heads (no grouped-query attention)
    head_dim: int = 0  # 0: hidden / heads
    mlp: str = "gated"  # "gated" (SwiGLU, three matrices) or "plain" (two)
    tied_embeddings: bool = False
    hf_id: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn", "vocab", "heads"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise SimlabError(f"model {self.name!r}: {name} must be a positive integer")
        if self.mlp not in ("gated", "plain"):
            raise SimlabError(f"model {self.name!r}: mlp must be 'gated' or 'plain', got {self.mlp!r}")

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        attention = 2 * self.hidden * self.heads * self.hd + 2 * self.hidden * self.kv * self.hd
        return attention + (3 if self.mlp == "gated" else 2) * self.hidden * self.ffn

    def params(self, layers: int | None = None) -> int:
        """Weights read by a forward through ``layers`` decoder layers (default: all) and the LM head."""
        return (self.layers if layers is None else layers) * self.layer_params + self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        """Every weight, for the memory footprint (the input embedding too, unless tied)."""
        return self.params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @classmethod
    def from_dict(cls, d: dict, name: str = "") -> "ModelShape":
        """simlab's shape format, or a Hugging Face ``config.json``."""
        if "num_hidden_layers" in d:  # a Hugging Face config
            act = str(d.get("hidden_act", d.get("activation_function", "silu")))
            d = {
                "name": name or d.get("_name_or_path", "model"),
                "layers": d["num_hidden_layers"],
                "hidden": d["hidden_size"],
                "ffn": d.get("intermediate_size") or 4 * d["hidden_size"],
                "vocab": d["vocab_size"],
                "heads": d["num_attention_heads"],
                "kv_heads": d.get("num_key_value_heads") or 0,
                "head_dim": d.get("head_dim") or 0,
                "mlp": "plain" if d.get("model_type") in ("gpt_neox", "gpt2", "opt") or "gelu" in act else "gated",
                "tied_embeddings": bool(d.get("tie_word_embeddings", False)),
            }
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in d.items() if k in known})
        except TypeError as exc:
            raise SimlabError(f"model shape {name or d.get('name', '?')!r} is incomplete ({exc})") from exc


@dataclass(frozen=True)
class GpuSpec:
    """A GPU's datasheet figures: memory bandwidth (GB/s) and dense 16-bit matmul rate (TFLOPS)."""

    name: str
    memory_gb: float
    memory_bandwidth_gb_s: float
    matmul_tflops: float
    label: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("memory_gb", "memory_bandwidth_gb_s", "matmul_tflops"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise SimlabError(f"GPU {self.name!r}: {name} must be a positive number")


@dataclass(frozen=True)
class Overhead:
    """Fixed costs a framework adds to every forward: per decoder layer and per forward call."""

    framework: str = FRAMEWORK_IDEAL
    per_layer_s: float = 0.0
    per_forward_s: float = 0.0
    source: str = ""


def ideal_seconds(shape: ModelShape, gpu: GpuSpec, k, ctx, dtype_bytes: int, layers: int | None = None,
                  tree: bool = False):
    """The roofline time of a forward over ``k`` new tokens at context ``ctx`` (an array is fine).

    ``tree``: the forward runs under a tree attention mask (a draft tree's verification, or a
    draft's expansion of a level; :mod:`simlab.trees.attention`). Its arithmetic is a
    chain's of k tokens — the attention term above already counts every query against every
    key, ``k·(ctx + k)``, with nothing skipped for causality, and a masked score costs what an
    unmasked one does — so what differs is memory: each layer also reads the k × (ctx + k)
    additive mask, in the model's dtype (shared by every head). That is small beside the
    weights (k = 64 at context 2048 in bfloat16: 0.27 MB a layer, against 0.4 GB a layer of a 7B
    model): a tree verification of k tokens costs a chain of k plus well under a percent while
    the forward is memory-bound, and exactly a chain of k once it is compute-bound."""
    ell = shape.layers if layers is None else layers
    ctx = np.asarray(ctx, dtype=float)
    weights = shape.params(ell)
    kv_bytes = ell * 2 * shape.kv * shape.hd * (ctx + k) * dtype_bytes
    mask_bytes = ell * k * (ctx + k) * dtype_bytes if tree else 0.0
    mem_s = (dtype_bytes * weights + kv_bytes + mask_bytes) / (gpu.memory_bandwidth_gb_s * 1e9)
    flops = 2.0 * k * weights + ell * 4.0 * k * (ctx + k) * shape.heads * shape.hd
    out = np.maximum(mem_s, flops / (gpu.matmul_tflops * 1e12))
    return float(out) if out.ndim == 0 else out


def batch_ideal_seconds(shape: ModelShape, gpu: GpuSpec, ks, ctxs, dtype_bytes: int, layers: int | None = None) -> float:
    """The roofline time of one forward over a batch: sequence i brings ``ks[i]`` new tokens at
    context ``ctxs[i]``. The weights are read once for the whole batch, each sequence's KV cache
    is read, and the weight FLOPs scale with the batch's tokens — why batching is cheap until
    the forward turns compute-bound (docs/serving.md)."""
    ell = shape.layers if layers is None else layers
    weights = shape.params(ell)
    tokens = sum(ks)
    kv_positions = sum(c + k for c, k in zip(ctxs, ks))
    attention = sum(k * (c + k) for c, k in zip(ctxs, ks))
    mem_s = (dtype_bytes * weights + ell * 2 * shape.kv * shape.hd * kv_positions * dtype_bytes) / (
        gpu.memory_bandwidth_gb_s * 1e9)
    flops = 2.0 * tokens * weights + ell * 4.0 * attention * shape.heads * shape.hd
    return max(mem_s, flops / (gpu.matmul_tflops * 1e12))


@dataclass
class RooflineLatency:
    """A :class:`~simlab.latency.model.LatencyModel` from shapes, a GPU and a framework overhead.
    Self-speculative draft steps (``layer`` ≥ 0) run the target's first ``layer`` layers."""

    name: str
    target: ModelShape
    gpu: GpuSpec
    draft: ModelShape | None = None
    dtype: str = "bfloat16"
    overhead: Overhead = field(default_factory=Overhead)
    draft_layer: int = NO_LAYER  # self-speculative: the exit layer that drafts when there is no draft model

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise SimlabError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPE_BYTES)}")

    source = "roofline of model shapes and GPU datasheet figures plus a fitted framework overhead"

    @property
    def hardware(self) -> str:
        return self.gpu.label or self.gpu.name

    def forward(self, shape: ModelShape, k: int, ctx, layers: int | None = None, tree: bool = False):
        ell = shape.layers if layers is None else layers
        fixed = ell * self.overhead.per_layer_s + self.overhead.per_forward_s
        return ideal_seconds(shape, self.gpu, k, ctx, DTYPE_BYTES[self.dtype], layers, tree) + fixed

    def batch_forward(self, ks, ctxs, draft: bool, layer: int = NO_LAYER) -> float:
        """One forward of a batch (see :func:`batch_ideal_seconds`) by the draft (``draft``; an
        exit layer's prefix of the target when ``layer`` is set) or the target; the framework
        overhead is paid once per forward, whatever the batch size."""
        shape, ell = self.target, None
        if draft:
            shape, ell = self._drafter(layer)
        ell_count = shape.layers if ell is None else ell
        fixed = ell_count * self.overhead.per_layer_s + self.overhead.per_forward_s
        return batch_ideal_seconds(shape, self.gpu, ks, ctxs, DTYPE_BYTES[self.dtype], ell) + fixed

    def _drafter(self, layer: int) -> tuple[ModelShape, int | None]:
        """The shape that drafts and how many of its layers run (None: all)."""
        if layer == NO_LAYER and self.draft is None:
            layer = self.draft_layer
        if layer != NO_LAYER:
            if not 1 <= layer <= self.target.layers:
                raise SimlabError(f"exit layer {layer} is outside 1..{self.target.layers} of {self.target.name}")
            return self.target, layer
        if self.draft is None:
            raise SimlabError(f"roofline profile {self.name!r} has no draft model and no draft layer")
        return self.draft, None

    def draft_step(self, context_len, layer: int = NO_LAYER, corun: bool = False):
        shape, ell = self._drafter(layer)
        return self.forward(shape, 1, context_len, ell)

    def target_forward(self, k: int, context_len, corun: bool = False):
        check_k(k)
        return self.forward(self.target, k, context_len)

    def target_step(self, context_len):
        """Plain decoding's step: a one-token forward of the target (a roofline runs no draft beside it)."""
        return self.target_forward(1, context_len)

    def target_tree(self, k: int, context_len, corun: bool = False):
        """A tree verification over k tokens: the chain's forward plus the mask's reads
        (:func:`ideal_seconds`), and the framework's overhead as for any forward."""
        check_k(k)
        return self.forward(self.target, k, context_len, tree=True)

    def draft_tree_factor(self, w: int, context_len, corun: bool = False):
        """The drafter's own forward over w nodes under a tree mask, in its one-token steps: the
        roofline knows the draft's shape, so it needs none of the table's stand-ins."""
        shape, ell = self._drafter(NO_LAYER)
        return self.forward(shape, w, context_len, ell, tree=True) / self.forward(shape, 1, context_len, ell)

    def exit_head(self, rows: int) -> float:
        """The target's final norm and LM head over ``rows`` rows of hidden state: V·h weights
        read once, 2·rows·V·h FLOPs (the norm's h weights are left out, as elsewhere). No
        framework overhead: :class:`Overhead` is fitted per forward and per decoder layer, and a
        head is neither."""
        check_k(rows)
        head = self.target.vocab * self.target.hidden
        mem_s = DTYPE_BYTES[self.dtype] * head / (self.gpu.memory_bandwidth_gb_s * 1e9)
        return max(mem_s, 2.0 * rows * head / (self.gpu.matmul_tflops * 1e12))

    def prefill(self, k: int, context_len, draft: bool = False) -> None:
        """None: a roofline's prefills are priced from shapes, as batched forwards
        (:meth:`~simlab.latency.batch.BatchLatency.prefill`)."""
        return None

    def gpus_needed(self, shape: ModelShape) -> int:
        return math.ceil(shape.total_params * DTYPE_BYTES[self.dtype] / (self.gpu.memory_gb * 1e9))

    def to_profile(self) -> dict:
        return {
            **profile_header("roofline", self),
            "dtype": self.dtype,
            "draft_layer": self.draft_layer,
            "gpu": asdict(self.gpu),
            "overhead": asdict(self.overhead),
            "draft": asdict(self.draft) if self.draft else None,
            "target": asdict(self.target),
            "gpus_needed": {m.name: self.gpus_needed(m) for m in (self.draft, self.target) if m},
        }

    @classmethod
    def from_profile(cls, data: dict) -> "RooflineLatency":
        try:
            return cls(
                name=str(data.get("name", "roofline")),
                target=ModelShape.from_dict(data["target"]),
                draft=ModelShape.from_dict(data["draft"]) if data.get("draft") else None,
                gpu=GpuSpec(**data["gpu"]),
                dtype=str(data.get("dtype", "bfloat16")),
                overhead=Overhead(**data.get("overhead", {})),
                draft_layer=int(data.get("draft_layer", NO_LAYER)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SimlabError(f"latency profile {data.get('name', '?')!r} is malformed ({exc!r})") from exc


PROFILE_KINDS["roofline"] = RooflineLatency.from_profile


# -- the shipped data files -------------------------------------------------------------------

@lru_cache(maxsize=None)
def known_gpus() -> dict[str, GpuSpec]:
    return {g["name"]: GpuSpec(**g) for g in read_json(ROOFLINE_DIR / "gpus.json", "GPU table")["gpus"]}


@lru_cache(maxsize=None)
def known_models() -> dict[str, ModelShape]:
    return {m["name"]: ModelShape.from_dict(m) for m in read_json(ROOFLINE_DIR / "models.json", "model shape table")["models"]}


def model_shape(spec: str | os.PathLike) -> ModelShape:
    """A shape by name (``calibrate/roofline/models.json``) or from a JSON file: simlab's shape
    fields, or a Hugging Face ``config.json``."""
    models = known_models()
    if str(spec) in models:
        return models[str(spec)]
    path = Path(spec)
    if not path.is_file():
        raise SimlabError(f"unknown model {str(spec)!r}: not a name in {ROOFLINE_DIR / 'models.json'} "
                          f"({', '.join(models)}) nor a JSON file")
    return ModelShape.from_dict(read_json(path, "model config"), name=path.parent.name if path.name == "config.json" else path.stem)


def gpu_spec(name: str) -> GpuSpec:
    gpus = known_gpus()
    if name not in gpus:
        raise SimlabError(f"unknown GPU {name!r}; known: {', '.join(gpus)}")
    return gpus[name]


def published_latencies(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """The published figures, with ``seconds`` per forward derived from the printed value."""
    import pandas as pd

    p = Path(path) if path else ROOFLINE_DIR / "published.csv"
    if not p.is_file():
        raise SimlabError(f"published latency table not found: {p}")
    df = pd.read_csv(p, comment="#")
    per_token = {"tokens_per_s": lambda v: 1.0 / v, "ms": lambda v: v / 1000.0, "s": lambda v: v}
    bad = set(df["unit"]) - set(per_token)
    if bad:
        raise SimlabError(f"{p}: unknown units {sorted(bad)}; use {', '.join(per_token)}")
    df["seconds"] = [per_token[u](v) for u, v in zip(df["unit"], df["value"])]
    return df


def _ideal_of_rows(rows: pd.DataFrame) -> np.ndarray:
    return np.array([
        ideal_seconds(model_shape(r.model), gpu_spec(r.gpu), int(r.k), int(r.context_len), DTYPE_BYTES[r.dtype])
        for r in rows.itertuples(index=False)
    ])


def fit_overhead(framework: str = "hf-eager", rows: pd.DataFrame | None = None) -> Overhead:
    """Per-layer and per-forward overhead by non-negative least squares on the ``role=fit``
    rows of ``framework``: published seconds − roofline seconds = layers·a + b."""
    from scipy.optimize import nnls  # imported here: simulating never needs scipy

    if framework == FRAMEWORK_IDEAL:
        return Overhead(FRAMEWORK_IDEAL, 0.0, 0.0, "no framework overhead: the bare roofline")
    rows = published_latencies() if rows is None else rows
    fit = rows[(rows["framework"] == framework) & (rows["role"] == "fit")]
    if fit.empty:
        known = sorted(set(rows["framework"])) + [FRAMEWORK_IDEAL]
        raise SimlabError(f"no published figures to fit framework {framework!r}; known: {', '.join(known)}")
    design = np.column_stack([[model_shape(m).layers for m in fit["model"]], np.ones(len(fit))])
    (per_layer, per_forward), _ = nnls(design, fit["seconds"].to_numpy() - _ideal_of_rows(fit))
    sources = "; ".join(sorted(set(fit["source"])))
    return Overhead(framework, float(per_layer), float(per_forward),
                    f"non-negative least squares on {len(fit)} published figures ({sources})")


def check_published(framework: str = "hf-eager", rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every published figure of ``framework`` beside the roofline with and without the fitted
    overhead; ``rel_err`` = predicted / published − 1."""
    rows = published_latencies() if rows is None else rows
    rows = rows[rows["framework"] == framework].reset_index(drop=True)
    overhead = fit_overhead(framework, rows)
    ideal = _ideal_of_rows(rows)
    layers = np.array([model_shape(m).layers for m in rows["model"]])
    predicted = ideal + layers * overhead.per_layer_s + overhead.per_forward_s
    return rows.assign(
        ideal_s=ideal,
        predicted_s=predicted,
        ideal_rel_err=ideal / rows["seconds"] - 1.0,
        rel_err=predicted / rows["seconds"] - 1.0,
    )[["source", "model", "gpu", "role", "seconds", "ideal_s", "ideal_rel_err", "predicted_s", "rel_err"]]

"""How long a forward takes: the simulator's only source of time.

The simulator never hard-codes a duration; it asks a :class:`LatencyModel` for

- ``draft_step(context_len)``: one autoregressive draft token (or, with ``layer``, one
  early-exit step through the target's first ``layer`` decoder layers);
- ``target_forward(k, context_len)``: one target forward over ``k`` new positions
  (k = 1 is an autoregressive step; verifying γ drafts is k = γ + 1);
- ``target_tree(k, context_len)``: the target's verification of a draft tree, one forward over
  ``k`` tokens (the last committed token and k − 1 nodes) under a tree attention mask;
- ``draft_tree_factor(w, context_len)``: the draft's expansion of one tree level, one forward
  over ``w`` nodes under a tree mask, as a multiple of its one-token step at that context (a
  factor, because the simulator multiplies it into the step it already holds:
  :meth:`~simlab.latency.grid.LatencyGrid.tree_draft_seconds`);
- ``target_step(context_len)``: the target's step in plain autoregressive decoding, the
  baseline a speedup divides by: the one-token ``target_forward`` wherever that is the plain
  step, and the step timed on its own where the engine's one-token forward does more (a
  llama.cpp trace: its verification runs the draft over the same tokens, ``target_step``
  samples);
- ``prefill(k, context_len, draft)``: a prompt's prefill of ``k`` tokens as a server runs it,
  the target's forward with only the last position's logits (``draft``: the draft's forward of
  the same tokens), where the probe timed it (``target_prefill`` / ``draft_prefill`` samples,
  the llama.cpp trace tool's); None otherwise, and :mod:`simlab.latency.batch` prices prefills
  from the k-token target forward as before;
- ``exit_head(rows)``: the target's final norm and LM head over ``rows`` rows of hidden state,
  on the target's device (DEL's shadow tokens run one per exit layer after every verification:
  :meth:`~simlab.latency.grid.LatencyGrid.shadow_seconds`); None where the model has no such
  figure (a trace probed before the probe's exit-head axis), which the simulator prices as
  nothing, the figures it gave before, and says so.

``corun=True`` asks for the duration while the other model runs on the same device (the
one-device topology of parallel policies); a model without such measurements answers with
the solo figure.

Trees. A model without tree samples (every trace probed before the probe's tree axis, and any
probed without it) prices a tree verification of k tokens as the chain forward of k tokens,
``target_forward(k)``, and a level of w nodes as the target's growth from 1 to w tokens,
``target_forward(w) / target_forward(1)`` (:func:`chain_factor`): the figures simlab gave
before trees were probed, unchanged. With tree samples, :class:`TableLatency` corrects those
chain prices by what the probe measured (:func:`probed_correction`): the chain price times the
measured tree/chain ratio at the probed sizes, linear in k between them and held at the
nearest probed size outside. A ratio, not the tree medians interpolated on their own, because
on a CPU the cost is a staircase in k (see :mod:`simlab.record.latency`): a tree of 17 tokens
costs what a 17-token chain costs, plus the mask's share, and the chain table knows the step.

:class:`TableLatency` holds medians per measured point and interpolates: linearly in
``context_len`` (clamped at the ends of the measured range), linearly in ``k`` between
measured k, and beyond the largest measured k it extends the last segment's slope (never
below the last measured value). Verify cost on CPU is neither flat nor affine in k (an early
probe of the Qwen pair on 2 CPU cores measured 317 ms at k=1, 935 at k=3, 575 at k=4; see
docs/architecture.md for the shipped trace's figures), so a table, not a slope, is the default.
Every price past the measured points (a k, context, tree size or layer outside them) is counted
by the rule that priced it: :meth:`TableLatency.span` says where each series was measured, and
:mod:`simlab.latency.coverage` reads it.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from simlab.common.errors import SimlabError
from simlab.common.jsonfile import read_versioned, write_json
from simlab.latency.coverage import Span
from simlab.trace.schema import NO_LAYER
from simlab.trace.tables import Columns

if TYPE_CHECKING:
    import pandas as pd

PROFILE_FORMAT = "simlab-latency"
PROFILE_VERSION = 1


@runtime_checkable
class LatencyModel(Protocol):
    """Durations in seconds of the forwards an executor runs."""

    name: str

    def draft_step(self, context_len: int, layer: int = NO_LAYER, corun: bool = False) -> float: ...

    def target_forward(self, k: int, context_len: int, corun: bool = False) -> float: ...

    def target_step(self, context_len: int) -> float: ...

    def target_tree(self, k: int, context_len: int, corun: bool = False) -> float: ...

    def draft_tree_factor(self, w: int, context_len: int, corun: bool = False) -> float: ...

    def exit_head(self, rows: int) -> float | None: ...

    def prefill(self, k: int, context_len: int, draft: bool = False) -> float | None: ...


def chain_factor(model, w: int, context_len, corun: bool = False):
    """A draft forward over ``w`` tree nodes in draft steps, where the draft's multi-token
    forwards were not probed: the target's growth from 1 to ``w`` tokens (both are the same
    kind of transformer; a CPU approximation)."""
    return model.target_forward(w, context_len, corun) / model.target_forward(1, context_len, corun)


def probed_correction(size: int, sizes: tuple[int, ...], measured: list, chain: list):
    """The factor by which a tree forward of ``size`` costs more than its chain price: at the
    probed ``sizes``, ``measured / chain`` (numbers, or arrays over context length); between
    two of them linear in size; outside them the nearest one's (a tree forward's extra cost is
    the mask's, a share of the forward that is not extrapolated)."""
    ratios = [m / c for m, c in zip(measured, chain)]
    if size <= sizes[0]:
        return ratios[0]
    if size >= sizes[-1]:
        return ratios[-1]
    i = int(np.searchsorted(sizes, size, side="right")) - 1
    w = (size - sizes[i]) / (sizes[i + 1] - sizes[i])
    return ratios[i] * (1 - w) + ratios[i + 1] * w


def profile_header(kind: str, model) -> dict:
    """The fields every profile file starts with; ``model`` has name, hardware and source."""
    return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "kind": kind, "name": model.name,
            "hardware": model.hardware, "source": model.source}


def check_k(k: int) -> None:
    if k < 1:
        raise SimlabError(f"a target forward needs k >= 1 new tokens, got {k}")


@dataclass(frozen=True)
class Curve:
    """Seconds as a function of context length, from measured points."""

    context_len: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, ctx):
        """Seconds at context length ``ctx`` (a number or an array)."""
        if len(self.context_len) == 1:
            return np.full(np.shape(ctx), self.seconds[0]) if np.ndim(ctx) else self.seconds[0]
        out = np.interp(ctx, self.context_len, self.seconds)
        return out if np.ndim(out) else float(out)

    def to_dict(self) -> dict:
        return {"context_len": list(self.context_len), "seconds": list(self.seconds)}

    @classmethod
    def from_points(cls, ctx, seconds) -> "Curve":
        order = np.argsort(np.asarray(ctx))
        c = tuple(int(x) for x in np.asarray(ctx)[order])
        s = tuple(float(x) for x in np.asarray(seconds)[order])
        if not c:
            raise SimlabError("a latency curve needs at least one point")
        if any(not (math.isfinite(x) and x > 0) for x in s):
            raise SimlabError("latency curves need finite, positive seconds")
        return cls(c, s)


def _interp_k(k: int, ks: tuple[int, ...], values: list):
    """Linear in k between measured k; beyond the last, extend the last slope (not downwards).
    ``values`` may be scalars or arrays over context length."""
    if k <= ks[0]:
        return values[0]
    if k >= ks[-1]:
        if len(ks) == 1:
            return values[-1]
        slope = np.maximum((values[-1] - values[-2]) / (ks[-1] - ks[-2]), 0.0)
        return values[-1] + slope * (k - ks[-1])
    i = int(np.searchsorted(ks, k, side="right")) - 1
    w = (k - ks[i]) / (ks[i + 1] - ks[i])
    return values[i] * (1 - w) + values[i + 1] * w


@dataclass
class TableLatency:
    """A latency table: medians of measured points, interpolated (see module docstring)."""

    name: str
    # (layer, corun) -> curve over context length
    draft: dict[tuple[int, bool], Curve]
    # corun -> {k: curve over context length}
    target: dict[bool, dict[int, Curve]]
    hardware: str = ""
    source: str = ""
    # Self-speculative traces have no separate draft model: its step is that of this exit layer.
    draft_layer: int = NO_LAYER
    # Forwards of B > 1 sequences (probed with a batch axis): one table per batch size, whose
    # k-token forward is B sequences x k tokens each (simlab.latency.batch prices batches with them).
    batches: dict[int, "TableLatency"] = field(default_factory=dict)
    # Forwards under a tree attention mask (the probe's tree axis), corun -> {k: curve}: the
    # target's verification of k tokens, the draft's expansion of k nodes. Empty: trees are
    # priced as chains (module docstring).
    target_trees: dict[bool, dict[int, Curve]] = field(default_factory=dict)
    draft_trees: dict[bool, dict[int, Curve]] = field(default_factory=dict)
    # The exit head over k rows (the probe's exit-head axis; solo, one context), corun -> {k: curve}.
    # Empty: shadow reads are not priced (module docstring).
    exit_heads: dict[bool, dict[int, Curve]] = field(default_factory=dict)
    # True when each measured target forward also ran the draft over the same tokens, as
    # llama.cpp's verification does (``common_speculative_process`` keeps the draft's cache in
    # step with the target's): the draft then never lacks more than the round's last token, so
    # no round pays a catch-up (:meth:`~simlab.latency.grid.LatencyGrid.catch_up_seconds`).
    verify_feeds_draft: bool = False
    # The target's plain decoding step where it was timed on its own (``target_step`` samples, the
    # trace tool of a llama.cpp trace); None: it is the one-token target forward.
    plain_step: Curve | None = None
    # Prefills of k prompt tokens where they were timed (``target_prefill`` / ``draft_prefill``
    # samples), model -> {k: curve}, model "target" or "draft". Empty: not timed (module docstring).
    prefills: dict[str, dict[int, Curve]] = field(default_factory=dict)

    # A tree forward's price is the chain's corrected by the probed ratio (:mod:`simlab.latency.coverage`).
    tree_on_chain = True

    def __post_init__(self) -> None:
        if not self.draft:
            raise SimlabError(f"latency model {self.name!r} has no draft-step curve")
        if False not in self.target or not self.target[False]:
            raise SimlabError(f"latency model {self.name!r} has no solo target-forward curves")

    @property
    def has_corun(self) -> bool:
        return True in self.target

    @property
    def layers(self) -> list[int]:
        return sorted({layer for layer, _ in self.draft if layer != NO_LAYER})

    def span(self, series: str, corun: bool = False) -> Span | None:
        """Where ``series`` (:data:`~simlab.latency.fitted.SERIES`' names) was measured, as the
        prices below read it (co-running curves, else the solo ones); None where it was not."""
        if series == "draft":
            curve = self.draft.get((NO_LAYER, corun)) or self.draft.get((NO_LAYER, False))
            return None if curve is None else Span.of_curves({1: curve})
        if series == "exit":
            curves = {x: self.draft.get((x, corun)) or self.draft.get((x, False)) for x in self.layers}
            return Span.of_curves({x: c for x, c in curves.items() if c is not None})
        if series == "target":
            return Span.of_curves(self.target.get(corun) or self.target[False])
        if series == "target_step":
            return None if self.plain_step is None else Span.of_curves({1: self.plain_step})
        if series in ("target_tree", "draft_tree"):
            probed = _probed(self.target_trees if series == "target_tree" else self.draft_trees, corun)
            return None if probed is None else Span.of_curves(probed[1])
        if series == "exit_head":
            return Span.of_curves(self.exit_heads.get(False, {}))
        if series in ("target_prefill", "draft_prefill"):
            return Span.of_curves(self.prefills.get(series.split("_")[0], {}))
        return None

    def draft_step(self, context_len, layer: int = NO_LAYER, corun: bool = False):
        """Seconds of one draft step; ``context_len`` may be an array."""
        if layer == NO_LAYER and (NO_LAYER, False) not in self.draft:
            layer = self.draft_layer
        curve = self.draft.get((layer, corun)) or self.draft.get((layer, False))
        if curve is None:
            if layer == NO_LAYER:
                raise SimlabError(f"latency model {self.name!r} has no draft-model step")
            return self._layer_step(context_len, layer, corun)
        return curve(context_len)

    def _layer_step(self, context_len: int, layer: int, corun: bool) -> float:
        """An exit layer that was not measured: linear between measured layers."""
        layers = self.layers
        if not layers:
            raise SimlabError(f"latency model {self.name!r} has no early-exit draft steps (needed for layer {layer})")
        values = [self.draft_step(context_len, x, corun) for x in layers]
        return _interp_k(layer, tuple(layers), values)

    def target_forward(self, k: int, context_len, corun: bool = False):
        """Seconds of a k-token target forward; ``context_len`` may be an array."""
        check_k(k)
        curves = self.target.get(corun) or self.target[False]
        ks = tuple(sorted(curves))
        return _interp_k(k, ks, [curves[x](context_len) for x in ks])

    def target_step(self, context_len):
        """Seconds of the target's plain decoding step (module docstring); ``context_len`` may be an array."""
        return self.target_forward(1, context_len) if self.plain_step is None else self.plain_step(context_len)

    def target_tree(self, k: int, context_len, corun: bool = False):
        """Seconds of a tree verification over k tokens: the chain's, corrected by the probed
        tree samples where there are some (module docstring)."""
        chain = self.target_forward(k, context_len, corun)
        probed = _probed(self.target_trees, corun)
        if probed is None:
            return chain
        use, curves = probed
        ks = tuple(sorted(curves))
        return chain * probed_correction(k, ks, [curves[x](context_len) for x in ks],
                                         [self.target_forward(x, context_len, use) for x in ks])

    def draft_tree_factor(self, w: int, context_len, corun: bool = False):
        """A draft forward over w tree nodes in draft steps: :func:`chain_factor`, corrected by
        the probed expansions where there are some (module docstring)."""
        factor = chain_factor(self, w, context_len, corun)
        probed = _probed(self.draft_trees, corun)
        if probed is None:
            return factor
        use, curves = probed
        ws = tuple(sorted(curves))
        step = self.draft_step(context_len, NO_LAYER, use)
        return factor * probed_correction(w, ws, [curves[x](context_len) / step for x in ws],
                                          [chain_factor(self, x, context_len, use) for x in ws])

    def exit_head(self, rows: int) -> float | None:
        """Seconds of the exit head over ``rows`` rows: the medians, linear in rows between
        probed counts (and past the largest, its last slope), as a target forward is in k;
        None without exit-head samples."""
        curves = self.exit_heads.get(False)
        if not curves:
            return None
        check_k(rows)
        ks = tuple(sorted(curves))
        return float(_interp_k(rows, ks, [curves[x](0) for x in ks]))

    def prefill(self, k: int, context_len, draft: bool = False) -> float | None:
        """Seconds of the target's (``draft``: the draft's) prefill of k prompt tokens, linear in
        k between timed sizes and past the largest its last slope, as a target forward is; None
        where prefills were not timed."""
        curves = self.prefills.get("draft" if draft else "target")
        if not curves:
            return None
        check_k(k)
        ks = tuple(sorted(curves))
        return float(_interp_k(k, ks, [curves[x](context_len) for x in ks]))

    # -- construction and files -------------------------------------------------------------

    @classmethod
    def from_samples(cls, samples: pd.DataFrame | Columns, name: str = "trace", hardware: str = "",
                     draft_layer: int = NO_LAYER, verify_feeds_draft: bool = False) -> "TableLatency":
        """Medians per (op, k, context_len, layer, corun) of a trace's latency table (a DataFrame,
        or its columns: :meth:`~simlab.trace.tables.Trace.columns`), one table per batch size
        (batch 1 is this one, the others its ``batches``)."""
        rows = Columns.of("latency", samples)
        batch = rows["batch"]
        by_batch = {b: rows.subset(np.flatnonzero(batch == b)) for b in set(batch.tolist())}
        single = by_batch.pop(1, rows.subset(np.zeros(0, np.int64)))
        table = cls._from_single(single, name, hardware, draft_layer)
        table.verify_feeds_draft = verify_feeds_draft
        # a batch size timed without its draft step or target forward (vLLM's plain steps of a batch
        # whose first request finished, where no speculative step ran at that size) prices nothing
        # a batch needs on its own: left out, its batches priced between the sizes on either side
        ops = rows["op"]
        table.batches = {b: cls._from_single(g, f"{name} (batch {b})", hardware, draft_layer)
                         for b, g in sorted(by_batch.items())
                         if {"draft_step", "target_forward"} <= set(ops[batch == b].tolist())}
        return table

    @classmethod
    def _from_single(cls, samples: Columns, name: str, hardware: str, draft_layer: int) -> "TableLatency":
        med = _medians(samples)
        draft = {key: Curve.from_points(ctx, seconds)
                 for key, (ctx, seconds) in _points(med, "draft_step", lambda k, layer, corun: (layer, corun)).items()}
        plain = _k_curves(med, "target_step").get(False, {}).get(1)
        return cls(name=name, draft=draft, target=_k_curves(med, "target_forward"), hardware=hardware,
                   source="trace samples (medians)", draft_layer=draft_layer,
                   target_trees=_k_curves(med, "target_tree"), draft_trees=_k_curves(med, "draft_tree"),
                   exit_heads=_k_curves(med, "exit_head"), plain_step=plain,
                   prefills={model: curves[False] for model in ("target", "draft")
                             if (curves := _k_curves(med, f"{model}_prefill")).get(False)})

    def to_profile(self) -> dict:
        profile = self._curves()
        if self.batches:
            profile["batches"] = [{"batch": b, **t._curves()} for b, t in sorted(self.batches.items())]
        for key, series in (("target_tree", self.target_trees), ("draft_tree", self.draft_trees),
                            ("exit_head", self.exit_heads)):
            if series:  # a profile without tree or exit-head samples reads as before
                profile[key] = _k_list(series)
        if self.verify_feeds_draft:
            profile["verify_feeds_draft"] = True
        for model, curves in sorted(self.prefills.items()):  # a profile without prefills reads as before
            profile[f"{model}_prefill"] = _k_list({False: curves})
        return {**profile_header("table", self), **profile}

    def _curves(self) -> dict:
        curves = {
            "draft_layer": self.draft_layer,
            "draft_step": [
                {"layer": layer, "corun": corun, **curve.to_dict()}
                for (layer, corun), curve in sorted(self.draft.items())
            ],
            "target_forward": _k_list(self.target),
        }
        if self.plain_step is not None:  # a profile without a plain step reads as before
            curves["target_step"] = self.plain_step.to_dict()
        return curves

    @classmethod
    def from_profile(cls, data: dict) -> "TableLatency":
        table = cls._from_curves(data)
        try:
            # a batch table has its own plain step or none, never the single sequence's
            table.batches = {int(d["batch"]): cls._from_curves({**data, **d, "target_step": d.get("target_step")})
                             for d in data.get("batches", [])}
            # tree forwards are single-sequence: the batch tables have none
            table.target_trees = _read_k_list(data.get("target_tree", []))
            table.draft_trees = _read_k_list(data.get("draft_tree", []))
            table.exit_heads = _read_k_list(data.get("exit_head", []))
            table.verify_feeds_draft = bool(data.get("verify_feeds_draft", False))
            table.prefills = {model: curves[False] for model in ("target", "draft")
                              if (curves := _read_k_list(data.get(f"{model}_prefill", []))).get(False)}
        except (KeyError, TypeError, ValueError) as exc:
            raise SimlabError(f"latency profile {data.get('name', '?')!r} is malformed ({exc!r})") from exc
        return table

    @classmethod
    def _from_curves(cls, data: dict) -> "TableLatency":
        try:
            draft = {
                (int(d.get("layer", NO_LAYER)), bool(d.get("corun", False))): Curve.from_points(
                    d["context_len"], d["seconds"]
                )
                for d in data["draft_step"]
            }
            target = _read_k_list(data["target_forward"])
            plain = data.get("target_step")
            plain = None if plain is None else Curve.from_points(plain["context_len"], plain["seconds"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SimlabError(f"latency profile {data.get('name', '?')!r} is malformed ({exc!r})") from exc
        return cls(
            name=str(data.get("name", "profile")),
            draft=draft,
            target=target,
            hardware=str(data.get("hardware", "")),
            source=str(data.get("source", "")),
            draft_layer=int(data.get("draft_layer", NO_LAYER)),
            plain_step=plain,
        )


def _probed(series: dict[bool, dict[int, Curve]], corun: bool) -> tuple[bool, dict[int, Curve]] | None:
    """The co-running state whose tree samples answer for ``corun`` (solo ones stand in for
    co-running ones, as elsewhere) and their curves; None without tree samples."""
    for use in (corun, False):
        if series.get(use):
            return use, series[use]
    return None


MEDIAN_KEYS = ("op", "k", "context_len", "layer", "corun")


def _medians(samples: Columns) -> list[tuple]:
    """(op, k, context_len, layer, corun, median seconds) of each distinct sample key, in key order
    (``statistics.median``: numpy's imports ``numpy.ma``, some 20 ms of a command's start-up)."""
    groups: dict[tuple, list[float]] = {}
    for key, seconds in zip(zip(*(samples[c].tolist() for c in MEDIAN_KEYS)), samples["seconds"].tolist()):
        groups.setdefault(key, []).append(seconds)
    return [(*key, float(statistics.median(values))) for key, values in sorted(groups.items())]


def _points(med: list[tuple], op: str, key) -> dict[tuple, tuple[list[int], list[float]]]:
    """One operation's medians as (context lengths, seconds) per ``key(k, layer, corun)``, in key
    order, each in the medians' order."""
    out: dict[tuple, tuple[list[int], list[float]]] = {}
    for o, k, ctx, layer, corun, seconds in med:
        if o == op:
            points = out.setdefault(key(int(k), int(layer), bool(corun)), ([], []))
            points[0].append(ctx)
            points[1].append(seconds)
    return dict(sorted(out.items()))


def _k_curves(med: list[tuple], op: str) -> dict[bool, dict[int, Curve]]:
    """corun -> {k: curve over context length} of one operation's medians."""
    out: dict[bool, dict[int, Curve]] = {}
    for (corun, k), (ctx, seconds) in _points(med, op, lambda k, layer, corun: (corun, k)).items():
        out.setdefault(corun, {})[k] = Curve.from_points(ctx, seconds)
    return out


def _k_list(series: dict[bool, dict[int, Curve]]) -> list[dict]:
    return [{"corun": corun, "k": k, **curve.to_dict()}
            for corun, curves in sorted(series.items()) for k, curve in sorted(curves.items())]


def _read_k_list(items: list[dict]) -> dict[bool, dict[int, Curve]]:
    out: dict[bool, dict[int, Curve]] = {}
    for d in items:
        out.setdefault(bool(d.get("corun", False)), {})[int(d["k"])] = Curve.from_points(d["context_len"], d["seconds"])
    return out


# kind -> constructor from a profile dict; other latency models (fitted, roofline) register here.
PROFILE_KINDS = {"table": TableLatency.from_profile}


def save_profile(model, path: str | os.PathLike) -> Path:
    return write_json(model.to_profile(), path)


def load_profile(path: str | os.PathLike) -> LatencyModel:
    """Read a latency profile JSON file (``calibrate/*.json``)."""
    data = read_versioned(path, "latency profile", PROFILE_FORMAT, PROFILE_VERSION)
    kind = data.get("kind")
    if kind not in PROFILE_KINDS:
        raise SimlabError(f"latency profile {path} has unknown kind {kind!r}; known: {sorted(PROFILE_KINDS)}")
    return PROFILE_KINDS[kind](data)


def tabulate(model: LatencyModel, ks, contexts, corun: bool = False) -> pd.DataFrame:
    """Rows of a trace's latency table (one repeat) evaluated from ``model``: the draft-model
    step and the target forward of every k in ``ks`` at every context length — how a synthetic
    trace borrows a fitted or roofline profile's clock. ``corun`` adds co-running rows."""
    import pandas as pd

    rows = []
    for c in (False, True) if corun else (False,):
        for ctx in contexts:
            rows.append(("draft_step", 1, ctx, NO_LAYER, c, 0, float(model.draft_step(ctx, NO_LAYER, c)), 1))
            rows += [("target_forward", k, ctx, NO_LAYER, c, 0, float(model.target_forward(k, ctx, c)), 1) for k in ks]
    return pd.DataFrame(rows, columns=["op", "k", "context_len", "layer", "corun", "repeat", "seconds", "batch"])

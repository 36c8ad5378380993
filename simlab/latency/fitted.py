"""A latency model fitted to a trace's samples: one :class:`~simlab.latency.surface.Surface` per
operation and co-running state.

Series (each solo and, where the trace has them, co-running):

- ``draft``:  the draft model's one-token step, ``x`` = 1 (affine in context only);
- ``exit``:   self-speculative draft steps through the target's first ℓ layers, ``x`` = ℓ;
- ``target``: a target forward of k new tokens, ``x`` = k;
- ``target_tree``: a target forward of k tokens under a tree attention mask (a tree's
  verification), ``x`` = k; ``draft_tree``: the drafter's forward over w tree nodes (one
  level's expansion), ``x`` = w — both where the trace was probed with a tree axis;
- ``exit_head``: the target's final norm and LM head over k rows of hidden state (DEL's shadow
  tokens), ``x`` = k, where the trace was probed with an exit-head axis (one context: no
  context term). Without it a shadow read has no price (:mod:`simlab.latency.model`);
- ``target_step``: the target's plain decoding step, ``x`` = 1, where the engine's one-token
  target forward is not that step (a llama.cpp trace: its verification runs the draft too).
  Without it the plain step is the one-token ``target`` forward.
- ``target_prefill``, ``draft_prefill``: a prompt's prefill of k tokens as a server runs it (only
  the last position's logits), ``x`` = k, where the probe timed it (the llama.cpp trace tool).
  Without them prefills are priced from the ``target`` surface (:mod:`simlab.latency.batch`).

A tree verification is the ``target_tree`` surface where it was fitted, else the chain's
``target`` surface; a level of w nodes costs ``draft_tree(w) / draft step`` steps where that was
fitted, else the target's growth from 1 to w tokens (:func:`~simlab.latency.model.chain_factor`).
A fit is smooth in k, so unlike the median table (:mod:`simlab.latency.model`) it needs no
chain staircase to lean on between probed sizes.

Samples of batched forwards (the probe's batch axis: B sequences x k tokens) are fitted the
same way, one set of surfaces per batch size (``batches``).

A series without co-running samples answers co-running questions with its solo surface (the
:class:`~simlab.latency.model.LatencyModel` contract). :func:`held_out` measures how well the
fit predicts samples it did not see, beside the median table the simulator uses by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from simlab.common.errors import SimlabError
from simlab.latency.coverage import Span
from simlab.latency.model import PROFILE_KINDS, TableLatency, chain_factor, check_k, profile_header
from simlab.latency.surface import FORMS, Surface, available_forms, fit_best
from simlab.trace.schema import NO_LAYER, with_defaults

if TYPE_CHECKING:  # pandas is imported by what fits a latency model, not by every simulation (simlab.trace.tables)
    import pandas as pd

SERIES = ("draft", "exit", "target", "target_tree", "draft_tree", "exit_head", "target_step", "target_prefill",
          "draft_prefill")
# the size each fitted series is measured in (the draft-model step has none)
SIZE_NAMES = {"exit": "layer", "target": "k", "target_tree": "k", "draft_tree": "nodes", "exit_head": "rows",
              "target_step": "k", "target_prefill": "k", "draft_prefill": "k"}
# series fitted at one size by design: no slope in size to measure
ONE_SIZE = ("draft", "target_step")
# ops whose series is named after them (the rest: draft steps, of the draft model or an exit layer)
OWN_SERIES = ("target_tree", "draft_tree", "exit_head", "target_step", "target_prefill", "draft_prefill")


def series_of(samples: pd.DataFrame) -> pd.Series:
    """The series name of each latency sample."""
    import pandas as pd

    op = samples["op"].to_numpy()
    return pd.Series(np.select([op == "target_forward", *(op == name for name in OWN_SERIES),
                                samples["layer"].to_numpy() == NO_LAYER],
                               ["target", *OWN_SERIES, "draft"], "exit"),
                     index=samples.index)


def size_of(samples: pd.DataFrame) -> pd.Series:
    """The ``x`` of each sample: the exit layer for early-exit steps, k (new tokens, or tree
    nodes) for every other forward."""
    import pandas as pd

    exit_step = (samples["op"] == "draft_step") & (samples["layer"] != NO_LAYER)
    return pd.Series(np.where(exit_step, samples["layer"], samples["k"]), index=samples.index)


@dataclass
class FittedLatency:
    """Durations from fitted surfaces; ``draft_step``/``target_forward`` accept arrays of contexts."""

    name: str
    surfaces: dict[tuple[str, bool], Surface]
    hardware: str = ""
    source: str = ""
    held_out: dict = field(default_factory=dict)
    # Self-speculative traces have no separate draft model: its step is that of this exit layer.
    draft_layer: int = NO_LAYER
    # Forwards of B > 1 sequences, fitted per batch size from the probe's batch axis.
    batches: dict[int, "FittedLatency"] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if ("target", False) not in self.surfaces:
            raise SimlabError(f"latency model {self.name!r} has no solo target-forward fit")
        if ("draft", False) not in self.surfaces and ("exit", False) not in self.surfaces:
            raise SimlabError(f"latency model {self.name!r} has no solo draft-step fit")

    @property
    def has_corun(self) -> bool:
        return any(corun for _, corun in self.surfaces)

    tree_on_chain = False  # a fitted tree surface prices a tree forward on its own

    def span(self, series: str, corun: bool = False) -> Span | None:
        """Where ``series`` was measured (its surface's sizes, each over the contexts of its
        samples; a profile written before the largest context was kept: open above), as the prices
        read it; None where it was not fitted."""
        s = self.surfaces.get((series, corun)) or self.surfaces.get((series, False))
        if s is None:
            return None
        hi = s.ctx_max if s.ctx_max is not None else np.iinfo(np.int64).max
        return Span({x: (s.ctx_min, hi) for x in s.xs})

    def _surface(self, series: str, corun: bool) -> Surface:
        s = self.surfaces.get((series, corun)) or self.surfaces.get((series, False))
        if s is None:
            what = "draft-model steps" if series == "draft" else "early-exit draft steps"
            raise SimlabError(f"latency model {self.name!r} has no fit for {what}")
        return s

    def draft_step(self, context_len, layer: int = NO_LAYER, corun: bool = False):
        if layer == NO_LAYER and ("draft", False) not in self.surfaces:
            layer = self.draft_layer
        if layer == NO_LAYER:
            return self._surface("draft", corun)(1, context_len)
        return self._surface("exit", corun)(layer, context_len)

    def target_forward(self, k: int, context_len, corun: bool = False):
        check_k(k)
        return self._surface("target", corun)(k, context_len)

    def target_step(self, context_len):
        """The plain decoding step's surface where the trace timed one, else a one-token forward."""
        surface = self.surfaces.get(("target_step", False))
        return self.target_forward(1, context_len) if surface is None else surface(1, context_len)

    def target_tree(self, k: int, context_len, corun: bool = False):
        """The tree verification surface where the probe had a tree axis, else the chain's."""
        if ("target_tree", False) not in self.surfaces:
            return self.target_forward(k, context_len, corun)
        check_k(k)
        return self._surface("target_tree", corun)(k, context_len)

    def draft_tree_factor(self, w: int, context_len, corun: bool = False):
        """The expansion surface over the draft step where probed, else :func:`chain_factor`."""
        if ("draft_tree", False) not in self.surfaces:
            return chain_factor(self, w, context_len, corun)
        return self._surface("draft_tree", corun)(w, context_len) / self.draft_step(context_len, NO_LAYER, corun)

    def exit_head(self, rows: int) -> float | None:
        """The exit-head surface at ``rows`` where the probe had an exit-head axis, else None."""
        surface = self.surfaces.get(("exit_head", False))
        if surface is None:
            return None
        check_k(rows)
        return surface(rows, 0)

    def prefill(self, k: int, context_len, draft: bool = False) -> float | None:
        """The target's (``draft``: the draft's) prefill surface at k where the probe timed
        prefills, else None."""
        surface = self.surfaces.get(("draft_prefill" if draft else "target_prefill", False))
        if surface is None:
            return None
        check_k(k)
        return float(surface(k, context_len))

    def to_profile(self) -> dict:
        profile = {
            **profile_header("fitted", self),
            "draft_layer": self.draft_layer,
            "surfaces": _surface_list(self.surfaces),
            "held_out": self.held_out,
        }
        if self.batches:
            profile["batches"] = [{"batch": b, "surfaces": _surface_list(f.surfaces)} for b, f in sorted(self.batches.items())]
        return profile

    @classmethod
    def from_profile(cls, data: dict) -> "FittedLatency":
        name = str(data.get("name", "fitted"))
        try:
            surfaces = _surfaces(data["surfaces"], name)
            batches = {int(d["batch"]): _surfaces(d["surfaces"], name) for d in data.get("batches", [])}
        except (KeyError, TypeError, ValueError) as exc:
            raise SimlabError(f"latency profile {data.get('name', '?')!r} is malformed ({exc!r})") from exc
        hardware, source, layer = str(data.get("hardware", "")), str(data.get("source", "")), int(data.get("draft_layer", NO_LAYER))
        return cls(name, surfaces, hardware, source, dict(data.get("held_out", {})), layer,
                   {b: cls(f"{name} (batch {b})", surf, hardware, source, draft_layer=layer) for b, surf in batches.items()})


def _surface_list(surfaces: dict[tuple[str, bool], Surface]) -> list[dict]:
    return [{"series": s, "corun": c, **surf.to_dict()} for (s, c), surf in sorted(surfaces.items())]


def _surfaces(items: list[dict], name: str) -> dict[tuple[str, bool], Surface]:
    surfaces = {(str(d["series"]), bool(d["corun"])): Surface.from_dict(d) for d in items}
    unknown = {s for s, _ in surfaces} - set(SERIES)
    if unknown:
        raise SimlabError(f"latency profile {name!r} has unknown series {sorted(unknown)}")
    return surfaces


PROFILE_KINDS["fitted"] = FittedLatency.from_profile


def fit_latency(samples: pd.DataFrame, name: str = "fitted", hardware: str = "", form: str = "auto",
                source: str = "", draft_layer: int = NO_LAYER) -> FittedLatency:
    """Fit every series of a trace's latency table; ``form`` is ``auto`` (smallest BIC) or one
    of :data:`~simlab.latency.surface.FORMS` (where the series has enough sizes for it).
    ``draft_layer``: the manifest's exit layer that drafts in a self-speculative trace."""
    if form != "auto" and form not in FORMS:
        raise SimlabError(f"unknown form {form!r}; choose auto or one of {', '.join(FORMS)}")
    if samples.empty:
        raise SimlabError("the trace has no latency samples to fit")
    by_batch = dict(tuple(with_defaults("latency", samples).groupby("batch")))
    single = by_batch.pop(1, samples.iloc[:0])
    fitted = _fit_single(single, name, hardware, form, source, draft_layer)
    fitted.batches = {int(b): _fit_single(g, f"{name} (batch {b})", hardware, form, source, draft_layer)
                      for b, g in sorted(by_batch.items())}
    return fitted


def _fit_single(samples: pd.DataFrame, name: str, hardware: str, form: str, source: str,
                draft_layer: int) -> FittedLatency:
    """The surfaces of one batch size's samples."""
    series, size = series_of(samples), size_of(samples)
    surfaces: dict[tuple[str, bool], Surface] = {}
    for (s, corun), idx in samples.groupby([series, samples["corun"].astype(bool)]).groups.items():
        g = samples.loc[idx]
        x = size.loc[idx]
        forms = None if form == "auto" else ((form,) if form in available_forms(np.unique(x)) else ("affine",))
        surface, bics = fit_best(x, g["context_len"], g["seconds"], forms)
        surface.quality["bic_by_form"] = bics
        surfaces[(str(s), bool(corun))] = surface
    return FittedLatency(name, surfaces, hardware, source or "least-squares fit of trace samples",
                         draft_layer=draft_layer)


def thin_fits(model: FittedLatency) -> list[str]:
    """What each series' samples leave unmeasured, one sentence each: a series timed at one size
    (its slope in k, layers or nodes is then fitted as zero, and every other size is extrapolated),
    at one context (no context slope), or from one sample per point (no repeat to tell a figure
    from noise). Empty for a fit whose every series was measured on both axes with repeats."""
    out = []
    fits = [(1, model), *sorted(model.batches.items())]
    for b, (series, corun), s in ((b, key, s) for b, m in fits for key, s in sorted(m.surfaces.items())):
        label = f"{series}{' (co-run)' if corun else ''}{f' x{b} sequences' if b > 1 else ''}"
        q, size = s.quality, SIZE_NAMES.get(series, "k")
        if series not in ONE_SIZE and len(s.xs) < 2:
            out.append(f"{label}: samples at one {size} only ({size} = {s.xs[0]}): its slope in {size} is not measured "
                       f"(fitted as zero), so every other {size} is extrapolated")
        if series != "exit_head" and q.get("contexts", 2) < 2:
            out.append(f"{label}: samples at one context only ({s.ctx_min}): its slope in context is not measured")
        points = len(s.xs) * q.get("contexts", 1)
        if q.get("samples", 2 * points) <= points:
            out.append(f"{label}: one sample per measured point ({q['samples']} samples): no repeat to tell the "
                       "figure from noise")
    return out


def predict_samples(model, samples: pd.DataFrame) -> np.ndarray:
    """The model's seconds for every row of a latency table (a draft tree forward: the drafter's
    step times the model's factor, as the simulator prices it)."""
    out = np.empty(len(samples))
    for i, row in enumerate(with_defaults("latency", samples).itertuples(index=False)):
        m = model if row.batch == 1 else model.batches[int(row.batch)]
        k, ctx, corun = int(row.k), int(row.context_len), bool(row.corun)
        if row.op == "target_forward":
            out[i] = m.target_forward(k, ctx, corun)
        elif row.op == "target_tree":
            out[i] = m.target_tree(k, ctx, corun)
        elif row.op == "draft_tree":
            out[i] = m.draft_tree_factor(k, ctx, corun) * m.draft_step(ctx, NO_LAYER, corun)
        elif row.op == "exit_head":
            out[i] = m.exit_head(k)
        elif row.op == "target_step":
            out[i] = m.target_step(ctx)
        elif row.op in ("target_prefill", "draft_prefill"):
            out[i] = m.prefill(k, ctx, draft=row.op == "draft_prefill")
        else:
            out[i] = m.draft_step(ctx, int(row.layer), corun)
    return out


@dataclass(frozen=True)
class HeldOut:
    """Relative errors on samples left out of the fit, for the fit and for the median table."""

    folds: int
    samples: int
    fitted_median: float
    fitted_p90: float
    table_median: float
    by_series: dict[str, float]

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def held_out(samples: pd.DataFrame, form: str = "auto", draft_layer: int = NO_LAYER) -> HeldOut:
    """Leave one probe repeat out at a time: fit on the others, predict the left-out samples.

    The table baseline (medians of the training repeats) sees the same points, so it shows
    what the fit costs or gains where both have data. Needs at least two repeats. ``draft_layer``:
    the exit layer that drafts in a self-speculative trace (its tree forwards are priced in its steps)."""
    if samples["repeat"].nunique() < 2:
        raise SimlabError("held-out evaluation needs latency samples of at least two probe repeats")
    folds = samples["repeat"].to_numpy()
    fitted_err = np.empty(len(samples))
    table_err = np.empty(len(samples))
    for f in np.unique(folds):
        train, test = samples[folds != f], samples[folds == f]
        y = test["seconds"].to_numpy()
        fitted = fit_latency(train, form=form, draft_layer=draft_layer)
        fitted_err[folds == f] = np.abs(predict_samples(fitted, test) / y - 1.0)
        table = TableLatency.from_samples(train, draft_layer=draft_layer)
        table_err[folds == f] = np.abs(predict_samples(table, test) / y - 1.0)
    series = series_of(samples).to_numpy()
    corun = samples["corun"].astype(bool).to_numpy()
    batch = with_defaults("latency", samples)["batch"].to_numpy()
    by_series = {
        f"{s}{' (co-run)' if c else ''}{f' x{b}' if b > 1 else ''}":
            float(np.median(fitted_err[(series == s) & (corun == c) & (batch == b)]))
        for s, c, b in sorted(set(zip(series, corun, batch)))
    }
    return HeldOut(
        folds=len(np.unique(folds)),
        samples=len(samples),
        fitted_median=float(np.median(fitted_err)),
        fitted_p90=float(np.quantile(fitted_err, 0.9)),
        table_median=float(np.median(table_err)),
        by_series=by_series,
    )

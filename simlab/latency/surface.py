"""Seconds as a function of one size variable and the context length, fitted by least squares.

A forward's duration depends on how many positions it processes (``x`` = k new tokens of a
target forward, or the exit layer of a self-speculative draft step) and on how long the KV
cache it reads is (``ctx``). Every form shares the context term and differs in ``x``::

    seconds(x, ctx) = base(x) + (ctx_slope + ctx_x_slope * x) * ctx

- ``affine``:  base(x) = a + b·x. A GPU reading the same weights for any small k.
- ``hinge``:   base(x) = a + b·max(0, x − x0), x0 fitted: flat until the forward turns
  compute-bound, then linear (the roofline's shape) — piecewise-linear in x.
- ``per-x``:   one intercept per measured x, linear in between; beyond the last measured x the
  last segment's slope is extended (never downwards), as :class:`~simlab.latency.model.TableLatency`
  does. CPU verify cost is not monotone in k (2 CPU cores, Qwen pair: 317/660/935/575 ms for k=1..4), and
  only a table in x can hold that.

``ctx_slope`` is the cost of reading one more cached token; ``ctx_x_slope`` the attention
cost that grows with k·ctx. Both are constrained non-negative (a longer cache never makes a
forward faster), and so is the affine/hinge slope ``b``. Below the smallest measured context
the smallest context's figure is used (fixed costs dominate there); above the largest the
line is extended, which is what a fit is for.

Residuals are relative, ``(fit − measured) / measured``, so a 10 ms draft step weighs as much
as a 1 s verify, and the loss is scipy's ``soft_l1`` with a 5% scale: CPU timings have
outliers (another process wakes up) that a squared loss would chase.

:func:`fit_best` fits every form the data can identify and keeps the one with the smallest
Bayesian information criterion, computed from a robust residual scale (1.4826 × median
absolute relative residual), so a table in x is chosen only when the data need it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simlab.common.errors import SimlabError
from simlab.latency.model import _interp_k

FORMS = ("affine", "hinge", "per-x")
ROBUST_SCALE = 0.05  # soft_l1 scale on relative residuals
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Surface:
    """A fitted ``seconds(x, ctx)``; see the module docstring for the forms."""

    form: str
    base: tuple[float, ...]  # affine: (a, b); hinge: (a, b, x0); per-x: one intercept per xs
    xs: tuple[int, ...]  # the measured x values
    ctx_slope: float = 0.0
    ctx_x_slope: float = 0.0
    ctx_min: int = 0  # smallest measured context length (clamp below)
    quality: dict = field(default_factory=dict, compare=False)
    ctx_max: int | None = None  # largest measured context length (None: a profile written before it was kept)

    def base_at(self, x):
        if self.form == "affine":
            a, b = self.base
            return a + b * x
        if self.form == "hinge":
            a, b, x0 = self.base
            return a + b * np.maximum(0.0, x - x0)
        return _interp_k(x, self.xs, list(self.base))

    def __call__(self, x, ctx):
        """Seconds at size ``x`` (a number) and context ``ctx`` (a number or an array)."""
        c = np.maximum(np.asarray(ctx, dtype=float), self.ctx_min)
        out = self.base_at(x) + (self.ctx_slope + self.ctx_x_slope * x) * c
        return float(out) if np.ndim(out) == 0 else out

    def to_dict(self) -> dict:
        return {
            "form": self.form,
            "base": list(self.base),
            "xs": list(self.xs),
            "ctx_slope": self.ctx_slope,
            "ctx_x_slope": self.ctx_x_slope,
            "ctx_min": self.ctx_min,
            "quality": self.quality,
            **({} if self.ctx_max is None else {"ctx_max": self.ctx_max}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Surface":
        form = d["form"]
        if form not in FORMS:
            raise SimlabError(f"unknown latency surface form {form!r}; known: {', '.join(FORMS)}")
        surface = cls(form, tuple(float(v) for v in d["base"]), tuple(int(v) for v in d["xs"]),
                      float(d.get("ctx_slope", 0.0)), float(d.get("ctx_x_slope", 0.0)), int(d.get("ctx_min", 0)),
                      dict(d.get("quality", {})), None if d.get("ctx_max") is None else int(d["ctx_max"]))
        expected = {"affine": 2, "hinge": 3, "per-x": len(surface.xs)}[form]
        if len(surface.base) != expected:
            raise SimlabError(f"a {form} latency surface needs {expected} base parameters, got {len(surface.base)}")
        if min(surface.ctx_slope, surface.ctx_x_slope) < 0 or not all(map(math.isfinite, surface.base)):
            raise SimlabError("latency surface parameters must be finite, with non-negative context slopes")
        return surface


def _n_ctx_params(xs, n_contexts: int) -> int:
    if n_contexts < 2:
        return 0
    return 2 if len(xs) >= 2 else 1


def available_forms(xs) -> list[str]:
    """Forms the measured x values can tell apart: a table in x needs three points (two define
    the line), a hinge four (a knot between slopes)."""
    n = len(set(xs))
    return ["affine"] + (["per-x"] if n >= 3 else []) + (["hinge"] if n >= 4 else [])


class _Problem:
    """The data of one fit and the parameter layout of one form."""

    def __init__(self, form: str, x, ctx, y):
        self.form = form
        self.x = np.asarray(x, dtype=float)
        self.ctx = np.asarray(ctx, dtype=float)
        self.y = np.asarray(y, dtype=float)
        self.xs = tuple(int(v) for v in np.unique(self.x))
        self.contexts = len(np.unique(self.ctx))
        self.ctx_min, self.ctx_max = int(self.ctx.min()), int(self.ctx.max())
        self.n_ctx = _n_ctx_params(self.xs, self.contexts)
        if form == "per-x":
            self.index = np.searchsorted(self.xs, self.x)

    @property
    def n_base(self) -> int:
        return {"affine": 2 if len(self.xs) > 1 else 1, "hinge": 3, "per-x": len(self.xs)}[self.form]

    def surface(self, theta: np.ndarray, quality: dict | None = None) -> Surface:
        nb = self.n_base
        base = tuple(float(v) for v in theta[:nb])
        if self.form == "affine" and nb == 1:
            base = (base[0], 0.0)
        ctx = list(theta[nb:]) + [0.0, 0.0]
        return Surface(self.form, base, self.xs, float(ctx[0]), float(ctx[1]), self.ctx_min, quality or {},
                       self.ctx_max)

    def predict(self, theta: np.ndarray) -> np.ndarray:
        nb = self.n_base
        if self.form == "per-x":
            base = theta[:nb][self.index]
        elif self.form == "hinge":
            base = theta[0] + theta[1] * np.maximum(0.0, self.x - theta[2])
        else:
            base = theta[0] + (theta[1] * self.x if nb == 2 else 0.0)
        ctx = np.maximum(self.ctx, self.ctx_min)
        slope = (theta[nb] if self.n_ctx >= 1 else 0.0) + (theta[nb + 1] * self.x if self.n_ctx == 2 else 0.0)
        return base + slope * ctx

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        return (self.predict(theta) - self.y) / self.y

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        nb = self.n_base
        lo = np.full(nb + self.n_ctx, -np.inf)
        hi = np.full(nb + self.n_ctx, np.inf)
        lo[nb:] = 0.0  # context slopes
        if self.form in ("affine", "hinge") and nb >= 2:
            lo[1] = 0.0  # slope in x
        if self.form == "hinge":
            lo[2], hi[2] = self.xs[0], self.xs[-1]
        return lo, hi

    def start(self, knot: float | None = None) -> np.ndarray:
        """Weighted linear least squares (weights 1/y: relative residuals), clipped into bounds."""
        nb = self.n_base
        if self.form == "per-x":
            cols = [(self.index == i).astype(float) for i in range(nb)]
        else:
            cols = [np.ones_like(self.x)]
            if nb >= 2:
                cols.append(self.x if self.form == "affine" else np.maximum(0.0, self.x - knot))
        if self.n_ctx >= 1:
            cols.append(self.ctx)
        if self.n_ctx == 2:
            cols.append(self.x * self.ctx)
        design = np.column_stack(cols) / self.y[:, None]
        theta, *_ = np.linalg.lstsq(design, np.ones_like(self.y), rcond=None)
        if self.form == "hinge":
            theta = np.insert(theta, 2, knot)
        return np.clip(theta, *self.bounds())


def fit_surface(x, ctx, seconds, form: str) -> Surface:
    """Fit one form to samples ``seconds`` measured at ``(x, ctx)``."""
    if form not in FORMS:
        raise SimlabError(f"unknown latency form {form!r}; choose one of {', '.join(FORMS)} or auto")
    from scipy.optimize import least_squares  # imported here: simulating never needs scipy

    prob = _Problem(form, x, ctx, seconds)
    if len(prob.y) == 0:
        raise SimlabError("no latency samples to fit")
    if form not in available_forms(prob.xs):
        raise SimlabError(f"form {form!r} needs more distinct sizes than the {len(prob.xs)} measured ({list(prob.xs)})")
    starts = [prob.start(k) for k in prob.xs[1:-1]] if form == "hinge" else [prob.start()]
    lo, hi = prob.bounds()
    best = None
    for theta0 in starts:
        res = least_squares(prob.residuals, theta0, bounds=(lo, hi), loss="soft_l1", f_scale=ROBUST_SCALE,
                            x_scale="jac")
        if best is None or res.cost < best.cost:
            best = res
    quality = fit_quality(prob, best.x)
    return prob.surface(best.x, quality)


def fit_quality(prob: _Problem, theta: np.ndarray) -> dict:
    """How well the fit explains the data: R² over the measured points' medians (samples carry
    outliers that no model should chase), the median relative error over samples, the worst
    point, and the BIC used to choose between forms."""
    pred = prob.predict(theta)
    rel = (pred - prob.y) / prob.y
    points = sorted(set(zip(prob.x.tolist(), prob.ctx.tolist())))
    measured, fitted = np.empty(len(points)), np.empty(len(points))
    for i, (xv, cv) in enumerate(points):
        sel = (prob.x == xv) & (prob.ctx == cv)
        measured[i], fitted[i] = np.median(prob.y[sel]), pred[sel][0]
    ss_tot = float(((measured - measured.mean()) ** 2).sum())
    r2 = 1.0 - float(((fitted - measured) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    w = int(np.argmax(np.abs(fitted / measured - 1.0)))
    n = len(rel)
    sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(rel))), 1e-12)
    return {
        "samples": n,
        "contexts": prob.contexts,
        "r2": r2,
        "median_abs_rel_err": float(np.median(np.abs(rel))),
        "worst_point": {"x": int(points[w][0]), "context_len": int(points[w][1]), "measured_s": float(measured[w]),
                        "fitted_s": float(fitted[w]), "rel_err": float(fitted[w] / measured[w] - 1.0)},
        "bic": n * math.log(sigma**2) + len(theta) * math.log(n),
    }


def fit_best(x, ctx, seconds, forms: tuple[str, ...] | None = None) -> tuple[Surface, dict[str, float]]:
    """Fit each identifiable form (or those named) and keep the smallest BIC.
    Returns the chosen surface and every candidate's BIC."""
    xs = np.unique(np.asarray(x))
    candidates = [f for f in (forms or FORMS) if f in available_forms(xs)]
    if not candidates:
        raise SimlabError(f"none of the forms {list(forms or FORMS)} can be fitted to sizes {xs.tolist()}")
    fits = {f: fit_surface(x, ctx, seconds, f) for f in candidates}
    bics = {f: s.quality["bic"] for f, s in fits.items()}
    return fits[min(bics, key=bics.get)], bics

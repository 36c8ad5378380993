"""DEL's update (DEL_UPDATE, Algorithm 1 lines 18-30, eqs. 1-3), compiled with numba.

One piece of code serves both places that run it: :class:`~simlab.policies.early_exit.Del`
calls :func:`update` after every verification (live, and in the SimPy executor), and the
simulator's DEL replay (:mod:`simlab.sim.del_rounds`) calls it from its own compiled loop. DEL
updates after every round, over every exit layer; in Python and numpy that update was a third
of a simulated round, and the round protocol around it the rest (about 11 µs a round on a
2-core EPYC, where ``simlab bench``'s goal allows 2 µs a token and DEL keeps about one token a
round on ``smollm2-selfspec``).

Bit for bit as the Python it replaced: numba compiles without fast-math, so every ``+``, ``*``
and ``/`` is one IEEE operation in the order written (no fused multiply-add), as Python's; a
sum over rows adds them first to last, as the old numpy update did; and α^(d+1) is libm's
``pow`` of two floats, as Python's ``float ** int`` is (the exponent is made a float first:
numba's own ``float ** int`` multiplies instead). ``tests/test_policies.py`` pins
:func:`update` to the paper's update written plainly, and :func:`tpl_argmax` to the whole row.

Imported with the first DEL policy (``Del.__init__``), not with every simlab command: numba's
import takes 0.15-0.35 s on a 2-core box, a tenth to a fifth of a whole ``simulate`` of a million
tokens.

Editing this file: numba caches a compiled function beside its own file and checks only that
file for changes, so the compiled DEL replay calling into this one keeps the old code until
``simlab/sim/__pycache__/*.nbi`` and ``*.nbc`` are deleted (its tests then fail, not pass)."""

from __future__ import annotations

import numpy as np
from numba import njit

# "Clearly lower" (tpl_argmax): lower by far more than the few roundings of a computed entry
# (a relative 2⁻⁵³ each, and pow's error, under one ulp in glibc's, musl's and macOS's libm) ...
UP, DOWN = 1.0 + 1e-12, 1.0 - 1e-12
# ... and than pow's error in absolute terms: 1 − α^(d+1) cancels as α nears 1, and that error
# over 1 − α can dwarf the relative ones; it stays below SLACK / (1 − α), with room to spare.
SLACK = 1e-15
# ... and, from α alone: α·L below ℓ·FALLS puts TPL(1) below TPL(0) by a relative 1e-6/(L + 1)
# at least, above the error of a computed entry for any layer count below 10^5
FALLS = 1.0 - 1e-6


@njit(cache=True)
def tpl(alpha: float, lost: float, d: int, layer: int, n_layers: int) -> float:
    """Token-per-Layer (DEL eq. 1) of drafting d tokens with exit layer ℓ, for α < 1 (``lost``
    = 1 − α): the expected tokens of a round, (1 − α^(d+1))/(1 − α), over the layers it loads,
    d·ℓ + L."""
    return (1.0 - alpha ** float(d + 1)) / lost / float(d * layer + n_layers)


@njit(cache=True)
def tpl_row(alpha: float, layer: int, d_max: int, n_layers: int) -> np.ndarray:
    """:func:`tpl` for d = 0..d_max (at α = 1, (d + 1)/(d·ℓ + L)): the row of one layer that
    DEL's update maximises."""
    row = np.empty(d_max + 1)
    lost = 1.0 - alpha
    for d in range(d_max + 1):
        row[d] = (d + 1.0) / float(d * layer + n_layers) if alpha >= 1.0 else tpl(alpha, lost, d, layer, n_layers)
    return row


@njit(cache=True)
def row_max(row: np.ndarray) -> tuple[float, int]:
    """The largest entry of a TPL row and its first index (§4.3's argmax: the first d on ties)."""
    best, arg = row[0], 0
    for d in range(1, len(row)):
        if row[d] > best:
            best, arg = row[d], d
    return best, arg


@njit(cache=True)
def tpl_argmax(alpha: float, layer: int, d_max: int, n_layers: int, guess: int = 0) -> tuple[float, int]:
    """``row_max(tpl_row(alpha, layer, d_max, n_layers))``, bit for bit, from a few entries of
    the row: DEL evaluates every exit layer's row after every verification.

    Why a few entries suffice: 1 − α^(d+1) is concave in d and d·ℓ + L is positive and affine,
    so TPL is quasi-concave in d (once it falls, it keeps falling). A d whose neighbours are
    both lower holds the row's maximum, and every other entry is no higher than one of those
    neighbours. A computed entry is off the real one by a few roundings; a neighbour lower by
    far more than that (:data:`UP`, :data:`DOWN`, :data:`SLACK`) is lower in reals too, so
    every entry left uncomputed is below the computed maximum, which is therefore the row's
    first maximum. From ``guess`` (the layer's d at the previous update: α moves little from one
    verification to the next) the search climbs to such a d; where two entries are too close to
    call, it computes the whole row.

    Most rows need no entry at all: TPL(0) is exactly 1/L for every α < 1 ((1 − α)/(1 − α) is
    one to the last bit), and TPL(1) = (1 + α)/(ℓ + L) is below it exactly when α < ℓ/L, so a
    row with α clearly below ℓ/L falls from its first entry (exit layers that seldom match the
    target's token have such rows).
    """
    if alpha >= 1.0:
        return row_max(tpl_row(alpha, layer, d_max, n_layers))
    if alpha * n_layers < layer * FALLS:
        return 1.0 / n_layers, 0
    lost = 1.0 - alpha
    slack = SLACK / lost
    d = min(max(guess, 0), d_max)
    x = tpl(alpha, lost, d, layer, n_layers)
    for step in (1, -1):
        climbed = False
        while 0 <= d + step <= d_max:
            y = tpl(alpha, lost, d + step, layer, n_layers)
            if y * UP + slack < x * DOWN:  # this side falls
                break
            if not x * UP + slack < y * DOWN:  # too close to call
                return row_max(tpl_row(alpha, layer, d_max, n_layers))
            d, x, climbed = d + step, y, True
        if climbed:  # the side it climbed from falls
            break
    return x, d


@njit(cache=True)
def threshold(sums: np.ndarray, i: int, k: int) -> float:
    """τ (eq. 3) of the i-th of ``k`` exit layers from the decayed sums (:func:`update`); a side
    with no tokens yet reads 1 (matched) or 0 (mismatched)."""
    c, tcs, fcs = sums[1 + i], sums[1 + k + i], sums[1 + 2 * k + i]
    mismatched = sums[0] - c
    matched_conf = tcs / c if c > 0 else 1.0
    mismatched_conf = fcs / mismatched if mismatched > 1e-12 else 0.0
    return (matched_conf + mismatched_conf) / 2


@njit(cache=True)
def update(sums: np.ndarray, rows: np.ndarray, alpha: np.ndarray, guess: np.ndarray, searched: np.ndarray,
           constants: tuple) -> tuple[int, int, float]:
    """DEL_UPDATE over the shadow-token ``rows`` of the positions a target forward settled (a
    :class:`~simlab.common.signals.ShadowTokens` table: S(n), then S(c^ℓ), S(tcs^ℓ), S(fcs^ℓ) per exit
    layer). Updates ``sums`` (S ← ω·S + the rows, eq. 2's decayed sums) and ``alpha`` (α_ℓ =
    S(c^ℓ)/S(n)) in place; returns the index of the exit layer E, γ, and τ_E (eq. 3), the one
    threshold a round reads.

    §4.3: (E, γ) = argmax over ℓ and d of TPL(ℓ, d), the first (ℓ, d) on ties. A layer with α·L
    clearly below ℓ has the row maximum 1/L at d = 0 (:func:`tpl_argmax`'s first test); the
    first such layer stands for them all, as the others tie with it and come after it.
    ``guess``/``searched``: each layer's argmax at the last update and whether it was searched
    then (where the search starts; never what it finds). ``constants``: ω, L as a float,
    ℓ·FALLS per layer, the layers, d_max, L, and each layer's TPL maximum and argmax at α = 1
    (:meth:`~simlab.policies.early_exit.Del.constants`).
    """
    omega, scale, falls, layers, d_max, n_layers, top, top_d = constants
    k = len(layers)
    for j in range(len(sums)):
        total = rows[0, j]
        for r in range(1, rows.shape[0]):  # first to last
            total = total + rows[r, j]
        sums[j] = sums[j] * omega + total
    first_off = -1
    for i in range(k):
        alpha[i] = sums[1 + i] / sums[0]  # eq. 2
    best, chosen, gamma = -1.0, 0, 0
    for i in range(k):
        search = alpha[i] * scale >= falls[i]
        if not search:
            if first_off >= 0:
                searched[i] = False
                continue
            first_off = i
        if not searched[i]:
            guess[i] = 0
        searched[i] = True
        if alpha[i] >= 1.0:
            value, d = top[i], top_d[i]
        else:
            value, d = tpl_argmax(alpha[i], layers[i], d_max, n_layers, guess[i])
            guess[i] = d
        if value > best:
            best, chosen, gamma = value, i, d
    return chosen, gamma, threshold(sums, chosen, k)

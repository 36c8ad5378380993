"""The speed-versus-cost frontier: which configurations no other one beats on both counts.

A row is Pareto-optimal when no other row has at least its speedup at no more than its cost
and is strictly better in one of the two (SPIDE §4.1: "Speed" is maximised, "Cost" — target
calls relative to vanilla SD at its best γ — is minimised). Consequences, pinned by tests:

- duplicates (equal speedup and equal cost) do not dominate each other: all are optimal or
  none is;
- at equal cost only the highest speedup is optimal; at equal speedup only the lowest cost;
- a row with a NaN speedup or cost is never optimal and never dominates another.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def pareto_mask(speedup, cost) -> np.ndarray:
    """Boolean array: True where the row is Pareto-optimal (max speedup, min cost).

    Sorted by cost, a row is optimal iff it has the highest speedup among rows of its cost
    and beats every row of strictly lower cost: O(n log n).
    """
    s = np.asarray(speedup, dtype=float)
    c = np.asarray(cost, dtype=float)
    if s.shape != c.shape or s.ndim != 1:
        raise ValueError("speedup and cost must be 1-D and of equal length")
    mask = np.zeros(len(s), dtype=bool)
    valid = np.flatnonzero(np.isfinite(s) & np.isfinite(c))
    if not len(valid):
        return mask
    order = valid[np.lexsort((-s[valid], c[valid]))]  # by cost, then speedup descending
    best_below = -np.inf  # best speedup among rows of strictly lower cost
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and c[order[j]] == c[order[i]]:
            j += 1
        top = s[order[i]]  # highest speedup at this cost
        if top > best_below:
            group = order[i:j]
            mask[group[s[group] == top]] = True
            best_below = top
        i = j
    return mask


def pareto_front(table: pd.DataFrame, speedup: str = "speedup", cost: str = "cost") -> pd.DataFrame:
    """The Pareto-optimal rows of ``table``, by increasing cost (the frontier, left to right)."""
    mask = pareto_mask(table[speedup], table[cost])
    return table[mask].sort_values([cost, speedup], ascending=[True, False], kind="stable")

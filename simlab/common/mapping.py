"""SPIDE's confidence→acceptance mapping table: its 20 confidence bins and their counts.

SPIDE §3.2 (Figure 4) keeps, per confidence interval, how many draft tokens were verified
and how many accepted: [0, 0.1), [0.1, 0.2), ..., [0.8, 0.9), then [0.9, 0.91), ...,
[0.99, 1.0) — a finer grid where most tokens fall — and the single value 1.0 (at bfloat16
precision, see ``ONE``): 20 bins.
Confidence is the draft's top-1 probability (SPIDE eq. 2).

Tables use the columns of ``calibrate/mapping/*.csv`` (``conf_low, conf_high, count,
accepted``), so a table measured on a trace and one printed in a paper read alike. Plain
numpy/pandas: policies may import this (SPIDE's online table uses the same bins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and pandas where a table is built: SPIDE's policy imports this module's bins
    import numpy as np
    import pandas as pd

# The paper's last bin, "1.0", holds the confidences that are 1.0 at the precision of its models:
# "all models are loaded with bfloat-16 precision" (Appendix, Table 6), and bfloat16 rounds
# everything from 1 - 2^-9 (halfway between 1 and the largest bfloat16 below it, 1 - 2^-8) up
# to 1.0. That is why Figure 4's "1.0" row holds 83% of the tokens. An edge at exactly 1.0
# would be empty in float32 but for last-bit noise, which sorts one token differently in a
# batched (recorded) and a KV-cached (live) forward.
ONE = 1 - 2**-9

# Lower edges of the 20 bins as the paper names them; the last bin, "1.0", holds every
# confidence from ONE up.
SPIDE_EDGES: tuple[float, ...] = (
    *(round(0.1 * i, 1) for i in range(10)),  # 0.0 .. 0.9
    *(round(0.9 + 0.01 * i, 2) for i in range(1, 10)),  # 0.91 .. 0.99
    1.0,
)
MAPPING_COLUMNS = ("conf_low", "conf_high", "count", "accepted")


def spide_bin(confidence) -> np.ndarray:
    """Bin index 0..19 of each confidence (values outside [0, 1] are clipped)."""
    import numpy as np

    c = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
    return np.where(c >= ONE, len(SPIDE_EDGES) - 1, np.searchsorted(SPIDE_EDGES, c, side="right") - 1)


def mapping_table(confidence, accepted) -> pd.DataFrame:
    """Counts per SPIDE bin (all 20 rows, empty bins included) of drafted tokens and accepts."""
    import numpy as np
    import pandas as pd

    bins = spide_bin(confidence)
    acc = np.asarray(accepted, dtype=bool)
    n = len(SPIDE_EDGES)
    return pd.DataFrame({
        "conf_low": SPIDE_EDGES,
        "conf_high": (*SPIDE_EDGES[1:], 1.0),
        "count": np.bincount(bins, minlength=n),
        "accepted": np.bincount(bins[acc], minlength=n),
    })


def bin_label(low: float, high: float) -> str:
    """'[0.9, 0.91)'; the single-value bin is '1.0'."""
    return str(float(low)) if low == high else f"[{low:g}, {high:g})"

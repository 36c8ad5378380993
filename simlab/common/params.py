"""Policy parameter values as users type them (``--param``, sweep grids, grid files)."""

from __future__ import annotations

from typing import Any

from simlab.common.errors import SimlabError


def parse_value(text: str) -> Any:
    """'5' -> 5, '0.7' -> 0.7, 'true' -> True, anything else stays a string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def check_seed(seed: int) -> int:
    """Seeds feed numpy's generators, which take only non-negative integers."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SimlabError(f"--seed must be a non-negative integer, got {seed!r}")
    return seed

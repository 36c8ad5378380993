"""Policy parameter values as users type them (``--param``, sweep grids, grid files)."""

from __future__ import annotations

from typing import Any


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

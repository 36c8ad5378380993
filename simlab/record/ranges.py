"""Integer lists written as ranges, as options take them: ``1-4,8`` -> (1, 2, 3, 4, 8)."""

from __future__ import annotations

import re


def int_ranges(text: str) -> tuple[int, ...]:
    """Sorted distinct integers of ``text``; ValueError if it is not a list like ``1-4,8``."""
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if m is None:
            raise ValueError(f"{text!r} is not a list like 1-4,8")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"{part.strip()!r} is an empty range")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))

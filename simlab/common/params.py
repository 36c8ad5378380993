"""Policy parameter values as users type them (``--param``, sweep grids, grid files)."""

from __future__ import annotations

import math
import re
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


DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_device(device: str | None, option: str = "--device") -> str | None:
    """A device simlab loads models on: ``cpu`` or ``cuda`` (``cuda:N``); None (the default)
    passes. Checked before any model loads (torch would refuse another name only then)."""
    if device is not None and not DEVICE.fullmatch(device):
        raise SimlabError(f"{option} must be cpu, cuda or cuda:N, got {device!r}")
    return device


def check_temperature(temperature: float) -> float:
    """A sampling temperature: a finite number >= 0 (0: greedy)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise SimlabError(f"--temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    return float(temperature)

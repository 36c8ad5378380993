"""Arrival times of the requests a serving run replays: a seeded Poisson process or a file."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from simlab.common.errors import SimlabError


def poisson_arrivals(rate: float, requests: int, seed: int = 0) -> list[float]:
    """``requests`` arrival times (seconds) of a Poisson process of ``rate`` requests per second:
    exponential gaps drawn under ``seed``, the first one after a gap."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise SimlabError(f"--rate must be a finite number > 0 (requests per second), got {rate}")
    check_requests(requests)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, requests)
    return np.cumsum(gaps).tolist()


def check_requests(requests: int) -> None:
    if requests < 1:
        raise SimlabError(f"--requests must be >= 1, got {requests}")


def read_arrivals(path: str | os.PathLike) -> list[float]:
    """Arrival times from a text file: one time in seconds per line, non-negative and in
    non-decreasing order; blank lines and lines starting with ``#`` are skipped."""
    p = Path(path)
    if not p.is_file():
        raise SimlabError(f"arrivals file not found: {p}")
    times: list[float] = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            t = float(text)
        except ValueError:
            raise SimlabError(f"{p}:{n}: an arrival time must be a number of seconds, got {text!r}") from None
        if not math.isfinite(t) or t < 0:
            raise SimlabError(f"{p}:{n}: arrival times must be finite and >= 0, got {text}")
        if times and t < times[-1]:
            raise SimlabError(f"{p}:{n}: arrival times must be sorted, got {t} after {times[-1]}")
        times.append(t)
    if not times:
        raise SimlabError(f"{p} holds no arrival times")
    return times

"""Arrival times of the requests a serving run replays: a seeded Poisson process or a file."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from simlab.common.errors import SimlabError
from simlab.common.inputs import read_text

# The latest arrival a run may have, in seconds (about 32 years): the serving clock is a float of
# seconds, whose spacing passes 0.1 µs beyond it, so a forward of microseconds would no longer move
# the clock and every latency would read 0 s (a rate of 1e-300 per second once printed TTFT, TPOT
# and end-to-end latency all 0.0 s).
MAX_ARRIVAL_S = 1e9


def poisson_arrivals(rate: float, requests: int, seed: int = 0) -> list[float]:
    """``requests`` arrival times (seconds) of a Poisson process of ``rate`` requests per second:
    exponential gaps drawn under ``seed``, the first one after a gap."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise SimlabError(f"--rate must be a finite number > 0 (requests per second), got {rate}")
    check_requests(requests)
    with np.errstate(over="ignore", divide="ignore"):
        times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, requests))
    if not times[-1] <= MAX_ARRIVAL_S:  # inf and nan too
        raise SimlabError(f"--rate {rate:g} is too low: {requests} arrivals reach {times[-1]:.3g} s, past "
                          f"{MAX_ARRIVAL_S:.0e} s, where the clock no longer resolves a forward")
    return times.tolist()


MAX_REQUESTS = 1_000_000  # hours of serving on one core, and arrays sized by it: more is a typo


def check_requests(requests: int) -> None:
    if requests < 1:
        raise SimlabError(f"--requests must be >= 1, got {requests}")
    if requests > MAX_REQUESTS:
        raise SimlabError(f"--requests must be at most {MAX_REQUESTS:,}, got {requests:,}")


def read_arrivals(path: str | os.PathLike) -> list[float]:
    """Arrival times from a text file: one time in seconds per line, non-negative and in
    non-decreasing order; blank lines and lines starting with ``#`` are skipped."""
    p = Path(path)
    times: list[float] = []
    for n, line in enumerate(read_text(p, "arrivals file").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            t = float(text)
        except ValueError:
            raise SimlabError(f"{p}:{n}: an arrival time must be a number of seconds, got {text!r}") from None
        if not math.isfinite(t) or t < 0:
            raise SimlabError(f"{p}:{n}: arrival times must be finite and >= 0, got {text}")
        if t > MAX_ARRIVAL_S:
            raise SimlabError(f"{p}:{n}: arrival times must be at most {MAX_ARRIVAL_S:.0e} s, where the clock still "
                              f"resolves a forward, got {text}")
        if times and t < times[-1]:
            raise SimlabError(f"{p}:{n}: arrival times must be sorted, got {t} after {times[-1]}")
        times.append(t)
    if not times:
        raise SimlabError(f"{p} holds no arrival times")
    return times

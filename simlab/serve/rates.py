"""Serving over a range of request rates: goodput and latency against load
(``simlab serve --rate 0.5,1,2,4``).

Each rate is one :func:`simlab.serve.run.serve` run — the configured policy and, unless the
baseline is off, the same arrivals without speculation (``ad``) — so a sweep is nothing but
``serve`` repeated. Every rate replays the same seeded draw: :func:`poisson_arrivals` draws the
gaps as exponential(1 / rate) from one generator seeded by ``seed``, so the arrivals at rate r
are those at rate 1 divided by r, and the rates differ in load only, not in luck.
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd
from tqdm import tqdm

from simlab.errors import SimlabError
from simlab.serve.run import BASELINE_POLICY, ServeConfig, ServeRun, serve
from simlab.serve.workload import poisson_arrivals
from simlab.sim.run import Simulator


def parse_rates(text: str) -> list[float]:
    """``"0.5,1,2,4"`` -> [0.5, 1.0, 2.0, 4.0]: finite, positive, increasing."""
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise SimlabError(f"--rate takes requests per second, or a comma-separated list of them, got {text!r}") from None
    if not all(math.isfinite(r) and r > 0 for r in rates):
        raise SimlabError(f"--rate must be finite numbers > 0 (requests per second), got {text!r}")
    if rates != sorted(set(rates)):
        raise SimlabError(f"--rate lists increasing rates, got {text!r}")
    return rates


def series_label(policy: str, params: dict, batch_policy: str) -> str:
    """A served configuration's name in tables and plot legends: ``sd(gamma=4)``, ``sd(gamma=8) + smartspec``."""
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    name = f"{policy}({shown})" if shown else policy
    return name if batch_policy == "none" else f"{name} + {batch_policy}"


def _row(rate: float, label: str, speculative: bool, run: ServeRun, extra: dict) -> dict:
    stats = run.stats
    return {"rate_per_s": rate, "label": label, "policy": run.policy, "batch_policy": run.batch_policy,
            "speculative": speculative, **run.summary,
            "mean_batch": stats.batch_sizes / stats.decode_steps if stats.decode_steps else 0.0, **extra}


def rate_sweep(sim: Simulator, rates: Sequence[float], requests: int, seed: int, config: ServeConfig,
               baseline: bool = True, progress: bool | None = None) -> pd.DataFrame:
    """One row per rate and served policy (the configured one, then ``ad`` when ``baseline``),
    with ``serve``'s summary figures; the speculative rows carry the speedups at that load.
    ``progress``: a bar on stderr (None: on a terminal only)."""
    rows = []
    for rate in tqdm(rates, desc="serve", unit="rate", disable=None if progress is None else not progress,
                     dynamic_ncols=True):
        res = serve(sim, poisson_arrivals(rate, requests, seed), config, baseline=baseline)
        label = series_label(config.policy, config.params, res.run.batch_policy)
        rows.append(_row(rate, label, True, res.run, res.speedups))
        if res.baseline:
            rows.append(_row(rate, f"{BASELINE_POLICY} (no SD)", False, res.baseline, {}))
    return pd.DataFrame(rows)

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
from dataclasses import replace
from typing import Sequence

import pandas as pd
from tqdm import tqdm

from simlab.common.errors import SimlabError
from simlab.latency.priced import rules_text
from simlab.serve.metrics import speedups
from simlab.serve.run import BASELINE_POLICY, ServeConfig, serve_once
from simlab.serve.workload import poisson_arrivals
from simlab.sim.run import Simulator


def parse_rates(text: str) -> list[float]:
    """``"0.5,1,2,4"`` -> [0.5, 1.0, 2.0, 4.0]: finite, positive, increasing."""
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise SimlabError(f"--rate takes requests per second, or a comma-separated list of them, got {text!r}") from None
    check_rates(rates, text)
    return rates


def check_rates(rates: Sequence[float], shown: str | None = None) -> None:
    """Rates are finite, > 0 and increasing (``shown``: how the user wrote them)."""
    shown = repr(shown) if shown is not None else str(list(rates))
    if not rates or not all(isinstance(r, (int, float)) and math.isfinite(r) and r > 0 for r in rates):
        raise SimlabError(f"--rate must be finite numbers > 0 (requests per second), got {shown}")
    if list(rates) != sorted(set(rates)):
        raise SimlabError(f"--rate lists increasing rates, got {shown}")


def series_label(policy: str, params: dict, batch_policy: str) -> str:
    """A served configuration's name in tables and plot legends: ``sd(gamma=4)``, ``sd(gamma=8) + smartspec``."""
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    return with_batch_policy(f"{policy}({shown})" if shown else policy, batch_policy)


def with_batch_policy(name: str, batch_policy: str) -> str:
    return name if batch_policy == "none" else f"{name} + {batch_policy}"


BASELINE_LABEL = f"{BASELINE_POLICY} (no SD)"


def serve_at_rate(sim: Simulator, rate: float, requests: int, seed: int, config: ServeConfig) -> dict:
    """``config``'s policy served on ``requests`` Poisson arrivals at ``rate`` (the draw of
    ``seed``, time-scaled), as a row: rate, ``speculative``, ``serve``'s summary figures, the
    mean decoding batch. The row has no label: a caller names its series."""
    run = serve_once(sim, poisson_arrivals(rate, requests, seed), config, config.policy, config.params)
    stats = run.stats
    priced = run.priced.to_dict()
    return {"rate_per_s": rate, "policy": run.policy, "batch_policy": run.batch_policy,
                 "speculative": run.policy != BASELINE_POLICY, **run.summary,
                 "mean_batch": stats.batch_sizes / stats.decode_steps if stats.decode_steps else 0.0,
                 "priced_forwards": priced["priced_forwards"], "extrapolated_forwards": priced["extrapolated_forwards"],
                 "extrapolated_rules": rules_text(priced["extrapolated_by_rule"])}


def rate_sweep(sim: Simulator, rates: Sequence[float], requests: int, seed: int, config: ServeConfig,
               baseline: bool = True, progress: bool | None = None) -> pd.DataFrame:
    """One row per rate and served policy (the configured one, then ``ad`` when ``baseline``),
    with ``serve``'s summary figures; the speculative rows carry the speedups at that load.
    ``progress``: a bar on stderr (None: on a terminal only). ``simlab sweep --rate`` serves
    grids of policies the same way, in parallel (:mod:`simlab.sweep.serving`)."""
    rows = []
    for rate in tqdm(rates, desc="serve", unit="rate", disable=None if progress is None else not progress,
                     dynamic_ncols=True):
        row = serve_at_rate(sim, rate, requests, seed, config)
        rows.append({"rate_per_s": rate, "label": series_label(config.policy, config.params, row["batch_policy"]), **row})
        if baseline:
            base = serve_at_rate(sim, rate, requests, seed, replace(config, policy=BASELINE_POLICY, params={}))
            rows[-1].update(speedups(row, base))
            rows.append({"rate_per_s": rate, "label": BASELINE_LABEL, **base})
    return pd.DataFrame(rows)

"""Serving sweeps: every configuration of a grid served at every request rate
(``simlab sweep --rate R1,R2,... --policy ...``).

A serving sweep is a sweep whose unit of work is one configuration served at one rate
(:func:`simlab.serve.rates.serve_at_rate`: Poisson arrivals drawn under the sweep's seed and
time-scaled to the rate, so every configuration meets the same requests at the same times).
It runs on the sweep's executors (process pool or Ray) and result store, so a grid of rates
× policies spreads over the cores and resumes after an interruption. The load without
speculation (``ad``) is one more configuration per rate, served once however many policies
share it; each speculative row carries its speedups over the ``ad`` row of its rate, as
``simlab serve --rate`` computes them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pandas as pd

from simlab.serve.batch_policy import BatchSpec
from simlab.serve.metrics import Slo, speedups
from simlab.serve.rates import BASELINE_LABEL, check_rates, serve_at_rate, with_batch_policy
from simlab.serve.run import ServeConfig
from simlab.serve.scheduler import Scheduler
from simlab.serve.workload import check_requests
from simlab.sim.run import Simulator
from simlab.sweep.result_table import with_params


@dataclass(frozen=True)
class ServeLoad:
    """The load a serving sweep puts every configuration under: Poisson arrivals at each rate,
    ``requests`` of them, and the engine's settings (scheduler, batch-level policy, SLOs);
    ``baseline``: also serve each rate without speculation, for the speedups."""

    rates: tuple[float, ...]
    requests: int
    scheduler: Scheduler = Scheduler()
    batch: BatchSpec = BatchSpec()
    slo: Slo = Slo()
    baseline: bool = True

    def __post_init__(self) -> None:
        check_rates(self.rates)
        check_requests(self.requests)

    def serve(self, sim: Simulator, policy: str, params: dict[str, Any], rate: float) -> dict[str, Any]:
        """One configuration served at one rate (the arrivals of ``sim``'s seed): its row of the
        table, without label or speedups."""
        return serve_at_rate(sim, rate, self.requests, sim.seed, ServeConfig(policy, params, self.scheduler, self.batch, self.slo))

    def describe(self) -> dict[str, Any]:
        """What a served row depends on besides its policy, rate and the simulator's setup (a cache key's part)."""
        return {"requests": self.requests, **dataclasses.asdict(self.scheduler), **self.batch.describe(),
                "slo": dataclasses.asdict(self.slo)}

    def columns(self) -> dict[str, Any]:
        """The settings every row of the table states."""
        return {"requests_per_rate": self.requests, "max_batch": self.scheduler.max_batch,
                "token_budget": self.scheduler.token_budget,
                "mixed_prefill": self.scheduler.mixed, "slo_ttft_s": self.slo.ttft_s, "slo_tpot_s": self.slo.tpot_s}


def serve_table(rows: list[dict[str, Any]], names: list[str], sim: Simulator, load: ServeLoad) -> pd.DataFrame:
    """One row per rate and configuration (rates in order; at each, the grid's configurations,
    then ``ad`` without speculation), named by ``names`` (the sweep's labels, one per row); the
    speculative rows carry their speedups over the ``ad`` row at the same rate when there is one."""
    base = {row["rate_per_s"]: row for row in rows if not row["speculative"]}
    records = []
    for row, name in zip(rows, names):
        served = {k: v for k, v in row.items() if k not in ("key", "params", "sim_seconds", "cpu_seconds")}
        label = with_batch_policy(name, row["batch_policy"]) if row["speculative"] else BASELINE_LABEL
        ref = base.get(row["rate_per_s"])
        records.append({
            "rate_per_s": row["rate_per_s"], "label": label, **served,
            **(speedups(row, ref) if row["speculative"] and ref is not None else {}),
            "trace": str(sim.trace.path or sim.trace.manifest.dataset), "latency": sim.latency.name,
            "seed": sim.seed, **load.columns(),
            "sim_seconds": row["sim_seconds"], "cpu_seconds": row["cpu_seconds"], "key": row["key"],
        })
    return with_params(pd.DataFrame.from_records(records), rows, after="policy")

"""The metrics of a serving run, defined here only.

Per request (times in seconds of model time):

- TTFT (time to first token) = first token − arrival: queueing plus the prefill step;
- TPOT (time per output token) = (finish − first token) / (tokens − 1), the decode time per
  token after the first (vLLM's definition); undefined for one-token answers;
- end-to-end latency = finish − arrival;
- tokens: every generated position, the prefill's first token included.

Per run: throughput = generated tokens / makespan (first arrival to last finish); a request
meets the SLOs when its TTFT ≤ ``--slo-ttft`` and its TPOT ≤ ``--slo-tpot`` (either may be
absent); SLO attainment is the fraction that meet them, and goodput the requests per second
that meet them (DistServe's "goodput" is the highest rate at a target attainment; this is
the rate of SLO-meeting requests at the simulated load — a sweep over rates, ``simlab serve
--rate`` or ``simlab sweep --rate``, gives DistServe's figure). Speedup at a load compares the
same arrivals served without speculation (policy ``ad``): mean end-to-end latency and mean
TPOT without over with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from simlab.common.errors import SimlabError
from simlab.common.metrics import _ratio
from simlab.serve.request import ServedRequest

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in seconds (None: no objective)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for flag, v in (("--slo-ttft", self.ttft_s), ("--slo-tpot", self.tpot_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise SimlabError(f"{flag} must be a number of seconds > 0, got {v}")


def request_frame(requests: Sequence[ServedRequest], slo: Slo) -> pd.DataFrame:
    """One row per request, in request order."""
    rows = []
    for r in sorted(requests, key=lambda r: r.request_id):
        n = r.kept
        c = r.counts
        tpot = (r.finish - r.first_token) / (n - 1) if n > 1 else math.nan
        rows.append({
            "request_id": r.request_id, "prompt_id": r.replay.prompt_id, "prompt_len": r.prompt_len,
            "arrival_s": r.arrival, "admitted_s": r.admitted, "first_token_s": r.first_token, "finish_s": r.finish,
            "queue_s": r.admitted - r.arrival, "ttft_s": r.first_token - r.arrival, "tpot_s": tpot,
            "e2e_s": r.finish - r.arrival, "tokens": n, "target_calls": c.target_calls, "drafted": c.drafted,
            "accepted": c.accepted,
        })
    df = pd.DataFrame(rows)
    ok = np.ones(len(df), dtype=bool)
    if slo.ttft_s is not None:
        ok &= df["ttft_s"].to_numpy() <= slo.ttft_s
    if slo.tpot_s is not None:
        tpot = df["tpot_s"].to_numpy()
        ok &= np.isnan(tpot) | (tpot <= slo.tpot_s)
    df["meets_slo"] = ok
    return df


def summarize(df: pd.DataFrame) -> dict:
    """Run-level figures from :func:`request_frame`'s rows (keys are the JSON output's)."""
    makespan = float(df["finish_s"].max() - df["arrival_s"].min())
    out = {
        "requests": len(df),
        "tokens": int(df["tokens"].sum()),
        "makespan_s": makespan,
        "throughput_tokens_per_s": _ratio(int(df["tokens"].sum()), makespan),
        "throughput_requests_per_s": _ratio(len(df), makespan),
    }
    for name in LATENCIES:
        values = df[f"{name}_s"].dropna().to_numpy()
        out[f"{name}_mean_s"] = float(values.mean()) if len(values) else math.nan
        for p in PERCENTILES:
            out[f"{name}_p{p}_s"] = float(np.percentile(values, p)) if len(values) else math.nan
    met = int(df["meets_slo"].sum())
    out["slo_attainment"] = met / len(df)
    out["goodput_requests_per_s"] = _ratio(met, makespan)
    drafted, accepted = int(df["drafted"].sum()), int(df["accepted"].sum())
    out["acceptance_rate"] = _ratio(accepted, drafted)
    out["mean_accept_len"] = _ratio(int(df["tokens"].sum()) - len(df), int(df["target_calls"].sum()))
    return out


def speedups(spec: dict, baseline: dict) -> dict:
    """How much the speculative run gained over the same load without speculation."""
    return {
        "e2e_speedup": _ratio(baseline["e2e_mean_s"], spec["e2e_mean_s"]),
        "tpot_speedup": _ratio(baseline["tpot_mean_s"], spec["tpot_mean_s"]),
        "throughput_ratio": _ratio(spec["throughput_tokens_per_s"], baseline["throughput_tokens_per_s"]),
    }

"""llama.cpp's ``llama-speculative-simple`` measured against simlab's prediction of it.

The prediction comes first and from a trace recorded earlier with llama.cpp as the engine
(``simlab llama-cpp record``): the ``llama-cpp`` policy with the run's ``--draft-max``,
``--draft-min``, ``--draft-p-min`` and ``-n`` (its ``n_predict`` parameter, which applies
speculative-simple's own end of generation) simulated on that trace. Then the real binary
decodes each of the trace's prompts with the same arguments and its printed counters are read
(:mod:`simlab.engines.llama_cpp.run`).

Compared per prompt: ``n_drafted`` (drafts the target verified), ``n_accept``, ``n_predict``
(tokens generated) and the decode loop's tokens/s. Counts should agree exactly when the binary
follows the trace's greedy path; tokens/s differs by what the trace's step latencies leave out
(docs/llama-cpp.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd

from simlab.common.metrics import Counts
from simlab.engines.llama_cpp.args import ModelPair
from simlab.engines.llama_cpp.run import EngineRun, run
from simlab.policies import make_policy
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.io import Trace

COUNTERS = ("n_drafted", "n_accept", "n_predict")


def predict(trace: Trace, n_predict: int, draft_max: int, p_min: float, draft_min: int = 0,
            latency: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per prompt, what the llama-cpp policy predicts speculative-simple prints for this trace;
    ``latency``: step latencies timed again (:func:`simlab.engines.llama_cpp.record.reprobe`) in
    place of the trace's."""
    sim = Simulator(trace if latency is None else replace(trace, latency=latency))
    policy = make_policy("llama-cpp", sim.context(), draft_max=draft_max, draft_min=draft_min, p_min=p_min,
                         n_predict=n_predict)
    runs = SimExecutor(sim.latency, sim.topology).run(sim.replay, policy).prompts
    return pd.DataFrame([_predicted(r.prompt_id, r.counts) for r in runs])


def _predicted(prompt_id: int, c: Counts) -> dict:
    return {"prompt_id": prompt_id, "predicted_n_drafted": c.verified, "predicted_n_accept": c.accepted,
            "predicted_n_predict": c.tokens, "predicted_decode_s": c.wall_time_s,
            "predicted_tokens_per_s": c.tokens / c.wall_time_s if c.wall_time_s else float("nan")}


def measure(binary: Path, pair: ModelPair, trace: Trace, n_predict: int, draft_max: int, p_min: float,
            draft_min: int = 0, progress: Callable[[int], None] = lambda _: None) -> pd.DataFrame:
    """Per prompt, what llama-speculative-simple printed for the trace's prompts."""
    rows = []
    for i, p in enumerate(trace.prompts.itertuples(index=False)):
        measured: EngineRun = run(binary, pair, p.prompt_text, n_predict, draft_max, draft_min, p_min)
        rows.append({"prompt_id": int(p.prompt_id), "source": p.source,
                     **{f"measured_{k}": getattr(measured, k) for k in COUNTERS},
                     "measured_decode_s": measured.decode_seconds, "measured_tokens_per_s": measured.tokens_per_s})
        progress(i + 1)
    return pd.DataFrame(rows)


def compare(predicted: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """Measured beside predicted, one row per prompt, with ``match_*`` and the tokens/s error."""
    table = measured.merge(predicted, on="prompt_id", how="left")
    for k in COUNTERS:
        table[f"match_{k}"] = table[f"measured_{k}"] == table[f"predicted_{k}"]
    table["error_tokens_per_s"] = table["predicted_tokens_per_s"] / table["measured_tokens_per_s"] - 1.0
    return table


def summary(table: pd.DataFrame) -> dict:
    """Totals over prompts: counts measured and predicted, and the overall tokens/s error."""
    out: dict = {"prompts": len(table)}
    for k in COUNTERS:
        out[f"measured_{k}"] = int(table[f"measured_{k}"].sum())
        out[f"predicted_{k}"] = int(table[f"predicted_{k}"].sum())
        out[f"prompts_matching_{k}"] = int(table[f"match_{k}"].sum())
    measured_tps = table["measured_n_predict"].sum() / table["measured_decode_s"].sum()
    predicted_tps = table["predicted_n_predict"].sum() / table["predicted_decode_s"].sum()
    out.update(measured_tokens_per_s=round(float(measured_tps), 3), predicted_tokens_per_s=round(float(predicted_tps), 3),
               error_tokens_per_s=round(float(predicted_tps / measured_tps - 1.0), 4),
               median_abs_error_tokens_per_s=round(float(table["error_tokens_per_s"].abs().median()), 4))
    return out

"""Latencies timed again in the decoding process, just before the decodes they price.

A shared machine drifts: latencies probed on it minutes or hours before the decodes price them
at that moment's speed. And a probe in another process, with other instances of the models and
another mix of forwards, is not the decoder: on this project's 2-core CPU the Qwen pair's draft
step cost 2-9% more among the recording probe's whole k axis than in a plan of three kinds of
forward (README, "Every live policy on the Qwen pair"), and the batched decodes of ``serve
--live`` came within 3% of their prediction only once their forwards were timed in the decoding
process (``results/serve-live``). So :func:`probe_here` times the forwards a run will make (the
points of a ``--latency-probe`` plan) with the models the decodes use, in the same process, just
before them; :func:`with_points` puts those samples in place of the trace's at the same points
(the trace's other points kept), and the prediction is made from them before the first counted
decode. ``simlab serve --live --reprobe`` does it per batch size, ``simlab live --probe`` once per run.
"""

from __future__ import annotations

from typing import Callable

import pandas as pd

from simlab.common.cpu_load import OtherLoad
from simlab.trace.io import Trace

POINT = ["op", "k", "context_len", "layer", "corun", "batch"]  # what a latency sample measured


def with_points(latency: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``latency``'s samples with every point that ``new`` measured taking ``new``'s samples
    instead (the others kept)."""
    measured = pd.MultiIndex.from_frame(new[POINT])
    kept = latency[~pd.MultiIndex.from_frame(latency[POINT]).isin(measured)]
    return pd.concat([kept, new[latency.columns]], ignore_index=True)


def probe_here(trace: Trace, executor, plan, log: Callable[[str], None] = lambda _: None
               ) -> tuple[pd.DataFrame, float | None]:
    """The samples of ``plan`` (a :class:`~simlab.record.latency.ProbePlan`) timed on
    ``executor``'s models by the recorder's probe, and the share of the CPU other processes took
    meanwhile. A self-speculative trace's draft is the target's first layers (its drafting exit
    layer, timed as the single-sequence draft step)."""
    from simlab.record.latency import probe_latency

    layer = trace.manifest.draft_layer
    draft = None if layer >= 0 else executor.draft_model
    exits = [layer] if layer >= 0 and plan.single else []
    target = executor.target_model
    load = OtherLoad()
    samples = probe_latency(target, draft, exits, plan, target.config.vocab_size, log=log, draft_layer=layer)
    return samples, load.share()

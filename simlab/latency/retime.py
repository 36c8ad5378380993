"""A synthetic trace re-timed by a latency profile: a paper's setup without its hardware.

Lives with the latency models, not with the synthetic traces, because it reads a profile
(the trace layer sits below the latency layer and imports nothing from it).
"""

from __future__ import annotations

from pathlib import Path

from simlab.latency.model import load_profile, tabulate
from simlab.trace.io import Trace


def with_latency(trace: Trace, profile: str | Path) -> Trace:
    """``trace`` with its synthetic latencies replaced by a profile's (fitted or roofline),
    tabulated at the trace's k and context lengths: a paper's setup without its hardware."""
    model = load_profile(profile)
    spec = trace.manifest.extra["synth"]
    contexts = (spec["prompt_len"], spec["prompt_len"] + spec["tokens"])
    trace.latency = tabulate(model, range(1, spec["max_k"] + 2), contexts, corun=getattr(model, "has_corun", False))
    m = trace.manifest
    m.hardware = getattr(model, "hardware", "") or model.name
    m.draft_model, m.target_model = f"synthetic draft ({model.name})", f"synthetic target ({model.name})"
    m.notes += f" Latencies tabulated from the profile {profile} ({model.name}), not measured."
    return trace

"""simlab: a lab for speculative decoding.

The package is a one-way pipeline, one folder per stage (see docs/architecture.md):
``common`` (errors, metrics, signals, files) <- ``trace`` (schema, IO, replay, synthetic traces)
<- ``latency``, ``models``, ``engines``, ``trees`` <- ``record``, ``policies`` (decisions and
the round protocol) <- ``sim`` (SimPy executor) <- ``serve``, ``predictor``, ``analytic`` <-
``live`` (real decoding beside the prediction), ``sweep`` (grids, frontiers) <- ``plots`` <- ``cli``.

The Python API is the names below, importable from ``simlab`` itself::

    from simlab import read_trace, Simulator, run_sweep, frontier_figure

    trace = read_trace("traces/synthetic-iid")
    print(Simulator(trace).run("spide", {"tau": 0.7}).summary)
    frontier_figure(run_sweep(trace, ["sd:gamma=1..8", "spide:tau=0.5..0.9:0.1"]).table).savefig("f.png")

Each is imported on first use, so ``import simlab`` stays light (no pandas, SimPy or
matplotlib until a name that needs them is touched).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it
_API = {
    # traces
    "read_trace": "simlab.trace.io",
    "write_trace": "simlab.trace.io",
    "Trace": "simlab.trace.io",
    "synth_trace": "simlab.trace.synth",
    "SynthSpec": "simlab.trace.synth",
    "with_latency": "simlab.latency.retime",
    "shipped_traces": "simlab.common.locations",
    # latency models
    "load_profile": "simlab.latency.model",
    # policies
    "REGISTRY": "simlab.policies",
    "make_policy": "simlab.policies",
    "Policy": "simlab.policies",
    "PolicyContext": "simlab.policies",
    # simulating and the metrics
    "Simulator": "simlab.sim.run",
    "SimResult": "simlab.sim.run",
    "simulate": "simlab.sim.run",
    "Summary": "simlab.common.metrics",
    "SUMMARY_KEYS": "simlab.common.metrics",
    # sweeps and frontiers
    "run_sweep": "simlab.sweep.runner",
    "SweepResult": "simlab.sweep.runner",
    "parse_policy": "simlab.sweep.grid",
    "combine": "simlab.sweep.grid",
    "pareto_front": "simlab.sweep.frontier",
    "ServeLoad": "simlab.sweep.serving",  # run_sweep(..., load=ServeLoad(rates, requests)): served under load
    # figures
    "frontier_figure": "simlab.plots.frontier",
    "acceptance_figure": "simlab.plots.acceptance",
    "sensitivity_figure": "simlab.plots.sensitivity",
    "mapping_figure": "simlab.plots.mapping",
    "trace_mapping": "simlab.plots.mapping",
    "timeline_figure": "simlab.plots.timeline",
    "read_chrome_trace": "simlab.sim.timeline",
    "live_figure": "simlab.plots.live",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'simlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])

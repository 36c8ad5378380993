"""The user's question in one call: which configuration should this pair run, how sure is that,
and what does one set in the engine (``simlab recommend``).

1. **The grid** is the standard sweep (:data:`STANDARD_GRID`: ``simlab bench --sweep``'s ten
   policies × ten values of the parameter one tunes first, and llama.cpp's own rule over its
   draft length and confidence stop), plus the self-speculative policies on a trace with exit
   layers and the tree policies on one with tree data. Under load (``rate``) the parallel and
   tree policies leave it: the serving engine batches neither.
2. **The ranking** is the sweep's table sorted by the objective (:data:`OBJECTIVES`), so the
   advice is exactly what ``simlab sweep`` of the same grid gives (``tests/test_recommend.py``).
3. **How sure**: each of the best few is simulated again and its prompts resampled with
   replacement (:func:`simlab.sim.spread.prompt_spread`): the 95% range of its speedup over
   runs on other prompts like the trace's. Under load the arrivals are drawn again under
   :data:`LOAD_SEEDS` seeds instead.
4. **Which assumption matters most**: the best few simulated again under the other topology
   (both models on one device, or each on its own) and under another latency source (a fitted
   surface of the trace's own samples, or those samples when a profile was given); the one that
   moves the winner's figure most, or changes the winner, is named.
5. **The engine's own settings**: one function per engine (:data:`ENGINES`) turns a policy and
   its parameters into what that engine is given, or None where the engine has no such rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from simlab.common.errors import SimlabError
from simlab.engines.llama_cpp.args import policy_args
from simlab.latency.model import LatencyModel
from simlab.policies import REGISTRY
from simlab.policies.hf import assistant_settings
from simlab.policies.vllm import config_of
from simlab.sim.devices import Topology
from simlab.sim.run import Simulator
from simlab.sim.spread import prompt_spread
from simlab.sweep.bench import DEFAULT_GRID
from simlab.sweep.runner import run_sweep
from simlab.sweep.serving import ServeLoad
from simlab.trace.io import Trace

STANDARD_GRID = (*DEFAULT_GRID, "llama-cpp:draft_max=1..8,p_min=0.0,0.5,0.75,0.9")
SELF_SPECULATIVE_GRID = ("layerskip:gamma=1..8", "del")
TREE_GRID = ("eagle2:nodes=4..24:4", "tree-static", "ags-tree")
TOP = 5
LOAD_SEEDS = (1, 2, 3, 4)  # the arrivals drawn again, beside the table's seed, for the spread under load

# objective -> (the table's column it ranks by, larger is better, what it means)
OBJECTIVES: dict[str, tuple[str, bool, str]] = {
    "speed": ("speedup", True, "the highest speedup over the target alone"),
    "cost": ("cost", False, "the fewest target calls (against plain SD at its best γ) among the configurations "
                            "faster than the target alone"),
    "goodput": ("goodput_requests_per_s", True, "the most requests per second within the SLOs"),
}
SERVING_SPEED = "e2e_speedup"  # under load, "speed" ranks by the end-to-end speedup over no speculation


def hf_settings(policy: str, params: dict[str, Any]) -> str | None:
    """Hugging Face transformers' assisted generation: the assistant's generation config."""
    fields = assistant_settings(policy, params)
    if fields is None:
        return None
    text = ("assistant.generation_config.update(" + ", ".join(f"{k}={v!r}" for k, v in fields.items())
            + "); model.generate(..., assistant_model=assistant)")
    if policy == "hf-confidence":
        text += ("  # the re-tuning needs scikit-learn installed" if params["retune"] else
                 "  # transformers re-tunes this threshold whenever scikit-learn is installed: uninstall it to keep it")
    return text


def llama_cpp_settings(policy: str, params: dict[str, Any]) -> str | None:
    """llama.cpp's ``llama-speculative-simple`` and ``llama-server``: the drafting flags."""
    args = policy_args(policy, params)
    return None if args is None else "-md DRAFT.gguf --spec-type draft-simple " + " ".join(args)


def vllm_settings(policy: str, params: dict[str, Any]) -> str | None:
    """vLLM's ``--speculative-config`` (``vllm serve`` and ``LLM(speculative_config=...)``), for one
    request at a time: the draft model with its fixed K (``simlab/policies/vllm.py``)."""
    config = config_of(policy, params, "DRAFT")
    return None if config is None else f"--speculative-config '{json.dumps(config)}'"


# engine -> its translation
ENGINES: dict[str, Callable[[str, dict[str, Any]], str | None]] = {
    "Hugging Face transformers": hf_settings,
    "llama.cpp": llama_cpp_settings,
    "vLLM": vllm_settings,
}


@dataclass
class Choice:
    """One configuration of the table: its figure for the objective and its range, and the
    settings of every engine that runs it."""

    label: str
    policy: str
    params: dict[str, Any]
    value: float
    low: float
    high: float
    figures: dict[str, float]
    engines: dict[str, str | None]


@dataclass
class Assumption:
    """The best few simulated under another assumption: the winner then, and how far the first
    choice's figure moved."""

    name: str
    winner: str
    moved: float  # the first choice's figure under this assumption / as recommended - 1
    figures: dict[str, float]  # label -> figure under this assumption


@dataclass
class Recommendation:
    objective: str
    metric: str
    grid: list[str]
    table: pd.DataFrame
    top: list[Choice]
    assumptions: list[Assumption] = field(default_factory=list)
    engine_best: dict[str, Choice | None] = field(default_factory=dict)
    interval: str = ""

    @property
    def most(self) -> Assumption | None:
        """The assumption that matters most: one that changes the winner, else the largest move."""
        if not self.assumptions:
            return None
        first = self.top[0].label
        return max(self.assumptions, key=lambda a: (a.winner != first, abs(a.moved)))


def standard_grid(trace: Trace, serving: bool = False) -> list[str]:
    """The standard sweep for ``trace`` (module docstring, 1)."""
    specs = list(STANDARD_GRID)
    if trace.manifest.exit_layers:
        specs += SELF_SPECULATIVE_GRID
    if trace.tree is not None:
        specs += TREE_GRID
    if serving:
        specs = [s for s in specs if not (REGISTRY[name_of(s)].parallel or REGISTRY[name_of(s)].drafts_trees)]
    return specs


def name_of(spec: str) -> str:
    return spec.split(":", 1)[0]


def resolved(policy: str, row: Any) -> dict[str, Any]:
    """Every parameter of ``policy`` for one row of a sweep table (its own columns, where the
    sweep set them; the declared defaults otherwise), in its declared type."""
    out = {}
    for p in REGISTRY[policy].params:
        value = getattr(row, p.name, None) if p.name in row._fields else None
        missing = value is None or bool(pd.isna(value))
        out[p.name] = p.default if missing else (p.kind.type(value) if p.kind.type in (int, float, bool) else value)
    return out


def ranked(table: pd.DataFrame, objective: str, serving: bool) -> pd.DataFrame:
    """The table's configurations, best first, for ``objective`` (ties: by label)."""
    metric, larger, _ = OBJECTIVES[objective]
    if serving:
        if objective == "cost":
            raise SimlabError("--objective cost ranks target calls of single requests; drop --rate, or rank "
                              "by speed or goodput under load")
        table = table[table["speculative"]]
        metric = SERVING_SPEED if objective == "speed" else metric
    elif objective == "goodput":
        raise SimlabError("--objective goodput needs a load: add --rate R (requests per second)")
    elif objective == "cost":
        table = table[table["speedup"] > 1]
    return table.sort_values([metric, "label"], ascending=[not larger, True], kind="stable")


def recommend(trace: Trace, *, latency: LatencyModel | None = None, objective: str = "speed",
              load: ServeLoad | None = None, grid: list[str] | None = None, top: int = TOP,
              seed: int = 0, workers: int | None = None, cache: bool = True) -> Recommendation:
    """The module docstring's five steps; ``load``: serve under it (one rate) instead of one
    request at a time; ``grid``: specs as ``simlab sweep --policy`` takes them (default: the
    standard grid)."""
    if objective not in OBJECTIVES:
        raise SimlabError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    serving = load is not None
    if serving and len(load.rates) != 1:
        raise SimlabError("recommend serves at one rate; give --rate R")
    grid = list(grid or standard_grid(trace, serving))
    table = run_sweep(trace, grid, latency=latency, seed=seed, workers=workers, cache=cache, progress=False,
                      load=load).table
    order = ranked(table, objective, serving)
    metric = SERVING_SPEED if serving and objective == "speed" else OBJECTIVES[objective][0]
    rows = list(order.itertuples(index=False))
    sim = Simulator(trace, latency, seed=seed)
    if serving:
        spread = lambda row: _load_spread(trace, latency, row, load, metric)  # noqa: E731
    else:
        spread = lambda row: _prompt_spread(sim, row)  # noqa: E731
    choices = [_choice(r, metric, spread(r)) for r in rows[:top]]
    rec = Recommendation(objective, metric, grid, table, choices,
                         interval=(f"range over {len(LOAD_SEEDS) + 1} draws of the arrivals" if serving else
                                   "95% range of the speedup over runs on other prompts like the trace's "
                                   "(its prompts resampled)"))
    rec.engine_best = {engine: next((_choice(r, metric, spread(r)) for r in rows
                                     if translate(r.policy, resolved(r.policy, r)) is not None), None)
                       for engine, translate in ENGINES.items()}
    if choices:
        rec.assumptions = _assumptions(trace, latency, sim, choices, metric, OBJECTIVES[objective][1], load, seed)
    return rec


def _choice(row: Any, metric: str, interval: tuple[float, float]) -> Choice:
    params = resolved(row.policy, row)
    figures = {k: float(getattr(row, k)) for k in ("speedup", "cost", "mean_acceptance_length", "e2e_speedup",
                                                     "goodput_requests_per_s", "tpot_p50_s") if k in row._fields}
    return Choice(row.label, row.policy, params, float(getattr(row, metric)), *interval, figures,
                  {engine: translate(row.policy, params) for engine, translate in ENGINES.items()})


def _prompt_spread(sim: Simulator, row: Any) -> tuple[float, float]:
    """The speedup's 95% range over the trace's prompts resampled (one request at a time)."""
    res = sim.run(row.policy, resolved(row.policy, row), with_cost=False)
    iv = prompt_spread(res.per_prompt)["speedup"]
    return iv.low, iv.high


def _load_spread(trace: Trace, latency: LatencyModel | None, row: Any, load: ServeLoad,
                 metric: str) -> tuple[float, float]:
    """The figure's range over the arrivals drawn again (under load)."""
    values = [float(getattr(row, metric))]
    for s in LOAD_SEEDS:
        values.append(_served(Simulator(trace, latency, seed=s), row.policy, resolved(row.policy, row), load, metric))
    return min(values), max(values)


def _served(sim: Simulator, policy: str, params: dict[str, Any], load: ServeLoad, metric: str) -> float:
    from simlab.serve.metrics import speedups

    rate = load.rates[0]
    row = load.serve(sim, policy, params, rate)
    if metric == SERVING_SPEED:
        return speedups(row, load.serve(sim, "ad", {}, rate))[SERVING_SPEED]
    return float(row[metric])


def _assumptions(trace: Trace, latency: LatencyModel | None, sim: Simulator, choices: list[Choice], metric: str,
                 larger: bool, load: ServeLoad | None, seed: int) -> list[Assumption]:
    """The best few under the other topology (one request at a time) and another latency source."""
    from simlab.latency.fitted import fit_latency

    others: list[tuple[str, Simulator]] = []
    if load is None:
        other = Topology.TWO_DEVICES if sim.topology is Topology.ONE_DEVICE else Topology.ONE_DEVICE
        others.append((f"topology {other.value} instead of {sim.topology.value}",
                       Simulator(trace, latency, seed=seed, topology=other)))
    if latency is not None:
        others.append((f"latency: the trace's own samples instead of {latency.name}", Simulator(trace, None, seed=seed)))
    else:
        try:
            fitted = fit_latency(trace.latency, name="fitted surface", draft_layer=trace.manifest.draft_layer)
        except SimlabError:  # too few samples to fit: this assumption cannot be varied
            fitted = None
        if fitted is not None:
            others.append(("latency: a fitted surface of the trace's samples (simlab calibrate) instead of the samples "
                           "themselves", Simulator(trace, fitted, seed=seed, topology=sim.topology)))
    out = []
    for name, other_sim in others:
        figures = {}
        for c in choices:
            if load is not None:
                figures[c.label] = _served(other_sim, c.policy, c.params, load, metric)
            else:
                figures[c.label] = getattr(other_sim.run(c.policy, c.params, with_cost=metric == "cost").summary, metric)
        winner = (max if larger else min)(figures, key=figures.get)
        out.append(Assumption(name, winner, figures[choices[0].label] / choices[0].value - 1, figures))
    return out

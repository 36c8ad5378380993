"""How far one decode at temperature > 0 may land from the prediction: the spread over sampled
continuations and accept/reject draws.

A trace recorded at T > 0 holds one sampled continuation per prompt. Replaying it under another
``--seed`` redraws accept/reject along that one continuation (:mod:`simlab.trace.replay`); a
live run samples a new continuation as well, so the replay seeds alone understate its spread
(on SmolLM2 at T = 0.7 about half of it, and a second trace recorded with another
``record --seed`` moved the prediction by 7%). Traces of the same prompts recorded with other
``record --seed`` hold other continuations. The method:

1. simulate the policy on each of the K traces under S replay seeds (``seed`` … ``seed + S − 1``),
   every run priced by one latency model (the first trace's, unless one is given), so that
   the spread is the decoding's and not the probes';
2. a run decodes every prompt once and independently of the others, so its outcome on a prompt
   is one draw from that prompt's distribution over (continuation, acceptances), of which the
   K × S simulated outcomes are a sample. Pick one of them per prompt, uniformly and
   independently across prompts, add up counts and wall times and compute the run's metrics;
   repeat ``draws`` times (a fixed generator, so the figures are reproducible);
3. the prediction is the mean of the draws. With K ≥ 2 its interval is the predictive interval
   of one new run, mean ± t · sd · √((1 + 1/K) · K/(K − 1)), with sd the draws' standard
   deviation and t Student's quantile at ``level`` with K − 1 degrees of freedom: the K
   continuations are a small sample of each prompt's distribution, so its variance is known to
   K − 1 degrees of freedom only (K/(K − 1) undoes the plug-in variance of resampling K values,
   1 + 1/K adds the uncertainty of the mean). With K = 1 the interval is the draws' central
   ``level`` range (2.5th to 97.5th percentile by default): the spread of the replay seeds
   only, and it says so (:attr:`SamplingSpread.continuations`).

Resampling per prompt makes K^n × S^n whole runs out of K × S simulations. The percentile range
of those draws was the interval until five live runs on SmolLM2 at T = 0.7 (K = 4, two prompts)
fell inside it 3 times in 5: four continuations rarely span a prompt's range, so the range of
their resamples is too narrow. The t-interval is wider by a factor of about 2 at K = 4 and
narrows toward the percentile range as K grows. What it leaves out: the machine's own noise in
wall times (see ``simlab live --repeats``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from simlab.common.errors import SimlabError
from simlab.latency.model import LatencyModel
from simlab.sim.devices import Topology
from simlab.sim.run import Simulator, latency_of
from simlab.trace.io import Trace

# the per-prompt counts a run's metrics are made of
_COUNTS = ("tokens", "target_calls", "accepted", "num_drafts", "wall_time_s", "ad_wall_time_s")
METRICS = ("speedup", "tokens_per_s", "mean_acceptance_length", "tokens_per_target_call", "target_calls", "tokens")


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high


@dataclass(frozen=True)
class SamplingSpread:
    """Mean and interval of each metric of one run (module docstring)."""

    continuations: int  # K: traces, each one sampled continuation per prompt
    seeds: int  # S: replay seeds per trace
    draws: int
    level: float
    intervals: dict[str, Interval]

    def to_dict(self) -> dict:
        return {"continuations": self.continuations, "seeds": self.seeds, "draws": self.draws, "level": self.level,
                **{k: asdict(v) for k, v in self.intervals.items()}}

    def describe(self) -> str:
        if self.continuations > 1:
            return (f"{self.level:.0%} predictive interval (Student's t, {self.continuations - 1} degrees of freedom) "
                    f"over {self.continuations} recorded continuations × {self.seeds} replay seeds")
        return (f"{self.level:.0%} interval over {self.seeds} replay seeds of one recorded continuation "
                "(acceptance draws only: too narrow)")


def run_metrics(totals: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A run's metrics from its summed counts (as :class:`simlab.common.metrics.Summary` defines them)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "speedup": totals["ad_wall_time_s"] / totals["wall_time_s"],
            "tokens_per_s": totals["tokens"] / totals["wall_time_s"],
            "mean_acceptance_length": 1 + totals["accepted"] / totals["num_drafts"],
            "tokens_per_target_call": totals["tokens"] / totals["target_calls"],
            "target_calls": totals["target_calls"],
            "tokens": totals["tokens"],
        }


def combine(outcomes: np.ndarray, draws: int, level: float, rng: np.random.Generator,
            continuations: int = 1) -> dict[str, Interval]:
    """``outcomes[prompt, sample, count]`` (counts in :data:`_COUNTS` order) resampled per prompt;
    the samples of each prompt hold ``continuations`` recorded continuations (module docstring)."""
    n, samples, _ = outcomes.shape
    pick = rng.integers(0, samples, size=(draws, n))
    totals = outcomes[np.arange(n)[None, :], pick].sum(axis=1)  # (draws, counts)
    metrics = run_metrics({name: totals[:, i] for i, name in enumerate(_COUNTS)})
    if continuations < 2:
        tail = (1 - level) / 2 * 100
        return {k: Interval(float(np.mean(v)), float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail)))
                for k, v in metrics.items()}
    k = continuations
    half = stats.t.ppf((1 + level) / 2, k - 1) * np.sqrt((1 + 1 / k) * k / (k - 1))
    return {name: Interval(float(np.mean(v)), float(np.mean(v) - half * np.std(v)), float(np.mean(v) + half * np.std(v)))
            for name, v in metrics.items()}


def prompt_spread(per_prompt, draws: int = 4000, level: float = 0.95, seed: int = 0) -> dict[str, Interval]:
    """How far a run on other prompts like these may land: the trace's prompts resampled with
    replacement (a bootstrap over prompts), each draw's counts summed into a run's metrics
    (:func:`run_metrics`), the central ``level`` range of the draws. For a greedy trace this is
    the uncertainty that is left: the replay of each prompt is exact, but a user's prompts are
    not the trace's. ``per_prompt``: a simulation's per-prompt table."""
    outcomes = per_prompt[list(_COUNTS)].to_numpy(dtype=float)[:, None, :]  # one sample per prompt
    n = len(outcomes)
    pick = np.random.default_rng(seed).integers(0, n, size=(draws, n))
    totals = outcomes[pick, 0].sum(axis=1)
    metrics = run_metrics({name: totals[:, i] for i, name in enumerate(_COUNTS)})
    tail = (1 - level) / 2 * 100
    return {k: Interval(float(np.mean(v)), float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail)))
            for k, v in metrics.items()}


def sampling_spread(traces: list[Trace], policy: str, params: dict | None = None, *, seeds: int = 20,
                    seed: int = 0, latency: LatencyModel | None = None, topology: Topology | str | None = None,
                    draws: int = 4000, level: float = 0.95) -> SamplingSpread:
    """The spread of one run of ``policy`` over the prompts of ``traces[0]`` (module docstring).

    Every trace must be recorded at the same temperature > 0 with the same models and budget,
    and hold every prompt of the first (matched by source)."""
    if seeds < 1:
        raise SimlabError(f"the spread needs at least one replay seed, got {seeds}")
    first = traces[0]
    if first.manifest.greedy:
        raise SimlabError(f"{first.path}: a greedy trace has no sampling spread (temperature 0)")
    key = ("draft_model", "target_model", "temperature", "max_new_tokens")
    sources = list(first.prompts.sort_values("prompt_id")["source"])
    selected = []
    for tr in traces:
        if any(getattr(tr.manifest, k) != getattr(first.manifest, k) for k in key):
            raise SimlabError(f"{tr.path}: recorded with other models or settings than {first.path} ({', '.join(key)})")
        missing = set(sources) - set(tr.prompts["source"])
        if missing:
            raise SimlabError(f"{tr.path} lacks {len(missing)} prompt(s) of {first.path}, e.g. {sorted(missing)[0]}")
        selected.append(tr.select_prompts(tr.prompts[tr.prompts["source"].isin(sources)]["prompt_id"]))
    latency = latency or latency_of(first)
    topology = topology if topology is not None else first.manifest.recorded_topology()
    outcomes = np.zeros((len(sources), len(selected) * seeds, len(_COUNTS)))
    column = 0
    for tr in selected:
        row_of = dict(zip(tr.prompts["prompt_id"], tr.prompts["source"]))
        order = {s: i for i, s in enumerate(sources)}
        for s in range(seed, seed + seeds):
            per_prompt = Simulator(tr, latency, seed=s, topology=topology).run(policy, params, with_cost=False).per_prompt
            for _, r in per_prompt.iterrows():
                outcomes[order[row_of[r["prompt_id"]]], column] = [r[c] for c in _COUNTS]
            column += 1
    intervals = combine(outcomes, draws, level, np.random.default_rng(seed), continuations=len(selected))
    return SamplingSpread(len(selected), seeds, draws, level, intervals)


__all__ = ["Interval", "SamplingSpread", "sampling_spread", "prompt_spread", "combine", "run_metrics", "METRICS"]

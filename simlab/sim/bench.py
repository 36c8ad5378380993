"""Simulator speed against its goals: what ``simlab bench`` measures.

Three figures, each beside its goal:

- whole-process ``simulate``: tokens of a 1M-token synthetic trace divided by the wall time
  of ``python -m simlab simulate`` on it, as a user waits for it (start-up, reading the trace,
  the cost reference and the simulation);
- every policy: simulated tokens per CPU-second (``time.process_time`` of this process, so
  the figure is per core and less disturbed by other work than wall time);
- vanilla SD at a fixed γ (the cheapest policy, the floor of every sweep), likewise.

(``simlab bench`` adds the serving row, :mod:`simlab.serve.bench`, and the start-up rows,
:mod:`simlab.cli.bench`.)

The self-speculative policies (``layerskip``, ``del``) need a trace with early-exit signals,
which synthetic traces lack: they are timed on the shipped ``smollm2-selfspec`` trace. Tree
policies need tree data (``simlab record --topk --tree-depth``), which only the shipped
``smollm2-tree`` trace holds (the default Qwen trace was recorded without it): they are timed
there, against their own goal (:data:`TREE_GOAL`). Policies that draft by lookup read the prompts'
tokens, which synthetic traces lack: they are timed on the default shipped trace (``rest`` with a
datastore of the other shipped Qwen traces' outputs, built for the run), and each also once cold
(:func:`time_cold`: one run in a new process, the one-off costs of a single ``simulate`` counted),
a figure shown beside the repeated one and not judged: the goal is judged, as for every policy, on
the repeated runs (a lookup policy's compiled replay keeps nothing from one run to the next, so a
repeated run computes every proposal it uses again; what the cold run adds is a process's
one-off costs: numba's import and the load of the compiled code, the datastore's read).
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simlab.common.errors import SimlabError
from simlab.common.locations import TRACES
from simlab.policies import REGISTRY, make_policy
from simlab.sim.run import Simulator
from simlab.trace.io import Trace, read_trace, write_trace
from simlab.trace.synth import SynthSpec, synth_trace

SIMULATE_GOAL = 500_000  # whole-process simulate, tokens per wall-clock second
POLICY_GOAL = 500_000  # every policy, simulated tokens per CPU-second
SD_GOAL = 1_500_000  # fixed-γ SD, simulated tokens per CPU-second
TREE_GOAL = 100_000  # tree policies (eagle2 first), simulated tokens per CPU-second
SD_PARAMS = {"gamma": 5}
PROMPT_TOKENS = 250  # benchmark prompts are as long as typical recorded ones
SELF_SPECULATIVE_TRACE = "smollm2-selfspec"
TREE_TRACE = "smollm2-tree"
LOOKUP_TRACE = "qwen-coder-humaneval"
DATASTORE_TRACES = ("qwen-coder-mtbench", "qwen-coder-tree")  # rest's datastore in the bench
MIN_CPU_SECONDS = 0.3  # each timing repeats the simulation until it has run this long


@dataclasses.dataclass(frozen=True)
class BenchResult:
    """One timed figure: ``tokens`` simulated in ``seconds`` (CPU-seconds, or wall-clock seconds
    for the whole process, whose own CPU time is then ``cpu_seconds``)."""

    what: str
    tokens: int
    seconds: float
    goal: float
    trace: str
    cpu_seconds: float | None = None
    judged: bool = True  # False: shown beside a judged figure, PASS or FAIL said of that one only

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("inf")

    @property
    def passed(self) -> bool:
        return self.tokens_per_second >= self.goal


def bench_trace(tokens: int, alpha: float = 0.8, seed: int = 0) -> Trace:
    """A synthetic i.i.d. trace of about ``tokens`` tokens in prompts of :data:`PROMPT_TOKENS`."""
    prompts = max(1, tokens // PROMPT_TOKENS)
    spec = SynthSpec(alpha=alpha, prompts=prompts, tokens=-(-tokens // prompts), seed=seed)
    return synth_trace(spec, command="simlab bench")


def time_policy(sim: Simulator, policy: str, params: dict, repeats: int = 3, goal: float = POLICY_GOAL,
                trace: str = "") -> BenchResult:
    """Simulated tokens per CPU-second, best of ``repeats`` timings (the least disturbed)."""
    sim.run(policy, params, with_cost=False)  # warm the latency grid and caches
    best: tuple[int, float] | None = None
    for _ in range(repeats):
        tokens, t0 = 0, time.process_time()
        while True:
            tokens += sim.run(policy, params, with_cost=False).summary.tokens
            seconds = time.process_time() - t0
            if seconds >= MIN_CPU_SECONDS:
                break
        if best is None or tokens / seconds > best[0] / best[1]:
            best = (tokens, seconds)
    return BenchResult(_label(policy, params), best[0], best[1], goal, trace)


def _label(policy: str, params: dict) -> str:
    return policy + "".join(f" {k}={v}" for k, v in params.items() if k != "datastore")  # a temporary file


def time_cold(policy: str, params: dict, trace: str) -> BenchResult:
    """One run of ``policy`` on shipped ``trace`` in a new process (:func:`cold_run`): what a single
    ``simlab simulate`` pays beyond its start-up and reading the trace. Not judged."""
    code = "import json, sys; from simlab.sim.bench import cold_run; print(json.dumps(cold_run(*json.loads(sys.argv[1]))))"
    out = subprocess.run([sys.executable, "-c", code, json.dumps([str(TRACES / trace), policy, params])], check=True,
                         capture_output=True, text=True).stdout
    tokens, seconds = json.loads(out)
    return BenchResult(f"{_label(policy, params)}, cold (one run, new process)", tokens, seconds, POLICY_GOAL, trace,
                       judged=False)


def cold_run(path: str, policy: str, params: dict) -> tuple[int, float]:
    """Simulated tokens and CPU-seconds of building a simulator on the trace at ``path`` (read
    first, not counted) and running ``policy`` once: numba's import and the load of the compiled
    code from its cache, the policy's tables (rest: the datastore's read) and the replay's arrays
    included."""
    trace = read_trace(path)
    t0 = time.process_time()
    tokens = Simulator(trace).run(policy, params, with_cost=False).summary.tokens
    return tokens, time.process_time() - t0


def time_simulate(trace_dir: Path, tokens: int, repeats: int = 1) -> BenchResult:
    """Wall time of ``python -m simlab simulate --policy sd`` on ``trace_dir``, best of ``repeats``."""
    best = (float("inf"), float("inf"))
    command = [sys.executable, "-m", "simlab", "simulate", "--trace", str(trace_dir), "--policy", "sd", "--json"]
    for _ in range(repeats):
        t0, cpu0 = time.perf_counter(), children_cpu_seconds()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        best = min(best, (time.perf_counter() - t0, children_cpu_seconds() - cpu0))
    return BenchResult("simulate, whole process (wall clock)", tokens, best[0], SIMULATE_GOAL,
                       f"synthetic {tokens:,} tokens", cpu_seconds=best[1])


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_bench(simulate_tokens: int = 1_000_000, policy_tokens: int = 200_000, policies: list[tuple[str, dict]] | None = None,
              repeats: int = 3, progress=lambda result: None) -> list[BenchResult]:
    """Every figure of ``simlab bench``: whole-process simulate, each policy, fixed-γ SD."""
    results = []
    with tempfile.TemporaryDirectory(prefix="simlab-bench-") as tmp:
        trace = bench_trace(simulate_tokens)
        path = write_trace(trace, Path(tmp) / "synthetic")
        results.append(time_simulate(path, int((trace.prompts["n_tokens"] - 1).sum())))
        progress(results[-1])
    synthetic = Simulator(bench_trace(policy_tokens))
    synthetic_name = f"synthetic {policy_tokens:,} tokens"
    self_spec = trees = lookups = None
    for name, params in policies or [(name, {}) for name in REGISTRY]:
        if REGISTRY[name].drafts_trees if name in REGISTRY else False:
            trees = trees or Simulator(read_trace(TRACES / TREE_TRACE))
            results.append(time_policy(trees, name, params, repeats, goal=TREE_GOAL, trace=TREE_TRACE))
            progress(results[-1])
            continue
        if REGISTRY[name].looks_up if name in REGISTRY else False:
            lookups = lookups or Simulator(read_trace(TRACES / LOOKUP_TRACE))
            with tempfile.TemporaryDirectory(prefix="simlab-bench-") as tmp:
                if name == "rest" and "datastore" not in params:
                    params = {**params, "datastore": _datastore(Path(tmp) / "datastore.npz")}
                results.append(time_policy(lookups, name, params, repeats, trace=LOOKUP_TRACE))
                progress(results[-1])
                results.append(time_cold(name, params, LOOKUP_TRACE))  # after a run compiled what it loads
            progress(results[-1])
            continue
        try:
            make_policy(name, synthetic.context(), **params)
            sim, trace_name = synthetic, synthetic_name
        except SimlabError:  # a self-speculative policy: it needs early-exit signals
            self_spec = self_spec or Simulator(read_trace(TRACES / SELF_SPECULATIVE_TRACE))
            sim, trace_name = self_spec, SELF_SPECULATIVE_TRACE
        results.append(time_policy(sim, name, params, repeats, trace=trace_name))
        progress(results[-1])
    sd = time_policy(synthetic, "sd", SD_PARAMS, repeats, goal=SD_GOAL, trace=synthetic_name)
    results.append(dataclasses.replace(sd, what=f"fixed-γ SD ({sd.what})"))
    progress(results[-1])
    return results


def _datastore(path: Path) -> str:
    """REST's datastore for the bench: the outputs of :data:`DATASTORE_TRACES`, written to ``path``."""
    from simlab.common.datastore import Datastore
    from simlab.trace.replay import TraceReplay

    prompts = [rp for name in DATASTORE_TRACES for rp in TraceReplay(read_trace(TRACES / name)).prompts]
    Datastore.of_outputs([(rp.prompt_tokens, rp.target_tokens) for rp in prompts]).save(path)
    return str(path)

"""Running a sweep: every configuration of a grid, in parallel, resumable.

The main process builds one :class:`~simlab.sim.run.Simulator` for the trace (with vanilla
SD's best γ, the denominator of ``cost``, worked out once), checks every configuration by
building its policy, and skips those already in the result store. The rest run on

- ``local``: a process pool on this machine's cores (each worker is sent the Simulator
  once); one worker runs everything in this process instead;
- ``ray``: Ray tasks, one per configuration, on a local Ray instance started for the sweep or
  on the cluster at ``ray_address`` / ``$RAY_ADDRESS``. The Simulator goes to the object store
  once; each Ray worker process fetches it on its first task and keeps it.

Finished rows are appended to the store as they arrive, so Ctrl-C (or a crash) loses only
the configurations still running; running the same sweep again computes only what is missing.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from simlab.common.errors import SimlabError
from simlab.common.locations import cache_root
from simlab.latency.model import LatencyModel
from simlab.policies import REGISTRY, make_policy
from simlab.serve.run import BASELINE_POLICY, check_policy
from simlab.sim.devices import Topology
from simlab.sim.extrapolation import rules_text
from simlab.sim.run import Simulator
from simlab.sweep.frontier import pareto_mask
from simlab.sweep.grid import PolicyGrid, parse_policy
from simlab.sweep.result_table import METRIC_COLUMNS, TIMING_COLUMNS, with_params
from simlab.sweep.serving import ServeLoad, serve_table
from simlab.sweep.store import ResultStore, code_digest, digest, frame_digest
from simlab.trace.io import Trace

EXECUTORS = ("local", "ray")
PACKAGE = Path(__file__).resolve().parents[1]  # the simlab package, which Ray ships to a cluster


def default_workers() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Config:
    """One policy with every parameter set (defaults filled in, as the policy describes itself);
    in a serving sweep, served at ``rate`` under ``load``."""

    policy: str
    params: dict[str, Any]
    key: str
    rate: float | None = None
    load: ServeLoad | None = None


def labels(rows: list[dict[str, Any]]) -> list[str]:
    """Each configuration's name: its policy and the parameters that tell it apart — those that
    take several values among the policy's configurations, or one other than the declared
    default (a derived default, None, counts as the default) — so ``sd:gamma=1..12`` reads
    ``sd(gamma=3)`` and ``ags`` at its defaults reads ``ags``, short enough for 80 columns."""
    values: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        for name, value in row["params"].items():
            values.setdefault((row["policy"], name), set()).add(repr(value))
    out = []
    for row in rows:
        policy = row["policy"]
        defaults = {p.name: p.default for p in REGISTRY[policy].params}
        shown = [f"{name}={value}" for name, value in row["params"].items()
                 if len(values[policy, name]) > 1 or defaults.get(name) not in (None, value)]
        out.append(f"{policy}({', '.join(shown)})" if shown else policy)
    return out


@dataclass
class SweepResult:
    """A finished sweep: the table (grid order, ``pareto`` marked) and how it was obtained."""

    table: pd.DataFrame
    cached: int  # rows read from the store
    computed: int  # rows simulated now
    seconds: float
    workers: int
    executor: str
    store: Path | None


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep; finished rows are in the store."""


def setup_key(sim: Simulator) -> str:
    """Everything but the policy that a result depends on (see :mod:`simlab.sweep.store`)."""
    tr, model = sim.trace, sim.latency.model
    if not hasattr(model, "to_profile"):
        raise SimlabError(f"latency model {model.name!r} has no to_profile(), which sweeps need to tell "
                          "its results from those of other models")
    return digest({
        "trace": [tr.manifest.to_dict(), *(frame_digest(tr.table(n)) for n in
                                            ("prompts", "positions", "rollouts", "layers", "topk", "tree", "latency"))],
        "latency": model.to_profile(),
        "seed": sim.seed,
        "topology": sim.topology.value,
        "code": code_digest(),
    })


def expand(grids: Iterable[PolicyGrid], sim: Simulator, setup: str, load: ServeLoad | None = None) -> list[Config]:
    """Every configuration of the grids, checked by building its policy; duplicates dropped.
    With a ``load``: each of them at each of its rates, then (with its baseline) ``ad``."""
    grids = list(grids)
    if load is not None:
        for g in grids:
            check_policy(g.policy)
    context = sim.context()
    configs: dict[str, Config] = {}
    for grid in grids:
        for params in grid:
            config = _config(grid.policy, params, context, setup)
            configs.setdefault(config.key, config)
    if not configs:
        raise SimlabError("empty grid: it expands to no configuration")
    if load is None:
        return list(configs.values())
    served = list(configs.values()) + ([_config(BASELINE_POLICY, {}, context, setup)] if load.baseline else [])
    at_rates: dict[str, Config] = {}
    for rate in load.rates:
        for c in served:
            key = digest([c.key, "serve", load.describe(), rate])
            at_rates.setdefault(key, Config(c.policy, c.params, key, rate, load))
    return list(at_rates.values())


def _config(name: str, params: dict[str, Any], context, setup: str) -> Config:
    try:
        policy = make_policy(name, context, **params)
    except SimlabError as exc:
        shown = ",".join(f"{k}={v}" for k, v in params.items())
        raise SimlabError(f"{name}{':' + shown if shown else ''}: {exc}") from None
    # The key covers all the policy says of itself (e.g. which acceptance predictor it uses);
    # the configuration keeps only its parameters, which is what it is built from.
    described = policy.describe()
    described.pop("policy")
    own = {p.name for p in policy.params}
    return Config(name, {k: v for k, v in described.items() if k in own}, digest([setup, name, described]))


# -- the work of one configuration, in whichever process runs it ------------------------------

_SIMULATOR: dict[str, Simulator] = {}  # setup key -> the Simulator of this process (one at most)


def _keep(key: str, sim: Simulator) -> Simulator:
    _SIMULATOR.clear()
    _SIMULATOR[key] = sim
    return sim


def simulate_config(sim: Simulator, config: Config) -> dict[str, Any]:
    """A configuration's row: simulated alone, or served at its rate."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    if config.load is None:
        res = sim.run(config.policy, config.params)
        figures = {**res.summary.to_dict(), "reference_speedup": sim.reference().speedup}
        figures["extrapolated_rules"] = rules_text(figures.pop("extrapolated_by_rule", None))  # a table cell
    else:
        figures = config.load.serve(sim, config.policy, config.params, config.rate)
    return {
        "key": config.key,
        "policy": config.policy,
        "params": config.params,
        **figures,
        "sim_seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
    }


def _pool_init(key: str, sim: Simulator) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _keep(key, sim)


def _pool_task(key: str, config: Config) -> dict[str, Any]:
    return simulate_config(_SIMULATOR[key], config)


def _ray_task(key: str, boxed_sim: list, config: Config) -> dict[str, Any]:
    # The Simulator arrives boxed in a list so that Ray does not fetch it for every task.
    import ray

    sim = _SIMULATOR.get(key) or _keep(key, ray.get(boxed_sim[0]))
    return simulate_config(sim, config)


# -- executors: yield finished rows in completion order ---------------------------------------

def _mp_context() -> multiprocessing.context.BaseContext:
    """``forkserver`` where there is one: workers fork from a clean process that has imported
    simlab once (quick to start, and safe, unlike forking this multi-threaded process);
    ``spawn`` elsewhere."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _run_local(sim: Simulator, key: str, configs: list[Config], workers: int) -> Iterator[dict]:
    if workers == 1:
        for config in configs:
            yield simulate_config(sim, config)
        return
    pool = ProcessPoolExecutor(workers, mp_context=_mp_context(), initializer=_pool_init, initargs=(key, sim))
    try:
        futures = [pool.submit(_pool_task, key, c) for c in configs]
        for future in as_completed(futures):
            yield future.result()
    except BaseException:  # Ctrl-C, a failed task, or the consumer stopped early
        _stop(pool)
        raise
    pool.shutdown()


def _stop(pool: ProcessPoolExecutor) -> None:
    """Drop the queued work and end the workers now: what they are computing would be thrown
    away, and Ctrl-C should not wait for it. (``terminate_workers`` is public from Python 3.14.)"""
    processes = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


def _run_ray(sim: Simulator, key: str, configs: list[Config], workers: int, address: str | None) -> Iterator[dict]:
    try:
        import ray
    except ImportError:
        raise SimlabError("--executor ray needs Ray: pip install 'simlab[sweep]'") from None

    address = address or os.environ.get("RAY_ADDRESS")
    started = not ray.is_initialized()
    if started:
        options = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
        try:
            if address:  # simlab travels with the tasks: cluster nodes need only its dependencies
                ray.init(address=address, runtime_env={"py_modules": [str(PACKAGE)]}, **options)
            else:  # local workers import simlab as this process does; a local node stays on loopback
                ray.init(num_cpus=workers, _node_ip_address="127.0.0.1", **options)
        except Exception as exc:  # Ray raises bare Exceptions (e.g. a node that timed out starting)
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise SimlabError(f"could not start {where}: {exc}") from exc
    pending: list = []
    try:
        task = ray.remote(num_cpus=1)(_ray_task)
        boxed = [ray.put(sim)]
        pending = [task.remote(key, boxed, c) for c in configs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started:
            ray.shutdown()


# -- the sweep ---------------------------------------------------------------------------------

def run_sweep(
    trace: Trace,
    grids: Iterable[PolicyGrid | str],
    *,
    latency: LatencyModel | None = None,
    seed: int = 0,
    topology: Topology | str | None = None,
    workers: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    cache: str | Path | bool = True,
    progress: bool | None = None,
    load: ServeLoad | None = None,
) -> SweepResult:
    """Simulate every configuration of ``grids`` on ``trace``; see the module docstring.
    With a ``load``, serve each of them at each of its rates instead (:mod:`simlab.sweep.serving`).

    ``topology``: None simulates the topology the trace was recorded in.
    ``grids``: :class:`PolicyGrid` objects or specs as ``--policy`` takes them ("sd:gamma=1..12").

    ``cache``: the result store's directory; True for ``$SIMLAB_CACHE/sweeps``, False for none.
    ``progress``: a progress bar on stderr; None shows one on a terminal only.
    """
    if executor not in EXECUTORS:
        raise SimlabError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise SimlabError(f"--workers must be at least 1, got {workers}")
    t0 = time.perf_counter()
    grids = [parse_policy(g) if isinstance(g, str) else g for g in grids]
    sim = Simulator(trace, latency, seed=seed, topology=topology)
    key = setup_key(sim)
    configs = expand(grids, sim, key, load)
    if cache is True:
        cache = cache_root() / "sweeps"
    store = ResultStore(Path(cache) / f"{key}.jsonl") if cache is not False else None
    wanted = {c.key for c in configs}
    rows = {k: r for k, r in (store.load() if store else {}).items() if k in wanted}
    todo = [c for c in configs if c.key not in rows]
    cached = len(rows)
    if todo:
        if load is None:
            sim.reference()  # once here, not once per worker
        _keep(key, sim)
        used = min(workers, len(todo))
        finished = (_run_ray(sim, key, todo, used, ray_address) if executor == "ray"
                    else _run_local(sim, key, todo, used))
        bar = tqdm(total=len(configs), initial=cached, desc="sweep", unit="config",
                   disable=None if progress is None else not progress, dynamic_ncols=True)
        try:
            with contextlib.closing(finished), bar:
                for row in finished:
                    rows[row["key"]] = row
                    if store:
                        store.append(row)
                    bar.update()
        except KeyboardInterrupt:
            where = f"; they are kept in {store.path} and a re-run resumes" if store else ""
            raise SweepInterrupted(f"{len(rows)} of {len(configs)} configurations done{where}") from None
    done = [rows[c.key] for c in configs]
    table = serve_table(done, labels(done), sim, load) if load else sweep_table(done, sim)
    return SweepResult(table, cached, len(todo), time.perf_counter() - t0, min(workers, max(len(todo), 1)),
                       executor, store.path if store else None)


def sweep_table(rows: list[dict], sim: Simulator) -> pd.DataFrame:
    """One row per configuration: policy, label, parameters, metrics, ``pareto``, setup."""
    records = []
    for row, label in zip(rows, labels(rows)):
        records.append({
            "policy": row["policy"],
            "label": label,
            **{m: row.get(m) for m in METRIC_COLUMNS},
            "pareto": False,  # filled in below, over all rows
            "trace": str(sim.trace.path or sim.trace.manifest.dataset),
            "latency": sim.latency.name,
            "seed": sim.seed,
            "topology": sim.topology.value,
            **{t: row.get(t) for t in TIMING_COLUMNS},
            "key": row["key"],
        })
    table = with_params(pd.DataFrame.from_records(records), rows, after="label")
    table["pareto"] = pareto_mask(table["speedup"], table["cost"])
    return table

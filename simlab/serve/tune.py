"""The best draft length per batch size for a pair and a latency profile (``simlab serve tune``).

vLLM's dynamic speculation and SGLang users configure a draft length per batch size by hand;
this finds it by serving. For each batch size B and each draft length γ in 0..``max_gamma``
the serving engine (:func:`simlab.serve.run.serve_once`, the one ``simlab serve`` runs) serves
a *saturated* batch: ``requests_per_slot`` · B requests arriving together, at most B decoding
at once, under vanilla SD with every draft capped at γ — exactly ``serve --policy sd --gamma
MAX --gamma-by-batch 1:γ`` — γ = 0 being plain target steps, no speculation (the draft, which
the server keeps for the batch sizes that draft, still prefills each prompt). The best γ for B
is the one with the highest throughput (generated tokens per second of makespan, prefills
included), the smaller γ on a tie. The batch stays at B while the queue lasts (the queue's
prefills interleave with decode steps as they would in a full server) and drains at the end.

The result is a small JSON file (:data:`~simlab.serve.batch_policy.TABLE_FORMAT`) that
``simlab serve --gamma-by-batch FILE`` reads back as the table ``1:γ1,2:γ2,...``.

With ``scheduler="vllm"`` the batches are served as vLLM serves them
(:mod:`simlab.serve.vllm_engine`): policy ``vllm`` on a server of ``num_speculative_tokens`` =
``max_gamma`` whose dynamic speculation drafts γ at every batch size, γ = 0 included, which there
still runs the draft's first pass each step; the server without speculation (``ad``) is served too,
and a table whose best γ is 0 at every batch size is no speculation at all
(:func:`simlab.policies.vllm.schedule_config`), so the speedups are over that plain server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from simlab.common.errors import SimlabError
from simlab.serve.scheduler import DEFAULT_TOKEN_BUDGET, Scheduler

if TYPE_CHECKING:  # the engine is imported where it runs: `simlab serve tune --help` reads the defaults only
    from simlab.sim.run import Simulator

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_MAX_GAMMA = 8
REQUESTS_PER_SLOT = 4  # requests per batch slot: enough that the drain at the end is a small part of the run
POLICY = "sd"
OBJECTIVE = ("tokens/s of a saturated batch: requests_per_slot * B requests arriving together, at most B "
             "decoding at once, policy sd with every draft capped at gamma (0: no speculation); the best "
             "gamma has the highest tokens/s, the smaller on a tie")


@dataclass(frozen=True)
class Tuned:
    """Throughput of every (batch size, γ) served, and what it was served on."""

    batches: tuple[int, ...]
    max_gamma: int
    tokens_per_s: dict[int, list[float]]  # batch size -> tokens/s at γ = 0..max_gamma
    requests_per_slot: int
    token_budget: int
    latency_rule: str
    extrapolated: bool
    plain_tokens_per_s: dict[int, float] | None = None  # vLLM's scheduler: the server without speculation
    scheduler: str = "simlab"

    @property
    def best(self) -> dict[int, int]:
        """Batch size -> the γ with the highest tokens/s (``max`` keeps the first, smallest, γ on a tie)."""
        return {b: max(range(self.max_gamma + 1), key=tps.__getitem__) for b, tps in self.tokens_per_s.items()}

    @property
    def speedup(self) -> dict[int, float]:
        """Batch size -> tokens/s at the best γ over tokens/s without speculation (γ = 0; under vLLM's
        scheduler, the plain server)."""
        plain = self.plain_tokens_per_s or {b: tps[0] for b, tps in self.tokens_per_s.items()}
        return {b: self.tokens_per_s[b][g] / plain[b] for b, g in self.best.items()}

    def table(self) -> str:
        """The ``--gamma-by-batch`` pairs of the best lengths."""
        return ",".join(f"{b}:{g}" for b, g in self.best.items())

    def to_json(self, sim: Simulator, vllm_draft: str | None = None) -> dict:
        """The table file; with ``vllm_draft`` (the draft model as vLLM loads it) also the table as
        vLLM's ``--speculative-config`` (:func:`simlab.policies.vllm.schedule_config`), its model
        written as results files write paths (a file may be committed; the command prints the
        config with the path vLLM loads)."""
        from simlab.common.locations import portable_path
        from simlab.policies.vllm import schedule_config
        from simlab.serve.batch_policy import TABLE_FORMAT, TABLE_VERSION

        m = sim.trace.manifest
        return {
            "format": TABLE_FORMAT, "version": TABLE_VERSION,
            "pair": {"draft": m.draft_model, "target": m.target_model},
            "trace": str(sim.trace.path or m.dataset), "latency": sim.latency.name, "latency_rule": self.latency_rule,
            "batch_latency_extrapolated": self.extrapolated,
            "objective": OBJECTIVE, "policy": "vllm" if self.scheduler == "vllm" else POLICY,
            "requests_per_slot": self.requests_per_slot,
            "token_budget": self.token_budget, "max_gamma": self.max_gamma,
            "gamma_by_batch": {str(b): g for b, g in self.best.items()},
            "speedup_by_batch": {str(b): s for b, s in self.speedup.items()},
            "tokens_per_s_by_batch": {str(b): tps for b, tps in self.tokens_per_s.items()},
            **({"scheduler": "vllm", "plain_tokens_per_s_by_batch": {str(b): t for b, t in self.plain_tokens_per_s.items()}}
               if self.plain_tokens_per_s is not None else {}),
            **({"vllm_speculative_config": schedule_config(self.best, portable_path(vllm_draft))} if vllm_draft else {}),
        }


def check_tune(batches: Sequence[int], max_gamma: int, requests_per_slot: int) -> None:
    if not batches:
        raise SimlabError("--batch needs at least one batch size")
    if any(b < 1 for b in batches) or list(batches) != sorted(set(batches)):
        raise SimlabError(f"--batch takes increasing batch sizes >= 1, got {','.join(map(str, batches))}")
    if max_gamma < 1:
        raise SimlabError(f"--max-gamma must be >= 1, got {max_gamma}")
    if requests_per_slot < 1:
        raise SimlabError(f"--requests-per-slot must be >= 1, got {requests_per_slot}")


def tune(sim: Simulator, batches: Sequence[int] = DEFAULT_BATCHES, max_gamma: int = DEFAULT_MAX_GAMMA,
         requests_per_slot: int = REQUESTS_PER_SLOT, token_budget: int = DEFAULT_TOKEN_BUDGET,
         progress: bool | None = None, scheduler: str = "simlab") -> Tuned:
    """Serve every (batch size, γ) as the module docstring says; ``progress``: a bar on stderr
    (None: on a terminal only); ``scheduler``: ``simlab`` or ``vllm`` (module docstring)."""
    from tqdm import tqdm

    from simlab.latency.batch import BatchLatency
    from simlab.serve.batch_policy import BatchSpec
    from simlab.serve.run import BASELINE_POLICY, ServeConfig, serve_once
    from simlab.serve.vllm_scheduler import VllmScheduler

    check_tune(batches, max_gamma, requests_per_slot)
    longest = max(p.budget for p in sim.replay.prompts) - 2  # the longest draft a round can make
    if max_gamma > longest:
        raise SimlabError(f"--max-gamma {max_gamma}: no prompt of this trace drafts more than {longest} tokens a round "
                          f"(its budget less the committed and the target's token); use at most {longest}")
    vllm = scheduler == "vllm"
    limits = VllmScheduler if vllm else Scheduler
    policy, params = ("vllm", {"num_speculative_tokens": max_gamma}) if vllm else (POLICY, {"gamma": max_gamma})
    for b in batches:  # a budget too small for a batch size fails before anything runs
        limits(b, token_budget).check(max(p.prompt_len for p in sim.replay.prompts[: requests_per_slot * b]))
    latency = BatchLatency(sim.latency)
    tps: dict[int, list[float]] = {}
    plain: dict[int, float] | None = {} if vllm else None
    bar = tqdm(total=len(batches) * (max_gamma + 1 + vllm), desc="serve tune", unit="run",
               disable=None if progress is None else not progress, dynamic_ncols=True)
    with bar:
        for b in batches:
            arrivals = [0.0] * (requests_per_slot * b)
            tps[b] = []
            for g in range(max_gamma + 1):
                config = ServeConfig(policy, params, limits(b, token_budget), BatchSpec(gamma_by_batch=f"1:{g}"))
                run = serve_once(sim, arrivals, config, policy, params, latency=latency)
                tps[b].append(run.summary["throughput_tokens_per_s"])
                bar.update()
            if vllm:
                config = ServeConfig(policy, params, limits(b, token_budget))
                plain[b] = serve_once(sim, arrivals, config, BASELINE_POLICY, {}, latency=latency).summary[
                    "throughput_tokens_per_s"]
                bar.update()
    return Tuned(tuple(batches), max_gamma, tps, requests_per_slot, token_budget, latency.rule, latency.extrapolated,
                 plain, scheduler)

"""The one recipe for the context a policy is built with, shared by the simulator and the live
decoder.

Policies that size windows or thresholds up front (PEARL's and SPIDE's windows, the h-rule)
read the context, so a live run and the simulation it is compared with must hand a policy the
same one, or they decide differently. Both therefore build it here, from the same facts:

- latency: a :class:`~simlab.latency.grid.LatencyGrid` over the model (the tabulated figures
  the executor prices rounds with; the oracle's plan relies on both being one grid);
- typical context length: the median prompt length plus half the median number of generated
  tokens (the middle of a typical prompt's decode), over the prompts the run decodes;
- ``corun``: True in the one-device topology (parallel rounds share the device);
- exit layers and layer count, tree data (top-K, EAGLE-2 depth) and temperature from the
  trace's manifest, when there is a trace; Sequoia's positional acceptance from its replay.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Callable

from simlab.latency.grid import LatencyGrid
from simlab.latency.model import LatencyModel
from simlab.policies import PolicyContext
from simlab.policies.base import AcceptancePredictor
from simlab.trace.schema import Manifest, Topology

GRID_MARGIN = 64  # context lengths tabulated past the longest prompt (parallel drafts look ahead)


def tabulated(model: LatencyModel, longest_context: int) -> LatencyGrid:
    """``model`` tabulated for every context a run of prompts up to ``longest_context`` meets."""
    return LatencyGrid(model, longest_context + GRID_MARGIN)


def typical_context_len(prompt_lens: Sequence[int], new_tokens: Sequence[int]) -> int:
    """The context length policies size windows at: median prompt + half the median new tokens
    (``statistics.median``: numpy's imports ``numpy.ma``, some 20 ms of a command's start-up)."""
    return int(statistics.median(prompt_lens) + statistics.median(new_tokens) / 2)


def policy_context(latency: LatencyGrid | None, context_len: int, topology: Topology,
                   manifest: Manifest | None = None, best_gamma: Callable[[], int] | None = None,
                   predictor: AcceptancePredictor | None = None,
                   rank_acceptance: Callable[[], list[float]] | None = None) -> PolicyContext:
    """A policy's context (module docstring); ``manifest`` gives the exit layers and tree data, if any."""
    return PolicyContext(latency=latency, exit_layers=list(manifest.exit_layers) if manifest else [],
                         n_layers=manifest.n_layers if manifest else 0, context_len=context_len,
                         corun=topology is Topology.ONE_DEVICE, best_gamma=best_gamma, predictor=predictor,
                         tree_topk=manifest.topk if manifest else 0,
                         tree_depth=manifest.tree_depth if manifest else 0,
                         temperature=manifest.temperature if manifest else 0.0, rank_acceptance=rank_acceptance,
                         max_new_tokens=manifest.max_new_tokens if manifest else 0,
                         eos_token_ids=list(manifest.eos_token_ids) if manifest else [])

"""A trace whose paths run on past each prompt's end, for an engine that drafts and verifies there.

vLLM drafts its K tokens whatever remains before ``max_tokens`` or the end token, verifies all
of them against the target's own continuation and counts every accepted one, past the end too,
before it cuts the output (docs/vllm.md, "A request's last step"). Replaying that needs the
target's path and the draft's tokens past each prompt's end, which ``simlab vllm record`` keeps
in ``past_end.parquet``. :func:`extended` appends them to the positions, so the replay reads them
as any other position, and keeps each prompt's own end in the prompts column ``end``: where the
engine stops and cuts (:class:`~simlab.policies.vllm.Vllm`), short of the extended path's end.

A trace holding fewer than ``tail`` positions past a prompt's end (every trace not recorded with
``simlab vllm record``) gets placeholders that the draft never matches: an acceptance there is
counted as a rejection, so a prediction on it is a lower bound in the last step of each prompt
that gets that far, and :attr:`Extended.padded` says how many prompts were padded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from simlab.trace.schema import POSITION_COLUMNS
from simlab.trace.tables import Trace

if TYPE_CHECKING:  # pandas is imported where a path is extended (a vLLM policy), not by every simulation
    import pandas as pd

# A placeholder position's tokens: never equal, so never accepted (and never a vocabulary id).
PLACEHOLDER_TARGET, PLACEHOLDER_DRAFT = -1, -2


@dataclass(frozen=True)
class Extended:
    trace: Trace
    padded: int  # prompts with fewer than ``tail`` recorded positions past their end


def extended(trace: Trace, tail: int) -> Extended:
    """``trace`` with every prompt's path run ``tail`` positions past its end (module docstring).

    Only what a chain replay reads is kept: the extended positions, the divergence rollouts before
    each prompt's end (its tail rollout no longer sits at the path's end) and the latencies; the
    optional tables of exit layers and trees, which cover only the recorded positions, are dropped."""
    import pandas as pd

    prompts = trace.prompts.sort_values("prompt_id").reset_index(drop=True)
    n = prompts.set_index("prompt_id")["n_tokens"]
    past = trace.past_end if trace.past_end is not None else trace.positions.iloc[:0]
    past = past.assign(offset=past["pos"] - past["prompt_id"].map(n))
    past = past[past["offset"] < tail].drop(columns="offset")
    have = past.groupby("prompt_id")["pos"].count().reindex(n.index, fill_value=0)
    short = have[have < tail]
    fill = [_placeholders(int(pid), int(n[pid]) + int(count), tail - int(count)) for pid, count in short.items()]
    positions = pd.concat([trace.positions, past, *fill], ignore_index=True)
    positions = positions.sort_values(["prompt_id", "pos"], kind="stable").reset_index(drop=True)
    rollouts = trace.rollouts[trace.rollouts["pos"] < trace.rollouts["prompt_id"].map(n)]
    out = replace(trace, prompts=prompts.assign(end=prompts["n_tokens"], n_tokens=prompts["n_tokens"] + tail),
                  positions=positions, rollouts=rollouts.reset_index(drop=True), layers=None, topk=None, tree=None,
                  past_end=None, manifest=replace(trace.manifest, topk=0, tree_depth=0, exit_layers=[]))
    return Extended(out, len(short))


def _placeholders(prompt_id: int, first: int, count: int) -> pd.DataFrame:
    import pandas as pd

    rows = {col: np.zeros(count) for col in POSITION_COLUMNS}
    rows.update(prompt_id=np.full(count, prompt_id), pos=np.arange(first, first + count),
                target_token=np.full(count, PLACEHOLDER_TARGET), draft_token=np.full(count, PLACEHOLDER_DRAFT))
    return pd.DataFrame(rows)


__all__ = ["Extended", "extended", "PLACEHOLDER_TARGET", "PLACEHOLDER_DRAFT"]

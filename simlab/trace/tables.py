"""A trace in memory: its manifest and one DataFrame per table.

Apart from reading and writing (:mod:`simlab.trace.io`) so that the checks a reader runs
(:mod:`simlab.trace.checks`) can name the type they check without importing the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from simlab.trace.schema import Manifest


@dataclass
class Trace:
    """A trace in memory: the manifest and one DataFrame per table.

    ``layers`` is None when the trace has no per-layer early-exit signals, ``topk`` and
    ``tree`` when it was recorded without ``--topk`` / ``--tree-depth``, ``past_end`` when it
    holds no positions past the prompts' ends (every trace but ``simlab vllm record``'s).
    """

    manifest: Manifest
    prompts: pd.DataFrame
    positions: pd.DataFrame
    rollouts: pd.DataFrame
    latency: pd.DataFrame
    layers: pd.DataFrame | None = None
    path: Path | None = None
    topk: pd.DataFrame | None = None
    tree: pd.DataFrame | None = None
    past_end: pd.DataFrame | None = None

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)

    @property
    def n_positions(self) -> int:
        return len(self.positions)

    def table(self, name: str) -> pd.DataFrame | None:
        return getattr(self, name)

    def select_prompts(self, prompt_ids) -> "Trace":
        """A trace restricted to some prompts (e.g. a train/test split)."""
        ids = set(int(i) for i in prompt_ids)

        def keep(df: pd.DataFrame | None) -> pd.DataFrame | None:
            if df is None:
                return None
            return df[df["prompt_id"].isin(ids)].reset_index(drop=True)

        return replace(
            self,
            prompts=keep(self.prompts),
            positions=keep(self.positions),
            rollouts=keep(self.rollouts),
            layers=keep(self.layers),
            topk=keep(self.topk),
            tree=keep(self.tree),
            past_end=keep(self.past_end),
        )

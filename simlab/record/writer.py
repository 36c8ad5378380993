"""The trace on disk, rewritten after every recorded prompt.

The first commit of a new trace writes a whole directory and renames it into place
(``write_trace``), so a trace that was there before (``--force``) is never mixed with the new
one; later commits rewrite it in place (``update_trace``: tables renamed into place, the prompt
list last), so rewriting the whole trace after each prompt means a recording that is interrupted, killed
or out of memory loses at most the prompt in flight, and ``--resume`` continues from what is
on disk. The manifest's ``extra`` carries running figures: wall time (summed over resumed
runs), peak memory, the share of CPU other processes took (over all runs, weighted by the
seconds each covered: ``other_cpu_seconds``), the draft's agreement rate and the recording
cost relative to plain generation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from simlab.common.cpu_load import OtherLoad
from simlab.record import machine
from simlab.trace.io import Trace, empty_table, update_trace, write_trace
from simlab.trace.schema import Manifest, with_defaults

ROW_TABLES = ("prompts", "positions", "rollouts", "layers", "topk", "tree", "past_end")


@dataclass
class TraceWriter:
    out: Path
    manifest: Manifest
    latency: pd.DataFrame
    with_layers: bool
    fresh: bool = False  # no trace of this recording is on disk yet
    frames: dict[str, list[pd.DataFrame]] = field(default_factory=lambda: {t: [] for t in ROW_TABLES})

    def __post_init__(self) -> None:
        self._started = time.perf_counter()
        self._load = OtherLoad()
        self._previous_wall = float(self.manifest.extra.get("wall_seconds", 0.0))
        self._previous_rss = float(self.manifest.extra.get("peak_rss_mb", 0.0))
        # earlier runs' share of other processes (a resumed recording) and the seconds it covers;
        # a trace written before those seconds were kept weighs it by its whole wall time
        before = self.manifest.extra.get("other_cpu")
        span = self.manifest.extra.get("other_cpu_seconds", self._previous_wall) if before is not None else 0.0
        self._previous_other = (before, float(span))

    def table(self, name: str) -> pd.DataFrame:
        frames = [f for f in self.frames[name] if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else empty_table(name)

    def add(self, rows: dict[str, pd.DataFrame]) -> None:
        for name, df in rows.items():
            self.frames[name].append(df)

    def replace_rollouts(self, prompt_id: int, layer: int, rows: pd.DataFrame) -> None:
        """Put ``rows`` in place of one prompt's rollouts of one drafter (``layer``: an exit
        layer's, or NO_LAYER the draft's)."""
        self.frames["rollouts"] = [
            f[(f["prompt_id"] != prompt_id) | (f["layer"] != layer)]
            for f in map(partial(with_defaults, "rollouts"), self.frames["rollouts"])
        ]
        self.frames["rollouts"].append(rows)

    def commit(self, run_started: float) -> None:
        """Write the trace; ``run_started`` is when this run began (perf_counter)."""
        prompts, positions = self.table("prompts"), self.table("positions")
        extra = self.manifest.extra
        extra.update(
            wall_seconds=round(self._previous_wall + time.perf_counter() - run_started, 1),
            peak_rss_mb=round(max(self._previous_rss, machine.peak_rss_mb()), 1),
            **summary(prompts, positions),
        )
        other = self._load.share()  # during this run's prompts (after the probe)
        if other is not None:  # with earlier runs', weighted by the seconds each covers
            before, span_before = self._previous_other
            span = self._load.seconds()
            if before is not None and span_before > 0:
                other = round((before * span_before + other * span) / (span_before + span), 3)
            extra["other_cpu"] = other
            extra["other_cpu_seconds"] = round(span_before + span, 1)
        trace = Trace(
            manifest=self.manifest,
            prompts=prompts,
            positions=positions,
            rollouts=self.table("rollouts"),
            latency=self.latency,
            layers=self.table("layers") if self.with_layers else None,
            topk=self.table("topk") if self.manifest.topk else None,
            tree=self.table("tree") if self.manifest.tree_depth else None,
            past_end=self.table("past_end") if self.frames["past_end"] else None,
        )
        if self.fresh:
            write_trace(trace, self.out)
            self.fresh = False
        else:
            update_trace(trace, self.out)


def agreement(positions: pd.DataFrame) -> float:
    """Fraction of positions where the draft's greedy token is the target's token."""
    if positions.empty:
        return float("nan")
    return float((positions["draft_token"] == positions["target_token"]).mean())


def summary(prompts: pd.DataFrame, positions: pd.DataFrame) -> dict:
    """Agreement, and what recording cost relative to the target's plain generation."""
    if prompts.empty:
        return {}
    gen = float(prompts["generate_seconds"].sum())
    signals = float(prompts["signals_seconds"].sum())
    roll = float(prompts["rollout_seconds"].sum())
    return {
        "agreement": round(agreement(positions), 4),
        "cost": {
            "generate_seconds": round(gen, 2),
            "signals_seconds": round(signals, 2),
            "rollout_seconds": round(roll, 2),
            "ratio_without_rollouts": round((gen + signals) / gen, 3),
            "ratio_with_rollouts": round((gen + signals + roll) / gen, 3),
        },
    }

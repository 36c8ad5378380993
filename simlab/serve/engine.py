"""The serving engine: one SimPy process that runs engine steps back to back.

An engine step, in model time (docs/serving.md):

1. the scheduler admits waiting requests; their prompts are prefilled in one batched target
   forward and one batched draft forward (none when no admitted request drafts: ``ad``) —
   each admitted request's first token is out when the prefill ends;
2. every request that was already running plans its round (its own policy, under the step's
   batch-level cap) and drafts: draft step j is one batched draft forward over the requests
   that draft at least j tokens, so ragged draft lengths cost as many steps as the longest
   draft, and a request that stopped drafting waits for the others; the first step feeds each
   request what its draft's cache lacks (:mod:`simlab.sim.draft_cache`: two tokens after a
   round that accepted every draft), a forward as wide as the widest; a tree round drafts one
   level per draft step, over that level's nodes (:meth:`~simlab.latency.batch.BatchLatency.draft_phase`);
3. one batched target forward verifies every running request's drafts plus its bonus
   position (k_i + 1 tokens each; a tree's n_i nodes plus its root, under a tree mask); under a policy that reads shadow tokens (DEL) the target
   then runs an exit head per exit layer over the positions every request just settled (its
   accepted drafts and the target's token), as it does after a prefill over each admitted
   request's position 0: the single-request executor's price (:mod:`simlab.sim.executor`), the
   batch's rows in one head per layer; requests that reached their end leave the batch. Under
   adaptive verification (:mod:`simlab.serve.adaptive_verify`) the batch-level policy sees the
   drafts' confidences once the draft phase ends and each request verifies only the drafts it
   admits (the others were drafted, paid for and are discarded); it then learns from what the
   target accepted.

With a ``mixed`` scheduler (llama.cpp's server, :mod:`simlab.serve.scheduler`) a step that both
admits and decodes has no prefill forward of its own: its verification forward carries the
admitted prompts too, priced as that verification plus what the prompts' tokens add to a forward
of the step's tokens (:meth:`~simlab.latency.batch.BatchLatency.beside`), and each admitted
request's first token comes when it ends.

Requests proceed in lock-step: nobody starts the next round before the step ends. Forwards
are booked on two :class:`~simlab.sim.devices.Device` rows (draft, target), which refuse
overlapping work, and the step is handed to SimPy as one timeout (event aggregation, as the
single-request executor does for serial rounds). An idle engine sleeps until an arrival.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import simpy

from simlab.common.metrics import PositionStats
from simlab.latency.batch import BatchLatency
from simlab.latency.priced import Extrapolated, shadows
from simlab.serve.adaptive_verify import AdaptiveVerify
from simlab.serve.batch_policy import BatchPolicy
from simlab.serve.request import ServedRequest
from simlab.serve.scheduler import Scheduler
from simlab.sim.devices import Device, Slice
from simlab.trace.schema import NO_LAYER


@dataclass
class EngineStats:
    steps: int = 0
    prefill_steps: int = 0
    draft_forwards: int = 0
    batch_sizes: int = 0  # sum over decode steps of the decoding batch size (mean = / decode_steps)
    decode_steps: int = 0
    caps: dict = field(default_factory=dict)  # draft-length cap -> decode steps that used it


class Engine:
    """Continuous batching of speculative decoding on one draft/target pair."""

    def __init__(self, env: simpy.Environment, latency: BatchLatency, scheduler: Scheduler,
                 batch_policy: BatchPolicy, record: bool = False, shadow_heads: int = 0):
        """``shadow_heads``: the exit heads of a shadow read (:func:`~simlab.sim.executor.shadow_heads`)."""
        self.env = env
        self.shadow_heads = shadow_heads
        self.latency = latency
        self.scheduler = scheduler
        self.batch_policy = batch_policy
        # a batch-level policy that trims what each request verifies after drafting (simlab.serve.adaptive_verify)
        self.trims = batch_policy if isinstance(batch_policy, AdaptiveVerify) else None
        self.waiting: deque[ServedRequest] = deque()
        self.running: list[ServedRequest] = []
        self.finished: list[ServedRequest] = []
        self.positions = PositionStats()
        self.stats = EngineStats()
        self.draft_dev = Device("draft")
        self.target_dev = Device("target")
        self.record = record
        self.slices: list[Slice] = []
        self._wake: simpy.Event | None = None
        # the forwards priced and those priced past the measured latencies (simlab.latency.priced)
        self.priced = Extrapolated()

    def submit(self, request: ServedRequest) -> None:
        """A request arrives: queue it and wake the engine if it sleeps."""
        self.waiting.append(request)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self, total: int):
        """The engine's SimPy process: steps until ``total`` requests have finished."""
        env = self.env
        while len(self.finished) < total:
            if not self.waiting and not self.running:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            now = env.now
            end = self._step(now)
            yield env.timeout(end - now)

    def _step(self, now: float) -> float:
        """Price and settle one step that starts at ``now``; return its end time."""
        stats = self.stats
        stats.steps += 1
        decoders = self.running
        admitted = self.scheduler.admit(self.waiting, len(decoders))
        t = now
        if admitted and decoders and self.scheduler.mixed:
            t = self._decode(decoders, t, admitted)
        else:
            if admitted:
                t = self._prefill(admitted, t)
            if decoders:
                t = self._decode(decoders, t)
        self.running = [r for r in decoders if not r.done] + [r for r in admitted if not r.done]
        return t

    def _prefill(self, admitted: list[ServedRequest], t: float) -> float:
        self.stats.prefill_steps += 1
        lens = [r.prompt_len for r in admitted]
        seconds = self.latency.prefill(lens, drafts=any(r.policy.drafts for r in admitted))
        for bits in self.latency.prefill_bits(lens, drafts=any(r.policy.drafts for r in admitted)):
            self.priced.add_one(bits)
        end = self._book(self.target_dev, t, seconds, "prefill", len(admitted), sum(lens))
        self._first_tokens(admitted, t, end)
        return self._shadows(end, len(admitted), len(admitted))

    def _first_tokens(self, admitted: Sequence[ServedRequest], start: float, end: float) -> None:
        """The admitted requests' prefill ran in the step from ``start`` and ended at ``end``:
        position 0 is out, and they decode from the next step."""
        for r in admitted:
            r.admitted, r.first_token = start, end
            r.start()
            if r.done:  # a one-token answer: the prefill emitted all of it
                self._finish(r, end)

    def _decode(self, decoders: list[ServedRequest], t: float, admitted: Sequence[ServedRequest] = ()) -> float:
        """One decode step from ``t``; ``admitted`` (a mixed scheduler's) are prefilled in its
        verification forward."""
        stats = self.stats
        start = t
        ctxs = [r.context for r in decoders]
        cap = self.batch_policy.cap([r.policy for r in decoders], ctxs)
        stats.caps[cap] = stats.caps.get(cap, 0) + 1
        rounds = []
        for r in decoders:
            r.policy.cap = cap
            rounds.append(r.next_round())
        drafts = [k for _, k, _ in rounds]  # a tree round's: its nodes
        drafted = [r.drafted for r in decoders]  # draft forwards (a dropped draft was drafted too)
        layers = [layer for _, _, layer in rounds if layer is not None]
        # a tree round's draft forwards are over its levels' widths, its verification under a tree mask
        trees = [r.tree is not None for r in decoders] if any(r.tree is not None for r in decoders) else None
        widths = [r.tree.widths if r.tree is not None else None for r in decoders] if trees else None
        seconds, steps = self.latency.draft_phase(drafted, ctxs, max(layers) if layers else NO_LAYER,
                                                  [r.feed for r in decoders], widths)
        if steps:
            self.latency.count_draft_phase(self.priced, drafted, ctxs, max(layers) if layers else NO_LAYER,
                                           [r.feed for r in decoders], widths)
            tokens = sum(k if r.tree is not None else d for r, k, d in zip(decoders, drafts, drafted))
            t = self._book(self.draft_dev, t, seconds, f"draft x{steps}", len(decoders), tokens)
        if self.trims is not None:  # adaptive verification: each request verifies its admitted drafts only
            drafts = self.trims.verified([r.confidences(first, layer) for r, (first, _, layer) in zip(decoders, rounds)],
                                         ctxs, seconds if steps else 0.0)
            rounds = [(first, k, layer) for (first, _, layer), k in zip(rounds, drafts)]
        if any(r.policy.drafts for r in decoders):
            verify = self.latency.target([k + 1 for k in drafts], ctxs, trees)
            bits = self.latency.target_bits([k + 1 for k in drafts], ctxs, trees)
        else:  # autoregressive decoding: a plain step, with no draft beside it
            verify = self.latency.step(ctxs)
            bits = self.latency.step_bits(ctxs)
        settled = [r.verify(first, k, layer, self.positions) for r, (first, k, layer) in zip(decoders, rounds)]
        if self.trims is not None:
            self.trims.observe(drafts, settled)
        accepted = sum(settled)
        tokens, what = sum(drafts) + len(decoders), "verify"
        if admitted:
            self.stats.prefill_steps += 1
            lens = [r.prompt_len for r in admitted]
            verify += self.latency.beside(lens, tokens, drafts=any(r.policy.drafts for r in [*decoders, *admitted]))
            bits |= self.latency.beside_bits(lens, tokens, drafts=any(r.policy.drafts for r in [*decoders, *admitted]))
            tokens, what = tokens + sum(lens), "verify+prefill"
        t = self._book(self.target_dev, t, verify, what, len(decoders) + len(admitted), tokens, accepted)
        self.priced.add_one(bits)
        self._first_tokens(admitted, start, t)
        # a decoder's step ends after the shadow read, as live
        t = self._shadows(t, len(decoders) + len(admitted), accepted + len(decoders) + len(admitted))
        for r in decoders:
            if r.done:
                self._finish(r, t)
        stats.draft_forwards += steps
        stats.batch_sizes += len(decoders)
        stats.decode_steps += 1
        return t

    def _shadows(self, t: float, batch: int, rows: int) -> float:
        """The shadow read after a target forward over ``batch`` requests that settled ``rows``
        positions in all, if priced; returns when it ends."""
        if not self.shadow_heads:
            return t
        seconds = self.latency.grid.shadow_seconds(rows, self.shadow_heads)
        shadows(self.priced, self.latency.grid, [rows], self.shadow_heads)
        return self._book(self.target_dev, t, seconds, "shadow", batch, rows)

    def _book(self, device: Device, t: float, seconds: float, what: str, batch: int, tokens: int,
              accepted: int | None = None) -> float:
        """Occupy ``device`` (which refuses overlapping work) and keep a timeline slice if asked."""
        end = device.book(t, seconds, what, 0, tokens)
        if self.record:
            args = {"step": self.stats.steps, "batch": batch, "tokens": tokens}
            if accepted is not None:
                args["accepted"] = accepted
            self.slices.append(Slice(device.name, what, t, end, args))
        return end

    def _finish(self, r: ServedRequest, t: float) -> None:
        r.finish = t
        r.finished_steps += 1
        c = r.counts
        c.tokens += r.kept - 1
        c.wall_time_s += t - r.first_token
        self.finished.append(r)

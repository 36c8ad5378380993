"""Live batched speculative decoding: B requests decode together, one batched draft step per
draft position and one batched verification per round.

What ``simlab serve`` simulates, run for real on a batch that starts together (every request
arriving at t = 0, no admission while it runs). Each request drives :func:`simlab.policies.rounds.decode`
with its own policy object, as in ``serve`` and ``live``; the rounds of all requests run in
lock-step:

1. every request's protocol generator is advanced to its round's first request: a draft run
   (fixed-length plans), a draft token (policies that decide after each token) or, when its
   cap is 0, a verification of no drafts;
2. draft step j is one forward of the draft over every row of the batch; rows that draft a
   j-th token feed what their draft cache lacks (the last committed token, or two tokens
   after a round that accepted everything), rows that stopped feed nothing (masked);
3. one target forward verifies every row's last committed token plus its drafts (k_i + 1
   tokens, padded to the longest), and each row's acceptance is judged on its own logits
   (:meth:`LiveExecutor._judge`: greedy prefix match, or speculative sampling at a
   temperature);
4. both caches keep each row's accepted prefix (:class:`~simlab.live.padded_cache.PaddedCache`:
   left padding, per-row lengths, compaction), and requests that reached their end leave the
   batch.

Greedy decoding is lossless per request: a row computes what it would alone, up to the
floating-point rounding of a batched matmul (logits differ by about 1e-5), so its tokens are
its single-request ``generate``'s unless two candidates tie to that precision.

Not served here: parallel policies (a parallel round overlaps one request's draft and target
forwards, which a lock-step batch cannot), policies that draft with other exit layers than the
session's draft or read shadow tokens (DEL, LayerSkip's own layer choice).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from simlab.common.errors import SimlabError
from simlab.common.metrics import Counts, PositionStats
from simlab.common.signals import TokenSignal
from simlab.live.executor import LazySignal, LiveExecutor, SignalList, settle
from simlab.live.padded_cache import PaddedCache
from simlab.policies.base import Policy, PromptInfo
from simlab.policies.rounds import DRAFT, DraftLoop, DraftRun, Verify, decode


@dataclass
class StepForward:
    """One timed batched forward (seconds since the decode phase began)."""

    device: str  # "draft" or "target"
    what: str  # "draft" or "verify"
    start: float
    end: float
    tokens: int  # real tokens fed, over all rows
    rows: int  # sequences in the batch
    width: int  # tokens per row after padding


@dataclass
class BatchedRequest:
    """One request of a batch: its tokens, counts and times (seconds since the decode phase began)."""

    prompt_id: int
    prompt: list[int]
    tokens: list[int]  # generated tokens, position 0 (from the prefill) first
    counts: Counts = field(default_factory=Counts)
    positions: PositionStats = field(default_factory=PositionStats)
    finish: float = float("nan")  # its last verification ended

    @property
    def tpot(self) -> float:
        """Time per output token after the first: the decode phase began when every prefill was done."""
        return self.finish / (len(self.tokens) - 1) if len(self.tokens) > 1 else float("nan")


@dataclass
class BatchedRun:
    requests: list[BatchedRequest]
    forwards: list[StepForward]
    prefill_s: float  # the prompts' prefills, one at a time, before the decode phase
    wall_s: float  # the decode phase: from the end of the prefills to the last finish

    @property
    def tokens(self) -> int:
        """Tokens decoded after the prefills (position 0 of each request excluded)."""
        return sum(len(r.tokens) - 1 for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


class _Row:
    """A request's protocol state while it decodes."""

    def __init__(self, request: BatchedRequest, policy: Policy, budget: int, eos: set[int]):
        self.request = request
        first = request.tokens[0]
        self.info = PromptInfo(request.prompt_id, len(request.prompt), 1 if first in eos else budget, budget)
        self.gen = decode(policy, self.info)
        self.answer = None
        self.req = None
        self.drafts: list[int] = []
        self.q: list[torch.Tensor] = []
        self.signals: SignalList | None = None  # a draft run's signals, answered when complete
        self.looped: list[TokenSignal] = []  # a token-by-token run's signals so far

    @property
    def known(self) -> list[int]:
        """Prompt, committed tokens and this round's drafts."""
        return self.request.prompt + self.request.tokens + self.drafts

    def advance(self, answer) -> bool:
        """Send ``answer``; False when the protocol has ended."""
        try:
            self.req = self.gen.send(answer)
        except StopIteration:
            return False
        if type(self.req) not in (DraftRun, DraftLoop, Verify):
            raise SimlabError(f"batched decoding serves serial rounds only; the policy asked for {type(self.req).__name__}")
        if self.req.layer is not None:
            raise SimlabError(f"batched decoding drafts with the session's draft; the policy asked for exit layer "
                              f"{self.req.layer}")
        return True

    def wants_draft(self) -> bool:
        req = self.req
        return type(req) in (DraftRun, DraftLoop) and len(self.drafts) < (req.count if type(req) is DraftRun else req.cap)


class BatchedDecoder:
    """Decode a batch of prompts together with the models, sampling rules and end tokens of a
    :class:`LiveExecutor` (its draft may be a separate model or an early exit of the target)."""

    def __init__(self, executor: LiveExecutor):
        self.x = executor

    def run(self, policies: list[Policy], prompts: list[tuple[int, list[int]]], budget: int) -> BatchedRun:
        """Decode ``prompts`` ((prompt_id, token ids) each) with one policy object each, every
        request generating at most ``budget`` tokens."""
        if len(policies) != len(prompts) or not prompts:
            raise SimlabError("batched decoding needs one policy object per prompt, and at least one prompt")
        for p in policies:
            if p.parallel or p.needs_shadows or p.needs_future or p.checked_by:
                raise SimlabError(f"batched decoding serves serial policies that need no shadow tokens; {p.name} "
                                  "is not one")
        x, eos = self.x, self.x.eos
        started = time.perf_counter()
        with torch.inference_mode():
            target, first = PaddedCache.prefill(x.target_model, [ids for _, ids in prompts])
            # plain decoding (``ad``) runs no draft, so it keeps no draft cache either
            draft = PaddedCache.prefill(x.draft_model, [ids for _, ids in prompts])[0] \
                if any(p.drafts for p in policies) else None
        requests = [BatchedRequest(pid, list(ids), [x._pick(x._dist(lg))]) for (pid, ids), lg in zip(prompts, first)]
        rows = [_Row(r, p, budget, eos) for r, p in zip(requests, policies)]
        self._origin = time.perf_counter()
        forwards: list[StepForward] = []
        self._forwards = forwards
        prefill = self._origin - started
        going = [r.advance(None) for r in rows]
        for r, g in zip(rows, going):
            if not g:  # a one-token answer: the prefill emitted all of it
                r.request.finish = 0.0
        rows = self._retire(rows, going, target, draft)
        while rows:
            self._draft_phase(rows, draft)
            self._verify(rows, target, draft)
            # the next round starts (finished requests' protocols see their last answer and end)
            rows = self._retire(rows, [r.advance(r.answer) for r in rows], target, draft)
        wall = max(r.finish for r in requests)
        for r in requests:
            r.counts.tokens = len(r.tokens) - 1
            r.counts.wall_time_s = r.finish
        return BatchedRun(requests, forwards, prefill, wall)

    def _timed(self, cache: PaddedCache, device: str, what: str, feeds: list[list[int]]) -> list[torch.Tensor]:
        start = time.perf_counter()
        logits = cache.feed(feeds)
        self.x._sync()
        end = time.perf_counter()
        self._forwards.append(StepForward(device, what, start - self._origin, end - self._origin,
                                          sum(len(f) for f in feeds), cache.rows, max(len(f) for f in feeds)))
        return logits

    def _draft_phase(self, rows: list[_Row], draft: PaddedCache) -> None:
        """Batched draft steps while any row still drafts; each row's generator is answered as
        its run completes (a draft run) or after each token (a policy that decides per token)."""
        x = self.x
        while True:
            active = [r.wants_draft() for r in rows]
            if not any(active):
                return
            have = draft.n
            feeds = [r.known[have[i]:] if a else [] for i, (r, a) in enumerate(zip(rows, active))]
            logits = self._timed(draft, "draft", "draft", feeds)
            for r, a, lg in zip(rows, active, logits):
                if not a:
                    continue
                q = x._dist(lg[-1])
                token = x._pick(q)
                r.drafts.append(token)
                r.q.append(q)
                c = r.request.counts
                c.draft_calls += 1
                c.drafted += 1
                signal = LazySignal(lg[-1], len(r.drafts), token in x.eos)
                if type(r.req) is DraftLoop:  # the policy decides after each token (DraftLoop.decide)
                    r.looped.append(signal.signal)
                    decision = r.req.decide(r.looped[-1])
                    if decision is not DRAFT or len(r.drafts) == r.req.cap:
                        looped, r.looped = r.looped, []
                        r.advance((looped, decision))
                else:
                    r.signals = r.signals if r.signals is not None else SignalList()
                    r.signals.append(signal)
                    if len(r.drafts) == r.req.count:
                        signals, r.signals = r.signals, None
                        r.advance(signals)

    def _verify(self, rows: list[_Row], target: PaddedCache, draft: PaddedCache | None) -> None:
        """One batched target forward over every row's last committed token and drafts; settle
        each row's acceptance."""
        x = self.x
        have = target.n
        feeds = []
        for i, r in enumerate(rows):
            if type(r.req) is not Verify:  # pragma: no cover - the draft phase ends every run
                raise SimlabError(f"request {r.request.prompt_id}: expected a verification, got {r.req!r}")
            feeds.append(r.known[have[i]:][: 1 + r.req.drafts])
        logits = self._timed(target, "target", "verify", feeds)
        keep = []
        for r, lg in zip(rows, logits):
            req, request = r.req, r.request
            k = req.drafts
            accepted, emitted = x._judge(lg[-(k + 1):], r.drafts[:k], r.q[:k])
            accepted = settle(request.tokens, x.eos, r.info, req.start, emitted, accepted)
            committed = req.start + accepted + 1
            c = request.counts
            c.target_calls += 1
            c.accepted += accepted
            c.num_drafts += k > 0
            request.positions.add(accepted + 1 if accepted < k else k, accepted)
            r.drafts, r.q, r.answer = [], [], accepted
            keep.append(len(request.prompt) + committed - 1)
            if committed >= r.info.n_tokens:
                request.finish = time.perf_counter() - self._origin
        target.keep(keep)
        if draft is not None:
            draft.keep([min(n, k) for n, k in zip(draft.n, keep)])

    def _retire(self, rows: list[_Row], going: list[bool], target: PaddedCache,
                draft: PaddedCache | None) -> list[_Row]:
        """Rows whose protocol ended leave the batch (and both caches)."""
        if all(going):
            return rows
        stay = [i for i, g in enumerate(going) if g]
        if stay:
            target.select(stay)
            if draft is not None:
                draft.select(stay)
        return [rows[i] for i in stay]

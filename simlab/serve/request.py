"""One served request: its prompt's replay, its own policy object and the round protocol.

The engine never decides how a request drafts. Each request runs :func:`simlab.policies.rounds.decode`
with its own policy; :meth:`ServedRequest.next_round` answers the generator's draft requests
from the trace (as the single-request executor does) until it asks for a verification, and
:meth:`ServedRequest.verify` settles that verification. The generator is resumed with the
verification's answer only when the next round starts, so a batch-level cap set by the
engine for that step is in place when the policy plans the round.

A tree round (``tree-static``, ``eagle2``, ``ags-tree``) is answered the same way: each
:class:`~simlab.policies.rounds.ExpandTree` from the trace's recorded tree, and its
:class:`~simlab.policies.rounds.VerifyTree` settled at once (:class:`~simlab.sim.tree_round.TreeRounds`,
the simulator's own account), kept in :attr:`ServedRequest.tree` for the engine to price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

from simlab.common.metrics import Counts, PositionStats
from simlab.policies.base import PromptInfo
from simlab.policies.rounds import (
    DraftLoop,
    DraftRun,
    ExpandTree,
    ParallelRound,
    PolicyError,
    Shadow,
    Verify,
    VerifyTree,
    decode,
)
from simlab.serve.batch_policy import CappedPolicy
from simlab.sim.draft_cache import DraftCache
from simlab.sim.tree_round import TreeRounds
from simlab.trace.replay import PromptReplay, SignalRun
from simlab.trace.schema import NO_LAYER


class TreeRound(NamedTuple):
    """The tree round a request verifies in this step: its draft forwards' widths (nodes per
    level), its depth, and the nodes its accepted path holds."""

    widths: tuple[int, ...]
    depth: int
    accepted: int


@dataclass(eq=False)
class ServedRequest:
    """A request's timeline, counts and protocol state."""

    request_id: int
    replay: PromptReplay
    policy: CappedPolicy
    arrival: float
    counts: Counts = field(default_factory=Counts)
    admitted: float = math.nan  # the step that prefilled it started
    first_token: float = math.nan  # its prefill ended: position 0 is out
    finish: float = math.nan  # its last verification ended
    committed: int = 1
    finished_steps: int = 0  # how many times it was marked finished (conservation tests: exactly 1)
    drafted: int = 0  # draft forwards of its last round: tokens drafted (a dropped one included: paid
    # for, rounds.py), or a tree round's levels
    feed: int = 0  # tokens its last round's first draft forward fed (simlab.sim.draft_cache)
    cache: DraftCache | None = None
    tree: TreeRound | None = None  # the round to verify, when it is a tree round
    trees: TreeRounds | None = None
    _answer: object = None
    _gen: object = None

    @property
    def prompt_len(self) -> int:
        return self.replay.prompt_len

    @property
    def context(self) -> int:
        """The target's context before the next round."""
        return self.replay.prompt_len + self.committed

    @property
    def started(self) -> bool:
        """Its prefill emitted position 0 (:meth:`start` ran)."""
        return self._gen is not None

    def start(self) -> None:
        """Begin decoding (after the prefill emitted position 0)."""
        rp = self.replay
        info = PromptInfo(rp.prompt_id, rp.prompt_len, rp.n_tokens, rp.budget,
                          replay=rp if self.policy.needs_future else None, stop=rp.stop)
        self._gen = decode(self.policy, info)
        self._answer = None
        self.cache = DraftCache(rp.prompt_len)
        self.trees = TreeRounds(rp)

    def next_round(self) -> tuple[int, int, int | None]:
        """Run the protocol up to the next verification: (start, drafts, layer), drafts being a
        tree round's nodes (then :attr:`tree` holds the round)."""
        send, rp, answer = self._gen.send, self.replay, self._answer
        self.drafted = 0
        self.tree = None
        while True:
            req = send(answer)
            kind = type(req)
            if kind is Verify:
                self.counts.drafted += self.drafted
                self.counts.draft_calls += self.drafted
                self.feed = self.cache.draft(NO_LAYER if req.layer is None else req.layer, rp.prompt_len + req.start,
                                             self.drafted) if self.drafted else 0
                return req.start, req.drafts, req.layer
            if kind is DraftRun:
                answer = SignalRun(rp, req.start, req.count, req.layer)
                self.drafted = req.count
            elif kind is DraftLoop:
                answer = req.run(rp.signals(req.start, req.layer))
                self.drafted = len(answer[0])
            elif kind is Shadow:
                answer = rp.shadows(req.start, req.count)
            elif kind is ExpandTree:
                answer = self.trees.expand(req)
            elif kind is VerifyTree:
                accepted, self.feed = self.trees.settle(req, self.cache)
                nodes, levels = req.tree.size, len(req.widths)
                self.tree = TreeRound(req.widths, req.tree.depth, accepted)
                self.drafted = levels
                self.counts.drafted += nodes
                self.counts.draft_calls += levels
                return req.start, nodes, None
            elif kind is ParallelRound:
                raise PolicyError(f"{self.policy.inner.name}: parallel rounds are not served")
            else:  # pragma: no cover - decode() yields only the types above
                raise TypeError(f"unknown request {req!r}")

    def confidences(self, start: int, layer: int | None) -> list[float]:
        """The draft's top-1 probability at each token of the round just drafted from ``start``
        (what the engine holds once the draft phase ends; a round cut short of verification too)."""
        return [s.confidence for s in islice(self.replay.signals(start, layer), self.drafted)]

    def verify(self, start: int, drafts: int, layer: int | None, positions: PositionStats) -> int:
        """Settle one verification of ``drafts`` tokens from ``start``: the same acceptance as
        the single-request executor (runs of accepted positions; the end token is always the
        target's; a tree round's was settled when it was drafted, and its draft length is its
        depth, as the simulator counts it). Returns the drafts accepted; the request is done when
        ``done`` is true."""
        rp, tree, c = self.replay, self.tree, self.counts
        c.target_calls += 1
        if tree is not None:
            accepted, depth = tree.accepted, tree.depth
            positions.add(accepted + 1 if accepted < depth else depth, accepted)
        else:
            path = rp.draft if layer is None else rp.path(layer)
            accepted = min(path.run[start], drafts, rp.n_tokens - start - 1)
            c.verified += drafts
            positions.add(accepted + 1 if accepted < drafts else drafts, accepted)
            self.cache.crop(rp.prompt_len + start + accepted)
        c.accepted += accepted
        self.committed = start + accepted + 1
        self._answer = accepted
        if self.done:  # let the generator see its last answer (and ask for shadows) and end
            try:
                self.next_round()
            except StopIteration:
                pass
            else:  # pragma: no cover - decode() stops once n_tokens are committed
                raise PolicyError(f"request {self.request_id} planned a round past its end")
        return accepted

    @property
    def done(self) -> bool:
        # the prompt's end (a path run past it goes on, past_end.py), or, once a round was verified
        # (the policy has seen its prompt), the policy's own stop (vllm_engine.StoppingPolicy)
        return self.committed >= self.replay.stop or (self._answer is not None and self.policy.done(self.committed))

    @property
    def kept(self) -> int:
        """The tokens it outputs (position 0's included): those its policy keeps, up to the prompt's end."""
        return min(self.replay.stop, self.policy.kept(self.committed))

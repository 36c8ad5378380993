"""The SimPy executor: replays a trace under a policy and a latency model.

It answers the requests of :func:`simlab.policies.rounds.decode` (the protocol shared with live
decoding) from a :class:`~simlab.trace.replay.TraceReplay`:

- a drafted token's signal comes from the replay (true path, or the divergence rollout);
- a verification accepts ``min(drafts, run[start])`` tokens, where ``run[t]`` counts the
  consecutive accepted positions from t — exact for greedy traces;
- a tree round's drafts are answered from the trace's tree data (:mod:`simlab.trace.tree_replay`)
  and it accepts the deepest node whose path follows the target's tokens;
- durations come from the latency model (tabulated once in a
  :class:`~simlab.latency.grid.LatencyGrid`); a serial round is k draft steps then one target
  forward over k+1 positions; a tree round is one draft forward per level
  (:meth:`~simlab.latency.grid.LatencyGrid.tree_draft_seconds`) then one tree verification over
  its nodes + 1 (``target_tree``); a parallel round runs both devices at once;
- a policy that reads shadow tokens (DEL) has them computed, after the prefill and after every
  serial verification, by an exit head per layer of :func:`~simlab.common.signals.shadow_layers` over
  the positions just settled, one after another on the target
  (:meth:`~simlab.latency.grid.LatencyGrid.shadow_seconds`): the live decoder's work, priced
  where its latency model has exit-head figures (:func:`shadow_heads`);
- every forward it books is noted (one append a round) and counted at the end: how many were
  priced past what the latency model measured, by rule (:mod:`simlab.sim.extrapolation`).

Time semantics are in :mod:`simlab.sim.devices`. Each prompt is one SimPy process. Its rounds
never overlap one another, so they are priced on the prompt's local clock — a serial round
adds its draft steps then its verification, a parallel round books both devices from the same
start and ends when the later forward does (what two SimPy timeouts joined by ``AllOf`` would
give) — and the prompt is handed to SimPy as one timeout (event aggregation: the same clock,
far fewer events; the devices still check every booking).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import simpy

from simlab.common.metrics import Counts, PositionStats
from simlab.common.signals import shadow_layers
from simlab.latency.grid import LatencyGrid
from simlab.latency.model import LatencyModel
from simlab.policies.base import Decision, Policy, PromptInfo
from simlab.policies.rounds import (
    DraftLoop,
    DraftRun,
    ExpandTree,
    ParallelResult,
    ParallelRound,
    Propose,
    Shadow,
    Verify,
    VerifyTokens,
    VerifyTree,
    decode,
)
from simlab.sim.devices import Device, Slice, Topology
from simlab.sim.draft_cache import DraftCache
from simlab.sim.extrapolation import Extrapolated, ForwardLog
from simlab.sim.tree_round import TreeRounds
from simlab.trace.replay import PromptReplay, SignalRun, TraceReplay
from simlab.trace.schema import NO_LAYER, Manifest


@dataclass
class PromptRun:
    """What one prompt's simulation produced."""

    prompt_id: int
    counts: Counts
    tokens: list[int] | None = None  # emitted tokens (positions 1..n-1), when asked for
    slices: list[Slice] = field(default_factory=list)  # timeline, when asked for


@dataclass
class SimRun:
    prompts: list[PromptRun]
    positions: PositionStats
    # the policy's priced forwards, and those priced past the measured (the baseline's: Simulator.run)
    extrapolated: Extrapolated = field(default_factory=Extrapolated)


VERIFY, DRAFT = Decision.VERIFY, Decision.DRAFT


def ad_seconds(grid: LatencyGrid, prompt_len: int, n_tokens: int) -> float:
    """Autoregressive decoding of the same tokens: one plain target step per position (the
    one-token target forward, except on an engine whose verification also runs the draft:
    :meth:`~simlab.latency.grid.LatencyGrid.target_step_row`)."""
    return sum(grid.target_step_row()[prompt_len + 1 : prompt_len + n_tokens])


_warned: set[str] = set()  # the pricing warnings this process has printed


def warn_once(warning: str) -> None:
    """Print ``warning`` on stderr unless this process has printed it already."""
    if warning not in _warned:
        _warned.add(warning)
        print(warning, file=sys.stderr)


def shadow_heads(grid: LatencyGrid, manifest: Manifest, policy: Policy) -> int:
    """How many exit heads the simulator prices per shadow read of ``policy``: one per layer of
    :func:`~simlab.common.signals.shadow_layers` of the trace (the rule the live decoder computes them
    by), none for a policy that reads no shadow tokens. A latency model without exit-head figures
    (every trace probed before the probe's exit-head axis) prices none either, the figures simlab
    gave before, and says so on stderr in one line, once per process and trace."""
    if not policy.needs_shadows:
        return 0
    if grid.prices_shadows:
        return len(shadow_layers(manifest.exit_layers, manifest.n_layers))
    command = manifest.command or "simlab record <the trace's options>"
    warning = (f"simlab: warning: {policy.name}'s shadow tokens are unpriced (latency model {grid.name!r} has no "
               f"exit-head samples); re-probe the trace (a copy, if it is a shipped one) to add them: {command} "
               "--resume --reprobe")
    warn_once(warning)
    return 0


def as_grid(latency: LatencyModel, max_context: int) -> LatencyGrid:
    if isinstance(latency, LatencyGrid) and latency.max_context >= max_context:
        return latency
    return LatencyGrid(latency, max_context)


class SimExecutor:
    """Replay prompts one after another in one SimPy environment."""

    def __init__(
        self,
        latency: LatencyModel,
        topology: Topology | str = Topology.TWO_DEVICES,
        keep_tokens: bool = False,
        timeline_prompt: int | None = None,
    ):
        self.latency = latency
        self.topology = Topology(topology)
        self.keep_tokens = keep_tokens
        self.timeline_prompt = timeline_prompt

    def run(self, replay: TraceReplay, policy: Policy) -> SimRun:
        grid = as_grid(self.latency, replay.max_context + 1)
        env = simpy.Environment()
        runs: list[PromptRun] = []
        positions = PositionStats()
        heads = shadow_heads(grid, replay.trace.manifest, policy)
        log = ForwardLog()

        def all_prompts():
            for prompt in replay.prompts:
                run = PromptRun(prompt.prompt_id, Counts(), [] if self.keep_tokens else None)
                yield env.process(self._prompt(env, grid, prompt, policy, run, positions, heads, log))
                runs.append(run)

        env.process(all_prompts())
        env.run()
        corun = self.topology is Topology.ONE_DEVICE
        return SimRun(runs, positions, log.count(grid, corun, not policy.drafts, heads))

    def _prompt(self, env: simpy.Environment, grid: LatencyGrid, rp: PromptReplay, policy: Policy,
                run: PromptRun, positions: PositionStats, heads: int, log: ForwardLog):
        """``heads``: the exit heads of a shadow read (:func:`shadow_heads`); ``log``: where the
        forwards booked are noted (:class:`~simlab.sim.extrapolation.ForwardLog`)."""
        record = rp.prompt_id == self.timeline_prompt
        t0 = env.now
        draft_dev = Device("draft", record)
        target_dev = Device("target", record)
        corun = self.topology is Topology.ONE_DEVICE
        counts, tokens, pl, end = run.counts, run.tokens, rp.prompt_len, rp.n_tokens
        overruns_before = rp.rollout_overruns
        clock = t0  # this prompt's time; env.now catches up at the end
        gen = decode(policy, PromptInfo(rp.prompt_id, pl, end, rp.budget, replay=rp if policy.needs_future else None,
                                        stop=rp.stop))
        send, signals, draft_until = gen.send, rp.signals, rp.draft_until
        answer = None
        unpaid = 0  # tokens drafted since the last target forward, not yet priced
        unpaid_start, unpaid_layer = 0, NO_LAYER
        target_calls = accepted_total = drafted = verified = looked_up = 0
        # hot-path locals: one target row per verify size, cumulative draft-step times, histograms
        # a policy that never drafts (AD) runs plain decoding steps, the baseline's own price
        rows = grid.target_rows(corun=False) if policy.drafts else {1: grid.target_step_row()}
        cum = grid.draft_cumulative(NO_LAYER, False)
        last_ctx = len(cum) - 1
        pcum, prows, max_context = grid.draft_cumulative(NO_LAYER, corun), grid.target_rows(corun), grid.max_context
        path_run, path_accept = rp.draft.run, rp.draft.accept  # a parallel round's drafts are the draft model's
        new_tuple = tuple.__new__
        parallel_rounds = 0
        checked_hist, accepted_hist = positions.checked_hist, positions.accepted_hist
        drafts_before = positions.drafting_rounds()
        trees = TreeRounds(rp)  # the current tree round's recorded nodes
        cache = DraftCache(pl)  # what the drafts' KV caches hold: a round's first draft forward feeds the rest
        cache_draft, cache_crop = cache.draft, cache.crop
        catch_up = grid.catch_up_row(2)  # the common case: two tokens after a fully accepted round
        note_verify, note_draft, note_parallel, stride = log.verify.append, log.drafts.extend, log.parallel.extend, log.STRIDE
        while True:
            try:
                req = send(answer)
            except StopIteration as stop:
                end = stop.value  # the tokens committed: the prompt's end unless the policy stopped first
                if tokens is not None and len(tokens) > end - 1:  # an engine that cuts its output there (vllm)
                    del tokens[end - 1:]
                break
            kind = type(req)
            if kind is DraftRun:
                answer = SignalRun(rp, req.start, req.count, req.layer)
                unpaid, unpaid_start = req.count, req.start
                unpaid_layer = NO_LAYER if req.layer is None else req.layer
                continue
            if kind is DraftLoop:
                # the replay drafts and asks the policy in one frame (a fixed plan: DraftLoop.run);
                # the request's fields unpacked at once, not read one attribute at a time
                start, cap, layer, on_draft, stop_at_end, stops = req
                if stops is not None:  # a stop rule: False drafts on
                    drafted_now, said = draft_until(start, layer, cap, stops, stop_at_end)
                    answer = drafted_now, DRAFT if said is False else VERIFY
                elif on_draft is not None:  # None: the end token stopped it
                    drafted_now, said = draft_until(start, layer, cap, on_draft, stop_at_end, DRAFT)
                    answer = drafted_now, VERIFY if said is None else said
                else:
                    answer = req.run(signals(start, layer))
                unpaid += len(answer[0])
                unpaid_start, unpaid_layer = start, NO_LAYER if layer is None else layer
                continue
            if kind is ExpandTree:
                answer = trees.expand(req)
                continue
            if kind is VerifyTree:
                answer, clock = _verify_tree(clock, grid, rp, req, draft_dev, target_dev, counts, positions, tokens,
                                             cache, trees, log)
                continue
            if kind is Propose:  # a lookup over the tokens a decoder holds: the prompt and those committed
                c, cap, propose, lookup_seconds = req
                context = rp.tokens[:pl + c]
                answer = tuple(propose(context, cap))[:cap]
                if cap:  # a prompt's settle (cap 0) is not priced: nothing waits on it
                    clock = draft_dev.book(clock, lookup_seconds(pl + c), "lookup", c, len(answer))
                continue
            if kind is VerifyTokens:
                c, proposed = req
                k, target = len(proposed), rp.target_tokens
                limit = min(k, end - c - 1)  # the end token is always the target's (see rounds.py)
                accepted = 0
                while accepted < limit and proposed[accepted] == target[c + accepted]:
                    accepted += 1
                row = rows.get(k + 1) or grid.target_row(k + 1)
                clock = target_dev.book(clock, row[pl + c], "verify", c, k + 1, accepted)
                note_verify((k + 1) * stride + pl + c)
                if cache.most > pl + c + accepted:
                    cache_crop(pl + c + accepted)
                target_calls += 1
                looked_up += k  # drafted tokens, but no draft forward ran for them
                verified += k
                accepted_total += accepted
                checked_hist[accepted + 1 if accepted < k else k] += 1
                accepted_hist[accepted] += 1
                if tokens is not None:
                    tokens.extend(target[c : c + accepted + 1])
                answer = accepted
                continue
            if unpaid:  # the serial drafting that led to this forward
                ctx = pl + unpaid_start
                if unpaid_layer == NO_LAYER and ctx + unpaid <= last_ctx:
                    seconds = cum[ctx + unpaid] - cum[ctx]
                else:
                    seconds = grid.draft_seconds(ctx, unpaid, unpaid_layer)
                feed = cache_draft(unpaid_layer, ctx, unpaid)
                if feed > 1:  # the first step feeds what the draft's cache lacks (draft_cache.py)
                    if feed == 2 and unpaid_layer == NO_LAYER:
                        seconds += catch_up[ctx]
                    else:
                        seconds += grid.catch_up_seconds(ctx, feed, unpaid_layer)
                clock = draft_dev.book(clock, seconds, "draft", unpaid_start, unpaid, None, feed)
                note_draft((unpaid_layer, ctx, unpaid, feed))
                drafted += unpaid
                unpaid = 0
            if kind is Verify:
                c, k, layer = req
                path = rp.draft if layer is None else rp.path(layer)
                accepted = path.run[c]
                if accepted > k:
                    accepted = k
                if accepted >= end - c:  # the end token is always the target's (see rounds.py)
                    accepted = end - c - 1
                row = rows.get(k + 1) or grid.target_row(k + 1)
                clock = target_dev.book(clock, row[pl + c], "verify", c, k + 1, accepted)
                note_verify((k + 1) * stride + pl + c)
                if cache.most > pl + c + accepted:  # else no cache holds more: cropping would change nothing
                    cache_crop(pl + c + accepted)
                target_calls += 1
                verified += k
                accepted_total += accepted
                checked_hist[accepted + 1 if accepted < k else k] += 1
                accepted_hist[accepted] += 1
                if tokens is not None:
                    tokens.extend(rp.token_at(t, t < c + accepted, layer) for t in range(c, c + accepted + 1))
                answer = accepted
            elif kind is ParallelRound:
                # both forwards start at ``clock``; the round ends with the later one. Priced with
                # the topology's draft steps and target rows, looked up as a serial round's are (the
                # same floats as ``draft_seconds`` and ``target_forward``). The draft's first step
                # feeds what its cache lacks; unless the first new draft is accepted (its drafts go
                # on), the draft's cache is cropped to the committed prefix, as the live decoder does.
                c, m, s = req
                accepted = path_run[c]
                if accepted > m:
                    accepted = m
                if accepted > end - 1 - c:  # the end token is always the target's (see rounds.py)
                    accepted = end - 1 - c
                first_new = accepted == m and c + m < end - 1 and path_accept[c + m]
                ctx = pl + c
                start = ctx + m
                if start + s <= max_context:  # as draft_seconds decides
                    seconds = pcum[start + s] - pcum[start]
                else:
                    seconds = grid.draft_seconds(start, s, NO_LAYER, corun)
                feed = cache_draft(NO_LAYER, start, s)
                if feed > 1:
                    seconds += grid.catch_up_seconds(start, feed, NO_LAYER, corun)
                if not first_new:
                    cache_crop(ctx + accepted, NO_LAYER)
                draft_end = draft_dev.book(clock, seconds, "draft (parallel)", c + m, s, None, feed)
                row = prows.get(1 + m) or grid.target_row(1 + m, corun)
                clock = target_dev.book(clock, row[ctx], "verify (parallel)", c, 1 + m, accepted + first_new)
                note_parallel((start, s, feed, 1 + m, ctx))
                if draft_end > clock:
                    clock = draft_end
                target_calls += 1
                drafted += s
                verified += m + 1
                accepted_total += accepted + first_new
                parallel_rounds += 1
                checked_hist[accepted + 1 if accepted < m else m + 1] += 1
                accepted_hist[accepted + first_new] += 1
                if tokens is not None:
                    tokens.extend(rp.token_at(t, t < c + accepted + first_new) for t in range(c, c + accepted + 1))
                # tuple.__new__: the named tuples without their Python-level __new__ (every field given), as in decode()
                answer = new_tuple(ParallelResult, (accepted, first_new, new_tuple(SignalRun, (rp, c, s, None, m + 1))))
            elif kind is Shadow:  # DEL's shadow tokens: an exit head per layer over the settled positions
                answer = rp.shadows(req.start, req.count)
                if heads:
                    clock = target_dev.book(clock, grid.shadow_seconds(req.count, heads), "shadow", req.start,
                                            req.count)
                    log.shadows.append(req.count)
            else:  # pragma: no cover - decode() yields only the types above
                raise TypeError(f"unknown request {req!r}")
        if clock > env.now:
            yield env.timeout(clock - env.now)
        counts.target_calls += target_calls
        counts.accepted += accepted_total
        counts.drafted += drafted + looked_up
        counts.verified += verified
        counts.draft_calls += drafted
        counts.parallel_rounds += parallel_rounds
        counts.tokens += end - 1
        counts.wall_time_s += env.now - t0
        counts.ad_wall_time_s += ad_seconds(grid, pl, end)
        counts.draft_busy_s += draft_dev.busy_s
        counts.target_busy_s += target_dev.busy_s
        counts.rollout_overruns += rp.rollout_overruns - overruns_before
        counts.num_drafts += positions.drafting_rounds() - drafts_before
        run.slices = draft_dev.slices + target_dev.slices


def _verify_tree(clock: float, grid: LatencyGrid, rp: PromptReplay, req: VerifyTree, draft_dev: Device,
                 target_dev: Device, counts: Counts, positions: PositionStats,
                 tokens: list[int] | None, cache: DraftCache, trees: TreeRounds, log: ForwardLog) -> tuple[int, float]:
    """Draft forwards over ``req.widths`` nodes per level, then one target forward over the tree;
    the accepted path and the draft cache's account are :meth:`TreeRounds.settle`'s."""
    c, tree, widths = req.start, req.tree, req.widths
    ctx = rp.prompt_len + c
    n = tree.size
    accepted, feed = trees.settle(req, cache)
    if widths:
        seconds = grid.tree_draft_seconds(ctx, widths)
        if feed > 1:
            seconds += grid.catch_up_seconds(ctx, feed)
        clock = draft_dev.book(clock, seconds, "draft", c, n, None, feed)
    clock = target_dev.book(clock, grid.target_tree(n + 1, ctx), "verify", c, n + 1, accepted)
    log.trees.append((ctx, tuple(widths), feed, n + 1))
    counts.target_calls += 1
    counts.accepted += accepted
    counts.drafted += n
    counts.draft_calls += len(widths)
    depth = tree.depth
    positions.add(accepted + 1 if accepted < depth else depth, accepted)
    if tokens is not None:
        tokens.extend(rp.target_tokens[c : c + accepted + 1])
    return accepted, clock

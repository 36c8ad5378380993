"""One vLLM engine step's price: a forward over every token the scheduler scheduled, by token count.

vLLM 0.32.0's V1 engine runs one model forward per step over the step's scheduled tokens, whatever
they are: prompt chunks, each decoding request's last token and its K drafts, side by side in one
flattened batch (``vllm/v1/worker/gpu_model_runner.py``, ``execute_model``; the scheduler's
``num_scheduled_tokens``, ``vllm/v1/core/sched/scheduler.py``). With ``draft_model`` speculation
the draft then proposes for every request of the step (``vllm/v1/spec_decode/llm_base_proposer.py``,
``propose``): a first forward over the step's tokens plus one slot a request
(``set_inputs_first_pass``; ``SpeculativeConfig.max_num_new_slots_for_drafting`` is 1 for a draft
model), then K − 1 one-token forwards over the step's B requests (the loop
``for token_index in range(self.num_speculative_tokens - 1)``). So a step of T scheduled tokens
over B requests costs

    step(T, B) = G(T) + (K − 1) · D(B)

where G(T) is the target's forward and the draft's first pass over T tokens and D(B) the draft's
one-token forward over B requests. The rule for G (:data:`RULE`), read from a trace's own samples
(``simlab vllm record``, :mod:`simlab.engines.vllm.steps`): every measured step is a point
(tokens, seconds) — a verification of B requests, B·(K + 1) tokens, at
``target_forward(K + 1) + draft_step`` of that batch size (the trace's verification is the step
less K draft steps: adding one back gives the forward and the first pass); a prefill of one
prompt of P tokens alone at ``target_prefill(P) + draft_prefill(P)`` — and G is linear in T
between the points, past the largest the last segment's slope (never downwards), as a
single-sequence forward is priced in k (:func:`~simlab.latency.model._interp_k`). On a CPU a
forward is compute-bound and what it costs is its tokens; the attention over each request's own
context is in the points' context (a verification's point is read at the step's mean context, a
prefill's at 0); where the table timed one sequence's forward over other token counts (simlab's own
recorder times k = 1..8), those are points too. A batch size the trace timed at more than one K
(``simlab vllm record --k 1,4``: the K of a dynamic-speculation table) prices its steps from its own
verifications, linear in T between them: without them a step of B requests verifying 1 draft each
is priced from the points of fewer requests with more tokens, which on a CPU misses each request's
own cost (results/vllm, ``smollm2-serve-table24``: 16-31% short). D(B) is the measured batched draft step (:meth:`BatchLatency.draft`). Without
speculation a step is the target's forward alone, its points the plain steps of B requests
(T = B, ``target_step``) and the prefills (``target_prefill``).

At B = 1 with K drafts this is the single-request simulator's round: ``target_forward(K + 1)`` +
K draft steps. A step whose T lies past the largest measured point is counted as priced past the
measured (:mod:`simlab.latency.priced`, the batch bit).
"""

from __future__ import annotations

from simlab.latency.batch import BatchLatency
from simlab.latency.coverage import BATCH
from simlab.latency.model import _interp_k

RULE = ("vLLM steps priced by their scheduled tokens: one forward of the target and the draft's first pass over "
        "the step's T tokens, linear in T between the trace's measured steps (verifications of B requests x (K+1) "
        "tokens, prefills of one prompt), past the largest its last slope; plus K-1 one-token draft forwards over "
        "the step's requests (the measured batched draft step)")


class VllmStepPrice:
    """The price of a vLLM step (module docstring) on one trace's batched latencies."""

    def __init__(self, batch: BatchLatency, k: int):
        """``k``: the server's ``num_speculative_tokens`` (0: a server without speculation)."""
        self.batch = batch
        self.k = k
        model = batch.grid.model
        prefills = getattr(model, "prefills", None) or {}
        # the timed prefills' lengths; their price is the model's (target, and the draft's first pass)
        self.prefill_lens = tuple(sorted(prefills.get("target", {})))
        self.measured_ks = tuple(sorted((getattr(model, "target", None) or {}).get(False, {})))
        # a trace recorded from vLLM: its target forward holds the draft's first pass (steps.py)
        self.feeds_draft = bool(getattr(model, "verify_feeds_draft", False))
        self.largest = 0  # the most tokens a measured point holds, at the last pricing

    def _points(self, ctx: int) -> dict[int, float]:
        k, model = self.k, self.batch.grid.model
        points = {}
        for b, grid in self.batch.grids.items():
            if k:
                points[b * (k + 1)] = grid.target_forward(k + 1, ctx) + grid.draft_step(ctx)
            else:
                points[b] = grid.target_step(ctx)

        # one sequence's forwards of other token counts, where the table timed them (a trace of
        # simlab's own recorder: its target forwards over k tokens; the target alone there, so the
        # plain server's too)
        grid = self.batch.grid
        for n in self.measured_ks:
            if k and n not in points:
                points[n] = grid.target_forward(n, ctx) + grid.draft_step(ctx)
            elif not k and n > 1 and not self.feeds_draft:
                points.setdefault(n, grid.target_forward(n, ctx))
        for p in self.prefill_lens:
            target = model.prefill(p, 0)
            points[p] = target + ((model.prefill(p, 0, draft=True) or 0.0) if k else 0.0)
        return points

    def _own_points(self, requests: int, ctx: int) -> dict[int, float] | None:
        """A batch size's own verifications, where the trace timed it at more than one K (``simlab
        vllm record --k 1,4``: the K of a dynamic-speculation table): tokens -> the forward and the
        first pass; None where it did not (the token rule over every batch size's points prices it)."""
        grid = self.batch.grids.get(requests)
        if not self.k or requests < 2 or grid is None:
            return None
        timed = sorted((getattr(grid.model, "target", None) or {}).get(False, {}))
        if len(timed) < 2:
            return None
        return {requests * n: grid.target_forward(n, ctx) + grid.draft_step(ctx) for n in timed}

    def forward(self, tokens: int, ctx: int, requests: int = 1) -> float:
        """G(T): the step's forward over ``tokens`` scheduled tokens (with speculation, the draft's
        first pass too), the requests' mean context ``ctx``; a step of ``requests`` requests whose
        batch size was timed at several K, from that batch size's own points (:meth:`_own_points`)."""
        points = self._points(ctx)
        self.largest = max(points)
        own = self._own_points(requests, ctx)
        if own:  # its own verifications, and past them the larger points (prefills: a chunk beside decodes)
            points = {**{t: v for t, v in points.items() if t > max(own)}, **own}
        ts = tuple(sorted(points))
        return float(_interp_k(tokens, ts, [points[t] for t in ts]))

    def step(self, tokens: int, requests: int, ctx: int, k: int) -> float:
        """One step: ``tokens`` scheduled over ``requests`` requests at mean context ``ctx``, the
        draft proposing ``k`` tokens a request for the next step (0: no speculation)."""
        seconds = self.forward(tokens, ctx, requests)
        if k > 1:
            seconds += (k - 1) * self.batch.draft([1] * requests, [ctx] * requests)
        return seconds

    def bits(self, tokens: int) -> int:
        """The rule bits of the last :meth:`step` (:mod:`simlab.latency.coverage`): the batch bit
        past the largest measured point."""
        return BATCH if tokens > self.largest else 0

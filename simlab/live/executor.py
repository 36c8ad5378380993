"""The live executor: real models answer the requests of :func:`simlab.policies.rounds.decode`.

It is the simulator's twin. Both drive the same protocol loop with the same policy object;
where the simulator looks a drafted token's signal and its acceptance up in a trace, this
executor runs the draft and the target:

- draft steps: one forward of the draft over the tokens its KV cache lacks (the last committed
  token, once more after a rejection or a bonus token), then one token per step;
- verification: one target forward over the last committed token and the drafts; greedy
  acceptance is the longest prefix where the draft's token is the target's argmax; with
  temperature > 0, speculative sampling (accept x with probability min(1, p(x)/q(x)); on
  rejection sample norm(max(0, p - q)); a bonus token from p when all are accepted —
  Leviathan et al. 2023, arXiv:2211.17192; SPIDE eq. 1);
- rollback: both KV caches are cropped to the committed prefix (transformers >= 5:
  ``DynamicCache.crop`` takes the negative number of tokens to remove);
- tree rounds: the draft expands a tree one forward per level over the nodes it grows, the
  target verifies every node in one forward, each under a tree attention mask with position ids
  by depth (:mod:`simlab.trees.attention`), and both caches keep only the accepted path's
  entries. Greedy acceptance takes the longest path of nodes that are the target's argmax. At
  temperature > 0 the path is chosen by SpecInfer's multi-step speculative sampling (Miao et al.,
  "SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative Inference
  and Verification", ASPLOS 2024, arXiv:2305.09781, Algorithm 2, VerifyStochastic): at a node,
  its children are tried in order, each accepted with probability min(1, p(x)/q(x)) where q is
  the distribution that child was drafted from; a rejection turns p into norm(max(0, p - q))
  for the next child; when every child is rejected the round's last token is drawn from what p
  has become (from p itself after an accepted leaf). This is lossless only if each child, given
  everything drafted and judged before it, was drawn from the q it is judged with, so the
  drafting differs by tree kind (:meth:`LiveExecutor._verify_tree`);
- shadow tokens (DEL): after the prefill and after each serial verification, every exit layer's
  token at the positions that forward settled: the target's hidden state after each layer of
  :func:`~simlab.common.signals.shadow_layers`, those rows only, through the final norm and the LM head
  (:func:`~simlab.record.forward.shadow_tokens`), timed as one ``shadow`` entry of the decode log;
- parallel rounds (PEARL, SPIDE): the draft drafts while the target verifies, in two threads
  with one intra-op thread each on CPU (on 2 cores this overlap took 0.74x the time of running
  them one after the other, Qwen pair), restoring the full thread count afterwards.

The end of a prompt follows :mod:`simlab.policies.rounds`: drafts are capped by the budget, and when
the target's end token appears the executor lowers ``PromptInfo.n_tokens`` and counts that
token as the target's, exactly as the simulator does.

Every forward is timed with a monotonic clock (``time.perf_counter``; on CUDA after a
synchronize) and logged with its device, so measured and simulated timelines can be compared.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import count

import torch

from simlab.common.errors import SimlabError
from simlab.common.metrics import Counts, PositionStats
from simlab.common.signals import ShadowTokens, TokenSignal, shadow_layers
from simlab.models.kv_cache import cache_kwargs, cache_of
from simlab.policies.base import Policy, PromptInfo
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
from simlab.trees.attention import LiveTree, keep_entries, verify_inputs
from simlab.trees.draft_tree import ROOT


@dataclass
class Forward:
    """One timed model forward, for the decode log."""

    device: str  # "draft" or "target"
    what: str  # "prefill", "draft", "verify", "draft (parallel)", "verify (parallel)", "shadow"
    start: float  # seconds since the prompt's decode phase began (negative for prefills)
    end: float
    tokens: int  # new tokens fed (a shadow read: the rows each exit head runs over)
    position: int  # first generated position this forward concerns


@dataclass
class LiveRun:
    """One decoded prompt."""

    prompt_id: int
    tokens: list[int]  # every generated token, position 0 (from the prefill) first
    counts: Counts
    forwards: list[Forward] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    positions: PositionStats = field(default_factory=PositionStats)  # tallied as the simulator does
    other_cpu: float | None = None  # share of the machine's CPU others took during the decode


def crop_to(cache, length: int) -> None:
    """Keep the first ``length`` positions of a transformers KV cache."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def signal_of(logits: torch.Tensor, index: int, end: bool = False) -> TokenSignal:
    """Confidence (top-1 probability, SPIDE eq. 2) and entropy (nats) of raw-softmax logits;
    ``end``: the drafted token is an end token."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    return TokenSignal(index, float(p.max()), float(-(p * logp).sum()), math.nan, end)


class _Model:
    """A causal LM with its own KV cache and a count of the tokens that cache holds."""

    def __init__(self, model, name: str, sync):
        self.model, self.name, self.sync = model, name, sync
        self.cache = None
        self.length = 0

    @torch.inference_mode()
    def forward(self, ids: list[int], hidden: bool = False, tree: tuple | None = None) -> torch.Tensor:
        """Feed ``ids`` after the cached prefix; return logits for each fed position (len(ids), V).
        With ``hidden``, every layer's hidden states at those positions are kept in ``hidden``.
        ``tree``: the (4-D mask, position ids) of a forward over tree nodes (:mod:`simlab.trees.attention`)."""
        device = self.model.device
        x = torch.tensor([ids], device=device)
        mask, positions = tree if tree is not None else (None, None)
        out = self.model(input_ids=x, **cache_kwargs(self.model, self.cache), use_cache=True,
                         output_hidden_states=hidden, attention_mask=mask, position_ids=positions)
        self.cache = cache_of(out)
        self.length += len(ids)
        self.hidden = tuple(h[0] for h in out.hidden_states) if hidden else None
        self.sync()
        return out.logits[0]

    def crop(self, length: int) -> None:
        if length < self.length:
            crop_to(self.cache, length)
            self.length = length

    def keep(self, entries: list[int]) -> None:
        """Keep only the cache entries at ``entries`` (:func:`keep_entries`)."""
        keep_entries(self.cache, entries)
        self.length = len(entries)


class LiveExecutor:
    """Decode prompts for real under a policy; see the module docstring."""

    def __init__(self, draft, target, eos_token_ids: list[int], temperature: float = 0.0, seed: int = 0,
                 threads: int | None = None, exit_layers: list[int] | None = None):
        """``exit_layers``: for self-speculative decoding (``draft`` is an early exit of
        ``target``), the layers whose early-exit drafts and shadow tokens policies may ask for."""
        self.draft_model, self.target_model = draft, target
        self.exit_layers = list(exit_layers) if exit_layers is not None else None
        self._layer_drafts: dict[int, object] = {}
        self.eos = set(int(t) for t in eos_token_ids)
        self.temperature = float(temperature)
        self.generator = torch.Generator().manual_seed(seed)
        self.threads = threads or torch.get_num_threads()
        cuda = any(p.is_cuda for p in target.parameters())
        self._sync = torch.cuda.synchronize if cuda else (lambda: None)
        self._cuda = cuda
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="simlab-live")

    # -- sampling -------------------------------------------------------------------------

    def _dist(self, logits: torch.Tensor) -> torch.Tensor:
        """The decoding distribution at the executor's temperature; greedy decoding needs only
        the argmax, so at temperature 0 the logits themselves stand for it."""
        if self.temperature == 0:
            return logits
        return torch.softmax(logits.float() / self.temperature, dim=-1)

    def _pick(self, dist: torch.Tensor) -> int:
        if self.temperature == 0:
            return int(dist.argmax())
        return self._draw(dist)

    def _accepts(self, p: torch.Tensor, q: torch.Tensor | None, token: int) -> bool:
        if self.temperature == 0:
            return int(p.argmax()) == token
        return self._coin(min(1.0, float(p[token]) / max(float(q[token]), 1e-30)))

    # The only two random draws of speculative sampling. Everything else is a deterministic
    # function of their outcomes, so a test that replaces these two with an enumeration of all
    # outcomes (tests/test_live_sampling.py) obtains the exact distribution of what the
    # executor emits, and checks that it is the target's.

    def _draw(self, dist: torch.Tensor) -> int:
        """A token drawn from the distribution ``dist``."""
        return int(torch.multinomial(dist.cpu(), 1, generator=self.generator))

    def _coin(self, prob: float) -> bool:
        """True with probability ``prob``."""
        return float(torch.rand((), generator=self.generator)) <= prob

    def _correction(self, p: torch.Tensor, q: torch.Tensor | None) -> int:
        """The target's own token: after a rejection from norm(max(0, p - q)), else from p."""
        return self._pick(self._residual(p, q))

    def _residual(self, p: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
        """The target's distribution once it has rejected a draft drawn from ``q``:
        norm(max(0, p - q)) (p where nothing is left, which a rejection then had probability 0;
        p itself without a ``q``, and under greedy decoding, whose argmax a rejection leaves)."""
        if self.temperature == 0 or q is None:
            return p
        residual = torch.clamp(p - q, min=0)
        total = float(residual.sum())
        return residual / total if total > 0 else p

    # -- one prompt -----------------------------------------------------------------------

    def run(self, policy: Policy, prompt_id: int, prompt_ids: list[int], budget: int) -> LiveRun:
        """Decode one prompt of ``budget`` new tokens at most; prefills are timed but not counted."""
        draft = _Model(self.draft_model, "draft", self._sync)
        target = _Model(self.target_model, "target", self._sync)
        pl = len(prompt_ids)
        forwards: list[Forward] = []
        shadows = policy.needs_shadows
        origin = time.perf_counter()
        logits = self._timed(forwards, origin, target, "prefill", prompt_ids, 0, hidden=shadows)
        first = self._pick(self._dist(logits[-1]))
        self._timed(forwards, origin, draft, "prefill", prompt_ids, 0)
        out = [first]
        run = LiveRun(prompt_id, out, Counts(), forwards)
        info = PromptInfo(prompt_id, pl, 1 if first in self.eos else budget, budget)
        state = _PromptState(out=out, pl=pl, prompt=list(prompt_ids), models={None: draft}, run=run,
                             shadows=shadows, shadow_start=-pl + 1)
        t0 = time.perf_counter()
        for f in forwards:  # prefills happened before the decode phase
            f.start -= t0 - origin
            f.end -= t0 - origin
        self._origin = t0
        gen = decode(policy, info)
        answer = None
        while True:
            try:
                req = gen.send(answer)
            except StopIteration:
                break
            kind = type(req)
            if kind is DraftLoop:
                model = self._draft_model(state, req.layer)
                answer = req.run(self._draft_step(state, model, forwards, req.start, i).signal for i in count(1))
            elif kind is DraftRun:
                model = self._draft_model(state, req.layer)
                answer = SignalList(self._draft_step(state, model, forwards, req.start, i)
                                    for i in range(1, req.count + 1))
            elif kind is Verify:
                k = req.drafts
                answer = self._verify(state, target, forwards, info, req.start, state.drafts[:k] if k else [],
                                      state.q[:k] if k else [], run)
            elif kind is Propose:
                answer = self._propose(state, forwards, req)
            elif kind is VerifyTokens:
                tokens = list(req.tokens)
                answer = self._verify(state, target, forwards, info, req.start, tokens, self._certain(target, tokens),
                                      run)
                run.counts.drafted += len(tokens)  # drafted, but by no draft forward
            elif kind is ParallelRound:
                answer = self._parallel(state, draft, target, forwards, info, req, run)
            elif kind is Shadow:
                answer = self._shadows(state, target, forwards, req)
            elif kind is ExpandTree:
                if req.depth == 1:
                    state.tree = None
                answer = self._expand_tree(state, draft, forwards, req.start, req.expand, req.topk)
            elif kind is VerifyTree:
                answer = self._verify_tree(state, draft, target, forwards, info, req, run)
            else:  # pragma: no cover
                raise TypeError(f"unknown request {req!r}")
        wall = time.perf_counter() - t0
        del out[info.n_tokens:]
        c = run.counts
        c.tokens = len(out) - 1
        c.wall_time_s = wall
        c.draft_busy_s = sum(f.end - f.start for f in forwards if f.device == "draft" and f.what != "prefill")
        c.target_busy_s = sum(f.end - f.start for f in forwards if f.device == "target" and f.what != "prefill")
        return run

    def _timed(self, forwards, origin, model: _Model, what: str, ids: list[int], position: int,
               hidden: bool = False, tree: tuple | None = None) -> torch.Tensor:
        start = time.perf_counter()
        logits = model.forward(ids, hidden, tree)
        end = time.perf_counter()
        forwards.append(Forward(model.name, what, start - origin, end - origin, len(ids), position))
        return logits

    def _draft_step(self, state: "_PromptState", draft: _Model, forwards, start: int, index: int,
                    what: str = "draft") -> "LazySignal":
        """Draft the ``index``-th token of a run from committed position ``start``; its signal is
        computed only if the policy reads it (a fixed-length policy never does)."""
        if index == 1 and what == "draft":
            state.drafts, state.q = [], []
        known = state.prompt + state.out + state.drafts  # prompt, committed tokens, this run's drafts
        feed = known[draft.length:]  # what this draft's KV cache lacks (more for a fresh exit layer)
        logits = self._timed(forwards, self._origin, draft, what, feed, start + index - 1)[-1]
        state.run.counts.draft_calls += 1
        state.run.counts.drafted += 1
        q = self._dist(logits)
        token = self._pick(q)
        state.drafts.append(token)
        state.q.append(q)
        return LazySignal(logits, index, token in self.eos)

    def _settle(self, state: "_PromptState", info: PromptInfo, c: int, emitted: list[int], accepted: int) -> int:
        return settle(state.out, self.eos, info, c, emitted, accepted)

    def _draft_model(self, state: "_PromptState", layer: int | None) -> _Model:
        """The draft of a serial round: the session's draft, or an early exit at ``layer``."""
        model = state.models.get(layer)
        if model is None:
            if self.exit_layers is None:
                raise SimlabError(f"the policy drafts with exit layer {layer}: live decoding needs a "
                                  "self-speculative session (--draft-layer instead of --draft)")
            if layer not in self._layer_drafts:
                from simlab.models.early_exit import early_exit_draft

                self._layer_drafts[layer] = early_exit_draft(self.target_model, layer)
            model = state.models[layer] = _Model(self._layer_drafts[layer], "draft", self._sync)
        return model

    def _shadows(self, state: "_PromptState", target: _Model, forwards, req: Shadow) -> ShadowTokens:
        """Every exit layer's token at the positions the last target forward settled (DEL §4.2):
        the target's hidden state after layer l at those positions only (not the forward's other
        rows: drafts it rejected, or the prompt of a prefill), through the final norm and the LM
        head. Timed as one ``shadow`` forward of the target, which the simulator prices alike
        (:func:`~simlab.sim.executor.shadow_heads`)."""
        from simlab.record.forward import n_layers, shadow_tokens

        start = time.perf_counter()
        first = req.start - state.shadow_start
        hidden = tuple(h[first:first + req.count] for h in target.hidden)
        truth = state.out[req.start:req.start + req.count]
        matches, confidence = {}, {}
        with torch.inference_mode():
            for layer in shadow_layers(self.exit_layers, n_layers(self.target_model)):
                top, tokens = shadow_tokens(self.target_model, hidden[layer])
                matches[layer] = [int(t) == y for t, y in zip(tokens.tolist(), truth)]
                confidence[layer] = top.tolist()
        self._sync()
        forwards.append(Forward("target", "shadow", start - self._origin, time.perf_counter() - self._origin, req.count,
                                req.start))
        return ShadowTokens.read(req.start, matches, confidence)

    def _propose(self, state: "_PromptState", forwards, req: Propose) -> tuple[int, ...]:
        """A lookup over the prompt and the committed tokens, nothing else, timed on the host as a
        ``lookup`` of the draft's log (a prompt's settle, cap 0, is neither timed nor logged)."""
        context = state.prompt + state.out
        start = time.perf_counter()
        proposal = tuple(req.propose(context, req.cap))[:req.cap]
        end = time.perf_counter()
        if req.cap:
            forwards.append(Forward("draft", "lookup", start - self._origin, end - self._origin, len(proposal),
                                    req.start))
        return proposal

    def _certain(self, target: _Model, tokens: list[int]) -> list[torch.Tensor | None]:
        """The distributions looked-up tokens were drawn from: certainty, so that speculative
        sampling accepts token x with probability p(x) and corrects from norm(max(0, p - onehot))
        (greedy decoding reads none)."""
        if self.temperature == 0:
            return [None] * len(tokens)
        vocab = self.target_model.get_output_embeddings().weight.shape[0]
        return [torch.nn.functional.one_hot(torch.tensor(t), vocab).float() for t in tokens]

    def _verify(self, state, target: _Model, forwards, info: PromptInfo, c: int, drafts: list[int],
                qs: list, run: LiveRun) -> int:
        """One target forward over the last committed token and ``drafts`` (drawn from ``qs``)."""
        k = len(drafts)
        feed = state.out[target.length - state.pl:] + drafts
        state.shadow_start = c
        logits = self._timed(forwards, self._origin, target, "verify", feed, c, hidden=state.shadows)[-(k + 1):]
        accepted, emitted = self._judge(logits, drafts, qs)
        accepted = self._settle(state, info, c, emitted, accepted)
        committed = c + accepted + 1
        target.crop(state.pl + committed - 1)
        for model in state.models.values():
            model.crop(state.pl + committed - 1)
        state.drafts, state.q = [], []
        run.counts.target_calls += 1
        run.counts.accepted += accepted
        run.counts.num_drafts += k > 0
        run.positions.add(accepted + 1 if accepted < k else k, accepted)
        run.rounds.append({"mode": "serial", "start": c, "drafted": k, "accepted": accepted})
        return accepted

    def _judge(self, logits: torch.Tensor, drafts: list[int], qs: list[torch.Tensor],
               bonus: bool = True) -> tuple[int, list[int]]:
        """Check drafts in order against the target's logits (row j judges draft j).

        Returns the number accepted and the tokens to emit: the accepted drafts, then the
        correction at the first rejection, or (``bonus``) the target's token after them all.
        """
        for j, tok in enumerate(drafts):
            p = self._dist(logits[j])
            if not self._accepts(p, qs[j], tok):
                return j, drafts[:j] + [self._correction(p, qs[j])]
        tail = [self._correction(self._dist(logits[len(drafts)]), None)] if bonus else []
        return len(drafts), list(drafts) + tail

    def _parallel(self, state, draft: _Model, target: _Model, forwards, info: PromptInfo, req: ParallelRound,
                  run: LiveRun) -> ParallelResult:
        c, m, s = req.start, req.pending, req.window
        pending, pending_q = state.drafts[:m], state.q[:m]
        feed = state.out[target.length - state.pl:] + pending
        state.drafts, state.q = list(pending), list(pending_q)

        def drafting() -> SignalList:
            return SignalList(self._draft_step(state, draft, forwards, c, m + j, "draft (parallel)")
                              for j in range(1, s + 1))

        def verifying() -> torch.Tensor:
            return self._timed(forwards, self._origin, target, "verify (parallel)", feed, c)[-(m + 1):]

        with _intra_op_threads(1 if not self._cuda else self.threads):
            new_future = self._pool.submit(drafting)
            logits = self._pool.submit(verifying).result()
            new = new_future.result()
        new_tokens, new_q = state.drafts[m:], state.q[m:]
        accepted, emitted = self._judge(logits, pending, pending_q, bonus=False)
        first_new = False
        if accepted == m:  # all pending accepted: check the first new draft against p at c + m
            p = self._dist(logits[m])
            first_new = self._accepts(p, new_q[0], new_tokens[0])
            emitted = list(pending) + ([new_tokens[0]] if first_new else [self._correction(p, new_q[0])])
        n_ok = self._settle(state, info, c, emitted, accepted + first_new)
        first_new = first_new and n_ok == m + 1
        accepted = min(accepted, n_ok)
        committed = len(state.out)
        target.crop(state.pl + committed - 1)
        if first_new:
            state.drafts, state.q = new_tokens[1:], new_q[1:]
        else:
            state.drafts, state.q = [], []
            draft.crop(state.pl + committed - 1)
        run.counts.target_calls += 1
        run.counts.accepted += accepted + first_new
        run.counts.parallel_rounds += 1
        run.counts.num_drafts += 1  # the first new draft, at least, was checked
        run.positions.add(accepted + 1 if accepted < m else m + 1, accepted + first_new)
        run.rounds.append({"mode": "parallel", "start": c, "drafted": s, "accepted": accepted + first_new})
        return ParallelResult(accepted, first_new, new)

    def _expand_tree(self, state: "_PromptState", draft: _Model, forwards, start: int, expand: tuple[int, ...],
                     topk: int) -> tuple[tuple[int, int, float], ...]:
        """One draft forward of a tree round: the top-``topk`` children of every candidate of
        ``expand`` (``(ROOT,)``: the committed prefix, which starts the round's tree), answered
        as the simulator answers (:func:`simlab.sim.executor._expand`): (parent, rank,
        probability) in the order of ``expand``, then rank; probabilities are the recorder's
        (float32 raw softmax, :func:`~simlab.record.tree_expansion.top_k`)."""
        from simlab.record.tree_expansion import top_k

        logits, tree = self._tree_forward(state, draft, forwards, start, expand)
        best = top_k(logits, topk)
        answer = []
        for j, e in enumerate(expand):
            for rank in range(topk):
                tree.add(e, rank, int(best.token[j, rank]))
                answer.append((e, rank, float(best.prob[j, rank])))
        return tuple(answer)

    def _sample_children(self, state: "_PromptState", draft: _Model, forwards, start: int, expand: tuple[int, ...],
                         count: int) -> None:
        """One draft forward of a sampled tree (temperature > 0): ``count`` children of every
        candidate of ``expand``, each an independent draw from the draft's distribution q at the
        executor's temperature after that candidate (with replacement, so siblings may repeat a
        token: each is a proposal of its own, as SpecInfer's SSMs are); q is kept as the
        proposal of those children."""
        logits, tree = self._tree_forward(state, draft, forwards, start, expand)
        for j, e in enumerate(expand):
            q = tree.proposal[e] = self._dist(logits[j])
            for rank in range(count):
                tree.add(e, rank, self._draw(q))

    def _tree_forward(self, state: "_PromptState", draft: _Model, forwards, start: int,
                      expand: tuple[int, ...]) -> tuple[torch.Tensor, LiveTree]:
        """The draft forward over the candidates of ``expand`` (``(ROOT,)``: what the draft's
        cache lacks of the committed prefix, which starts a new tree); returns its logits, a row
        per candidate, and the round's tree."""
        if expand == (ROOT,):
            feed = (state.prompt + state.out)[draft.length:]  # what the draft's cache lacks: the last token, or more
            logits = self._timed(forwards, self._origin, draft, "draft", feed, start)[-1:]
            tree = state.tree = LiveTree(draft.length)
        else:
            tree = state.tree
            depth = tree.depths[expand[0]]
            inputs = tree.feed(expand, draft.length, _dtype(draft.model), draft.model.device)
            logits = self._timed(forwards, self._origin, draft, "draft", [tree.tokens[e] for e in expand],
                                 start + depth, tree=inputs)
        state.run.counts.draft_calls += 1
        return logits, tree

    def _draft_fixed_tree(self, state: "_PromptState", draft: _Model, forwards, req: VerifyTree) -> list[int]:
        """Draft a fixed tree for real: node (parent, rank) is the rank-th likeliest draft token
        after its parent (at temperature > 0: the rank-th independent draw from the draft's
        distribution there, :meth:`_sample_children`), so the draft expands, level by level, the
        nodes that have children (``req.widths`` per level, as the simulator prices it). Returns
        each node's candidate."""
        tree = req.tree
        topk = max(tree.ranks) + 1
        has_children = set(tree.parents)
        depths = tree.depths()
        nodes = [ROOT] * tree.size
        grow = self._sample_children if self.temperature > 0 else self._expand_tree
        grow(state, draft, forwards, req.start, (ROOT,), topk)
        for depth in range(1, tree.depth + 1):
            level = [i for i in range(tree.size) if depths[i] == depth]
            for i in level:  # the parents' level was drafted just before
                p = tree.parents[i]
                nodes[i] = state.tree.child[(ROOT if p == ROOT else nodes[p], tree.ranks[i])]
            expand = tuple(nodes[i] for i in level if i in has_children)
            if expand:
                grow(state, draft, forwards, req.start, expand, topk)
        return nodes

    def _verify_tree(self, state: "_PromptState", draft: _Model, target: _Model, forwards, info: PromptInfo,
                     req: VerifyTree, run: LiveRun) -> int:
        """One target forward over the last committed token and every node of ``req.tree`` under a
        tree attention mask, then the accepted path (:meth:`_accepted_path`); both caches keep
        the committed prefix and that path only. Answers how many nodes the accepted path holds
        (the round emits them and the target's token after them).

        What is drafted at temperature > 0, and why it is lossless. Multi-step speculative
        sampling emits the target's distribution when each child, given all drafted and judged
        before it, is a draw from the q it is judged with (by induction over a node's children:
        child x is emitted with probability min(p, q)(x), and a rejection, of probability
        beta = 1 - sum min(p, q), leaves norm(max(0, p - q)) = (p - min(p, q)) / beta, whatever x
        was). Two drafts satisfy that:

        - a fixed tree (``tree-static``), whose shape looks at no token, is sampled: every child
          an independent draw from the draft's distribution after its parent, judged with it
          (SpecInfer's own case, its SSMs' proposals);
        - a grown tree (``eagle2``, ``ags-tree``) keeps the top-k children it has at temperature
          0: the policy chooses nodes from their draft probabilities, so children it sampled would
          be kept or dropped by their own tokens, and a kept child would no longer be a draw from
          q. A top-k child is a function of the draft's logits, a draw from the point mass on its
          token, and is judged with that: accepted with probability p(x), after a rejection
          p(x) = 0 and p renormalised (the rule of EAGLE-2's code, SafeAILab/EAGLE,
          ``eagle/model/utils.py``, ``evaluate_posterior``, candidate probability 1). The policy
          then decides from the numbers it is given at temperature 0.

        tests/test_live_sampling.py enumerates every draw of both and checks the target's
        distribution exactly."""
        c, tree = req.start, req.tree
        if tree.size and not req.grown:
            nodes = self._draft_fixed_tree(state, draft, forwards, req)
        else:
            nodes = state.tree.nodes_of(tree.parents, tree.ranks) if tree.size else []
        live = state.tree
        tokens = [live.tokens[n] for n in nodes]
        depths = tree.depths()
        feed = state.out[target.length - state.pl:]  # the last committed token
        cached, prefix = target.length, len(feed)
        first = cached + prefix  # cache index of node 0
        inputs = verify_inputs(cached, prefix, tree.parents, depths, _dtype(target.model), target.model.device)
        logits = self._timed(forwards, self._origin, target, "verify", feed + tokens, c, tree=inputs)[prefix - 1:]
        proposals = [live.proposal.get(live.parents[n]) for n in nodes]  # None: a top-k child
        path, last = self._accepted_path(logits, tree.parents, tokens, proposals)
        accepted = self._settle(state, info, c, [tokens[i] for i in path] + [last], len(path))
        path = path[:accepted]
        target.keep(list(range(first)) + [first + i for i in path])
        if live is not None:  # the draft keeps the accepted nodes it fed (an expanded node's ancestors were fed too)
            fed = [live.slot[nodes[i]] for i in path if nodes[i] in live.slot]
            draft.keep(list(range(live.base)) + fed)
        committed = c + accepted + 1
        for model in state.models.values():
            model.crop(state.pl + committed - 1)
        state.tree = None
        run.counts.target_calls += 1
        run.counts.accepted += accepted
        run.counts.drafted += tree.size
        run.counts.num_drafts += tree.size > 0
        run.positions.add(accepted + 1 if accepted < tree.depth else tree.depth, accepted)
        run.rounds.append({"mode": "tree", "start": c, "drafted": tree.size, "accepted": accepted})
        return accepted

    def _accepted_path(self, logits: torch.Tensor, parents: tuple[int, ...], tokens: list[int],
                       proposals: list[torch.Tensor | None]) -> tuple[list[int], int]:
        """The nodes accepted from the root down, and the token after them (row 0 of ``logits``
        follows the last committed token, row i + 1 node i). At each node its children are
        judged in order (:meth:`_accepts`) against the target's distribution as the siblings
        rejected before them left it (:meth:`_residual`); the first accepted is the next node.
        Greedily that is the child that is the target's argmax. ``proposals[i]``: the
        distribution node i was drawn from (None: a top-k child, see :meth:`_verify_tree`)."""
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(parents):
            children.setdefault(parent, []).append(i)
        path, node = [], ROOT
        while True:
            p = self._dist(logits[0 if node == ROOT else node + 1])
            for child in children.get(node, ()):
                q = self._judged_with(p, tokens[child], proposals[child])
                if self._accepts(p, q, tokens[child]):
                    break
                p = self._residual(p, q)
            else:
                return path, self._pick(p)
            path.append(child)
            node = child

    def _judged_with(self, p: torch.Tensor, token: int, q: torch.Tensor | None) -> torch.Tensor | None:
        """The proposal a tree node is judged with: ``q``, the distribution it was drawn from, or
        for a top-k node (None) the point mass on its ``token``; greedy judging reads none."""
        if q is not None or self.temperature == 0:
            return q
        mass = torch.zeros_like(p)
        mass[token] = 1.0
        return mass

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _dtype(model) -> torch.dtype:
    """The dtype a model computes in (its additive attention mask must be of it)."""
    return next(model.parameters()).dtype


def settle(out: list[int], eos: set[int], info: PromptInfo, c: int, emitted: list[int], accepted: int) -> int:
    """Commit ``emitted`` from position c to ``out``; stop at the end — an end token or the
    budget's last position — which is counted as the target's token, as in the simulator
    (rounds.py): a parallel round's first new draft that lands there is not accepted. Returns
    the drafts accepted."""
    for j, tok in enumerate(emitted):
        if tok in eos or c + j == info.budget - 1:
            emitted = emitted[: j + 1]
            accepted = min(accepted, j)
            info.n_tokens = c + j + 1
            break
    out.extend(emitted)
    return accepted


class LazySignal:
    """A drafted token's logits; its :class:`TokenSignal` (a softmax over the vocabulary) is
    computed on first use."""

    __slots__ = ("logits", "index", "end", "_signal")

    def __init__(self, logits: torch.Tensor, index: int, end: bool = False):
        self.logits, self.index, self.end, self._signal = logits, index, end, None

    @property
    def signal(self) -> TokenSignal:
        if self._signal is None:
            self._signal = signal_of(self.logits, self.index, self.end)
            self.logits = None
        return self._signal


class SignalList(list):
    """Signals of drafted tokens, built when read (see :class:`LazySignal`)."""

    def __getitem__(self, i):
        item = super().__getitem__(i)
        if isinstance(i, slice):
            return SignalList(item)
        return item.signal

    def __iter__(self):
        return (item.signal for item in super().__iter__())


@dataclass
class _PromptState:
    out: list[int]  # committed tokens (position 0 first)
    pl: int  # prompt length
    prompt: list[int]  # the prompt's tokens
    models: dict  # exit layer (None: the session's draft) -> _Model with its own KV cache
    run: LiveRun
    shadows: bool = False  # keep the target's hidden states for DEL's shadow tokens
    shadow_start: int = 0  # generated position predicted by the last target forward's first row
    drafts: list[int] = field(default_factory=list)  # the current run's drafts / pending drafts
    q: list[torch.Tensor] = field(default_factory=list)  # their draft distributions
    tree: LiveTree | None = None  # the current tree round's candidates


_thread_lock = threading.Lock()


class _intra_op_threads:
    """Give each of the two concurrent models ``n`` intra-op threads for the duration."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        _thread_lock.acquire()
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)
        _thread_lock.release()


__all__ = ["LiveExecutor", "LiveRun", "Forward", "crop_to", "signal_of"]

"""Forward-latency probes on the recording hardware.

The simulator's clock comes from these samples (``simlab.latency.TableLatency``): the draft's
one-token step and the target's forward of k new tokens (k = 1 is a decoding step, verifying
γ drafts is k = γ + 1), each at several context lengths, repeated with every sample kept so
that the spread is visible. Early-exit draft steps (the target's first l layers) are timed for
self-speculative traces.

A probe times the forward a decoder runs, not a cheaper one: a target forward of k tokens
computes the logits of all k positions, because verification reads every one of them (the
LM head of Qwen2.5-Coder-1.5B, 151,936 × 1,536, is 15% of its weights; keeping one row priced
a 6-token verify 9% low: 0.699 against 0.761 s, timed both ways on this project's 2-core CPU). The default times every
k up to 17: on CPU the cost is a staircase in k, not a line (the GEMM kernels tile the k rows:
on that CPU, co-running, k = 7-9 took 1.9 s, k = 10 2.5 s like k = 12, and k = 17 less than
k = 12), so a k between two measured ones cannot be interpolated (PEARL's window of 9 drafts
verified 10 tokens at 2.5 s live, against 2.17 s interpolated). Beyond that it reaches 128
because policies that draft until their confidence drops (SPIDE's serial runs, DV) verify runs
of dozens of tokens (live: 6.5 s for 121 tokens, against 1.5 s read off the last measured
segment of a table that stopped at 17). Two context lengths, because on these machines the cost
is close to linear in the context (k = 1: 0.334 s at 128, 0.318 at 256, 0.336 at 512 in a
three-context probe of the Qwen pair there), and a third one cost a third more probe time.

Batches (``batch=1,2,4,8``, k from ``batch_k``): a serving engine runs one forward for B
sequences, each bringing k new tokens at context c, and what that costs is not B times the
single-sequence figure (the weights are read once; on a CPU the B·k rows share one GEMM). So
for each B > 1 the probe times the target's forward of B sequences × k tokens for every k in
``batch_k`` (1-9 by default: fixed-γ verification up to γ = 8) and the draft's batched one-token
step (the draft model's, or the drafting exit layer's in a self-speculative trace), at every
context length, solo and (with a draft model) co-running, stored with a ``batch`` column.
``batch=1`` is the single-sequence series above; leaving it out of a re-probe
(``record --resume --reprobe --latency-probe 'batch=2,4,8'``) keeps the trace's batch-1 samples
and measures only the batch axis, on the machine that measured them (a trace from other
hardware must re-probe batch 1 too, or its kept samples would be another machine's).

Trees (``tree=1-9,17,32,64``; the default when the recording stores draft trees, ``--topk``,
and none otherwise): tree policies verify a tree of nodes in one target forward under a tree
attention mask, and the draft expands a level of w nodes in one forward under such a mask
(:mod:`simlab.trees.attention`). A 4-D mask is not the causal one a chain forward gets: the
attention reads it from memory, and a kernel that takes any mask may stand in for a causal one
(on a GPU, PyTorch's flash attention takes none). So for every size k in ``tree`` the
probe times the target's verification of a tree of k tokens (the last committed token and
k - 1 nodes: ``op = target_tree``) and the drafter's expansion of k nodes (``op = draft_tree``;
the draft model, or the drafting exit layer of a self-speculative trace, whose ``layer`` it
records) at every context length, solo and (with a draft model) co-running, with the inputs
the live decoder builds (:func:`~simlab.trees.attention.verify_inputs`,
:meth:`~simlab.trees.attention.LiveTree.feed`). The tree is binary, in breadth-first order; its
shape changes which mask entries are open, not the arithmetic. The sizes default to those of the
chain series so that the two are compared where both were measured (the latency model prices a
tree as the chain times their measured ratio: :mod:`simlab.latency.model`). Tree forwards are of
one sequence, so the tree axis needs ``batch=1``.

Exit heads (``exit_head=1-9,17,32``; the default where the recording has exit layers,
``--exit-layers``, and none otherwise): after the prefill and after every verification DEL reads
shadow tokens (:mod:`simlab.policies.early_exit`), the token every exit layer gives at the
positions the target just settled: the final norm and the LM head over those rows of the
target's hidden state after each exit layer, and the top-1 of their softmax
(:func:`~simlab.record.forward.shadow_tokens`, the function the live decoder calls). That is no
small cost: SmolLM2-135M's LM head (49,152 x 576) holds as many weights as 8 of its 30 decoder
layers, so a read of its 29 exit layers goes through about six target forwards' worth of
weights. So for every row count n of ``exit_head`` the probe times that function over n rows
(``op = exit_head``, ``k`` = n; a round of a decoder with d_max = 18 settles 1-19 rows). It
reads no KV cache, so it is timed once per repeat, at ``context_len`` 0, not at every context
length, and solo: nothing runs beside a shadow read.

Clocks: ``time.perf_counter`` on CPU; CUDA events on GPU, after a warm-up call per point.

Co-running figures (``corun=True``): parallel policies (PEARL, SPIDE) run the draft while the
target verifies on the same device. Each model is slower then, so it is timed again while the
other model runs in a second thread: on CPU each thread gets one intra-op thread (the cores
are shared out), on GPU each thread its own CUDA stream. The background load is the draft
stepping for target figures, and the target verifying ``CORUN_VERIFY_K`` tokens for draft
figures. Solo figures use the process's normal thread count. A self-speculative pair co-runs
too: its drafting exit layer runs as a model of its own over the target's weights
(:func:`~simlab.models.early_exit.early_exit_draft`, with its own KV cache), as live parallel
rounds run it. Without those figures its parallel rounds would be priced with the solo ones,
which on a CPU err both ways: one intra-op thread per model makes a 2-token verify of SmolLM2
faster than two threads do, and its 1-token verify and draft steps slower.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from functools import partial

import pandas as pd
import torch

from simlab.common.errors import SimlabError
from simlab.models.early_exit import early_exit_draft
from simlab.models.kv_cache import cache_kwargs, cache_of
from simlab.record.forward import shadow_tokens, truncated
from simlab.record.ranges import int_ranges
from simlab.trace.schema import NO_LAYER
from simlab.trees.attention import LiveTree, verify_inputs
from simlab.trees.draft_tree import ROOT, DraftTree

DEFAULT_PROBE = "k=1-17,24,32,64,128;ctx=128,512;repeats=5;batch=1,2,4,8;batch_k=1-9"
DEFAULT_TREE = "1-9,17,32,64"  # the tree axis of a recording that stores draft trees (--topk)
DEFAULT_EXIT_HEAD = "1-9,17,32"  # the exit-head axis of a recording with exit layers (--exit-layers)
FIELDS = ("k", "ctx", "repeats", "corun", "batch", "batch_k", "tree", "exit_head")
CORUN_VERIFY_K = 4


@dataclass(frozen=True)
class ProbePlan:
    """Which points to time: ``k=1-17,24,32,64,128;ctx=128,512;repeats=5;corun=yes;batch=1,2,4,8;batch_k=1-9;tree=1-9,17,32,64;exit_head=1-9,17,32``."""

    ks: tuple[int, ...]
    contexts: tuple[int, ...]
    repeats: int
    corun: bool = True  # with a draft model, or the drafting exit layer of a self-speculative pair
    batches: tuple[int, ...] = (1,)  # 1: the single-sequence series; B > 1: B sequences x batch_ks
    batch_ks: tuple[int, ...] = ()
    trees: tuple[int, ...] = ()  # tree sizes: tokens of a verification, nodes of a draft's expansion
    exit_heads: tuple[int, ...] = ()  # rows of an exit head (DEL's shadow tokens), timed once per repeat

    @classmethod
    def parse(cls, spec: str, trees: bool = False, exits: bool = False) -> ProbePlan:
        """The plan of ``spec``, every field it leaves out at :data:`DEFAULT_PROBE`'s value; the
        tree axis is :data:`DEFAULT_TREE` where the recording stores draft trees (``trees``) and
        measures the single-sequence series, else none (``tree=none`` leaves it out); the
        exit-head axis likewise :data:`DEFAULT_EXIT_HEAD` where it has exit layers (``exits``)."""
        fields = dict(_parse_field(item, spec) for item in DEFAULT_PROBE.split(";"))
        for item in filter(None, (s.strip() for s in spec.split(";"))):
            key, value = _parse_field(item, spec)
            fields[key] = value
        batches = _int_list(fields["batch"], "batch", spec)
        tree = fields.get("tree", DEFAULT_TREE if trees and 1 in batches else "none")
        heads = fields.get("exit_head", DEFAULT_EXIT_HEAD if exits and 1 in batches else "none")
        plan = cls(
            ks=_int_list(fields["k"], "k", spec),
            contexts=_int_list(fields["ctx"], "ctx", spec),
            repeats=_int_list(fields["repeats"], "repeats", spec)[0],
            corun=_flag(fields.get("corun", "yes"), spec),
            batches=batches,
            batch_ks=_int_list(fields["batch_k"], "batch_k", spec),
            trees=() if tree.lower() == "none" else _int_list(tree, "tree", spec),
            exit_heads=() if heads.lower() == "none" else _int_list(heads, "exit_head", spec),
        )
        sizes = plan.ks + plan.contexts + plan.batches + plan.batch_ks + plan.trees + plan.exit_heads
        if plan.repeats < 1 or min(sizes) < 1:
            raise SimlabError(f"--latency-probe {spec!r}: k, ctx, repeats, batch, batch_k, tree and exit_head must be "
                              "at least 1")
        if plan.trees and not plan.single:
            raise SimlabError(f"--latency-probe {spec!r}: tree forwards are of one sequence and priced against the "
                              "single-sequence chain forwards measured with them; put batch=1 among the batch sizes")
        if plan.exit_heads and not plan.single:
            raise SimlabError(f"--latency-probe {spec!r}: exit heads are stored with the single-sequence series, which "
                              "a re-probe without batch=1 keeps; put batch=1 among the batch sizes")
        return plan

    @property
    def single(self) -> bool:
        """Whether the single-sequence (batch 1) series is probed."""
        return 1 in self.batches

    def to_dict(self) -> dict:
        return asdict(self)


_SPEC_FIELDS = {"ks": "k", "contexts": "ctx", "repeats": "repeats", "corun": "corun", "batches": "batch",
                "batch_ks": "batch_k", "trees": "tree", "exit_heads": "exit_head"}  # ProbePlan's field: its spec's


def recorded_probe(extra: dict) -> str:
    """The ``--latency-probe`` spec that measures again the points a trace's manifest says its
    latencies were probed at: its ``latency_probe`` plan, with the sizes of a later batch-axis
    re-probe (``batch_probe``) added. Measuring a trace's latencies again on another machine then
    yields the points the trace holds, at what its own probe cost, where the default grid of
    :data:`DEFAULT_PROBE` costs what it costs whatever the trace measured (``simlab live`` on a
    SmolLM2 trace probed at 4 k values, re-measured at the default grid, took 306 s alone on a
    2-core AMD EPYC; at its own plan 80 s, beside the rest of the test suite). A field the
    manifest predates is left to :meth:`ProbePlan.parse`'s default, so a trace with no recorded
    plan gets "" (every field's default)."""
    plan = dict(extra.get("latency_probe") or {})
    later = extra.get("batch_probe") or {}
    for key in ("batches", "batch_ks"):
        if key in later:
            plan[key] = sorted({*plan.get(key, ()), *later[key]})
    parts = []
    for key, value in plan.items():
        if key not in _SPEC_FIELDS or key == "batch_ks" and not value:
            continue  # no batch axis, which batch=1 alone says
        if isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, int):
            text = str(value)
        else:
            text = ",".join(map(str, value)) or "none"
        parts.append(f"{_SPEC_FIELDS[key]}={text}")
    return ";".join(parts)


def _parse_field(item: str, spec: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or key not in FIELDS:
        raise SimlabError(f"--latency-probe {spec!r}: expected fields k=..., ctx=..., repeats=N, corun=yes|no, "
                          "batch=..., batch_k=..., tree=...|none, exit_head=...|none")
    return key, value.strip()


def _int_list(text: str, name: str, spec: str) -> tuple[int, ...]:
    try:
        return int_ranges(text)
    except ValueError as exc:
        raise SimlabError(f"--latency-probe {spec!r}: {name}: {exc}") from None


def _flag(text: str, spec: str) -> bool:
    if text.lower() in ("yes", "true", "1", "on"):
        return True
    if text.lower() in ("no", "false", "0", "off"):
        return False
    raise SimlabError(f"--latency-probe {spec!r}: corun must be yes or no")


class _Stepper:
    """A model with a KV cache of ``batch`` sequences of ``ctx`` tokens that runs forwards of k
    new tokens per sequence and rolls back; each forward returns the logits of all k positions,
    as a decoder's does."""

    def __init__(self, model, ctx: int, vocab: int, gen: torch.Generator, batch: int = 1):
        self.model = model
        self.vocab = vocab
        self.gen = gen
        self.batch = batch
        out = model(input_ids=self._tokens(ctx), use_cache=True, logits_to_keep=1)
        self.cache = cache_of(out)

    def _tokens(self, k: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (self.batch, k), generator=self.gen).to(self.model.device)

    def __call__(self, k: int, tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``tree``: the (4-D mask, position ids) of a forward under a tree attention mask."""
        mask, positions = tree if tree is not None else (None, None)
        logits = self.model(input_ids=self._tokens(k), **cache_kwargs(self.model, self.cache), use_cache=True,
                            logits_to_keep=k, attention_mask=mask, position_ids=positions).logits
        self.cache.crop(-k)
        return logits


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass
class _Op:
    """One latency point: a forward to time, and what runs beside it when co-running."""

    op: str
    k: int
    ctx: int
    layer: int
    run: Callable[[], object]
    batch: int = 1
    load: Callable[[], None] | None = None  # the other model's loop, for corun figures
    scope: Callable[[], AbstractContextManager] = nullcontext  # e.g. the target cut at an exit layer


def _corun(fn: Callable[[], None], load: Callable[[], None], device: torch.device) -> float:
    """Time ``fn`` once while ``load`` runs in a loop in another thread, one core or stream each."""
    stop = threading.Event()
    started = threading.Event()
    result: list[float] = []

    def lane() -> AbstractContextManager:
        return torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else nullcontext()

    def background() -> None:
        torch.set_num_threads(1)
        with torch.inference_mode(), lane():
            load()  # under way before the timed call starts
            started.set()
            while not stop.is_set():
                load()

    def foreground() -> None:
        torch.set_num_threads(1)
        with torch.inference_mode(), lane():
            started.wait()
            result.append(_timed(fn, device))

    threads = [threading.Thread(target=background), threading.Thread(target=foreground)]
    try:
        for t in threads:
            t.start()
        threads[1].join()
    finally:
        stop.set()
        for t in threads:
            t.join()
    return result[0]


def _ops(target, draft, exit_layers: list[int], plan: ProbePlan, ctx: int, vocab: int, gen,
         draft_layer: int = NO_LAYER) -> list[_Op]:
    """The points to time at one context length, each model holding a cache of ``ctx`` tokens."""
    ops = _single_ops(target, draft, exit_layers, draft_layer, plan, ctx, vocab, gen) if plan.single else []
    for b in plan.batches:
        if b > 1:
            ops += _batch_ops(target, draft, draft_layer, plan, ctx, vocab, gen, b)
    return ops


def _batch_ops(target, draft, draft_layer: int, plan: ProbePlan, ctx: int, vocab: int, gen, b: int) -> list[_Op]:
    """Forwards of ``b`` sequences: the target over k tokens each, one draft step each."""
    tgt = _Stepper(target, ctx, vocab, gen, b)
    ops = [_Op("target_forward", k, ctx, NO_LAYER, lambda k=k: tgt(k), batch=b) for k in plan.batch_ks]
    if draft is None:
        scope = partial(truncated, target, draft_layer)
        with scope():
            early = _Stepper(target, ctx, vocab, gen, b)
        return ops + [_Op("draft_step", 1, ctx, draft_layer, lambda: early(1), scope=scope, batch=b)]
    drf = _Stepper(draft, ctx, vocab, gen, b)
    ops.append(_Op("draft_step", 1, ctx, NO_LAYER, lambda: drf(1), batch=b))
    if plan.corun:
        ops.append(_Op("draft_step", 1, ctx, NO_LAYER, lambda: drf(1), load=lambda: tgt(CORUN_VERIFY_K), batch=b))
        ops += [_Op("target_forward", k, ctx, NO_LAYER, lambda k=k: tgt(k), load=lambda: drf(1), batch=b)
                for k in plan.batch_ks]
    return ops


def _single_ops(target, draft, exit_layers: list[int], draft_layer: int, plan: ProbePlan, ctx: int, vocab: int,
                gen) -> list[_Op]:
    """The single-sequence points (batch 1)."""
    tgt = _Stepper(target, ctx, vocab, gen)
    ops = [_Op("target_forward", k, ctx, NO_LAYER, lambda k=k: tgt(k)) for k in plan.ks]
    for layer in exit_layers:
        scope = partial(truncated, target, layer)
        with scope():
            early = _Stepper(target, ctx, vocab, gen)
        ops.append(_Op("draft_step", 1, ctx, layer, lambda early=early: early(1), scope=scope))
    if draft is not None:
        drf = _Stepper(draft, ctx, vocab, gen)
        ops.append(_Op("draft_step", 1, ctx, NO_LAYER, lambda: drf(1)))
        if plan.corun:
            ops += _corun_ops(tgt, drf, NO_LAYER, plan.ks, ctx)
    elif plan.corun and draft_layer != NO_LAYER:  # the exit layer as a model of its own (module docstring)
        ops += _corun_ops(tgt, _Stepper(early_exit_draft(target, draft_layer), ctx, vocab, gen), draft_layer, plan.ks, ctx)
    if plan.trees:
        ops += _tree_ops(target, draft, draft_layer, plan, ctx, vocab, gen, tgt)
    return ops


def _corun_ops(tgt: _Stepper, drf: _Stepper, layer: int, ks: tuple[int, ...], ctx: int) -> list[_Op]:
    """Each model timed while the other runs (module docstring): a draft step (of exit layer
    ``layer`` for a self-speculative pair) beside the target verifying ``CORUN_VERIFY_K`` tokens,
    and the target's k-token forwards beside draft steps."""
    return [_Op("draft_step", 1, ctx, layer, lambda: drf(1), load=lambda: tgt(CORUN_VERIFY_K)),
            *(_Op("target_forward", k, ctx, NO_LAYER, lambda k=k: tgt(k), load=lambda: drf(1)) for k in ks)]


def _tree_ops(target, draft, draft_layer: int, plan: ProbePlan, ctx: int, vocab: int, gen, tgt: _Stepper) -> list[_Op]:
    """Forwards under a tree attention mask, for every size of ``plan.trees``: the target's
    verification of a tree of that many tokens (``tgt`` holds its cache), and the drafter's
    expansion of that many nodes; solo and, with a draft model, co-running."""
    layer, scope, drafting = NO_LAYER, nullcontext, draft
    if draft is None:  # self-speculative: the drafting exit layer expands
        layer, scope, drafting = draft_layer, partial(truncated, target, draft_layer), target
    with scope():
        drafter = _Stepper(drafting, ctx, vocab, gen)
    ops = []
    for k in plan.trees:
        verify = verify_inputs(ctx, 1, *probe_tree(k - 1), _dtype(target), target.device)
        expand = _expansion(k, ctx, _dtype(drafting), drafting.device)
        ops.append(_Op("target_tree", k, ctx, NO_LAYER, lambda k=k, v=verify: tgt(k, v)))
        ops.append(_Op("draft_tree", k, ctx, layer, lambda k=k, e=expand: drafter(k, e), scope=scope))
    if draft is None or not plan.corun:
        return ops
    load = {"target_tree": lambda: drafter(1), "draft_tree": lambda: tgt(CORUN_VERIFY_K)}
    return ops + [replace(op, load=load[op.op]) for op in ops]


def _exit_head_ops(target, plan: ProbePlan, gen) -> list[_Op]:
    """The exit head over n rows of hidden state for every n of ``plan.exit_heads`` (module
    docstring), with random rows in the target's dtype: the head's cost is its matrix product,
    whatever the values."""
    hidden = target.get_output_embeddings().weight.shape[1]
    ops = []
    for n in plan.exit_heads:
        rows = torch.randn(n, hidden, generator=gen).to(target.device, _dtype(target))
        ops.append(_Op("exit_head", n, 0, NO_LAYER, lambda rows=rows: shadow_tokens(target, rows)))
    return ops


def probe_tree(nodes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The parents and depths of the probe's tree of ``nodes`` nodes: binary, breadth-first (two
    children of the root, two of each node after). Its shape sets which entries of the mask are
    open, not how much the forward computes."""
    tree = DraftTree(tuple(ROOT if i < 2 else i // 2 - 1 for i in range(nodes)), tuple(i % 2 for i in range(nodes)))
    return tree.parents, tree.depths()


def _expansion(nodes: int, ctx: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs of a draft's expansion of ``nodes`` candidates of the first level (children of
    the committed prefix, whose ``ctx`` tokens the draft's cache holds), as the live decoder
    feeds a level."""
    tree = LiveTree(ctx)
    return tree.feed([tree.add(ROOT, rank, 0) for rank in range(nodes)], ctx, dtype, device)


def _dtype(model) -> torch.dtype:
    """The dtype a model computes in (its additive attention mask is of it, as in live decoding)."""
    return next(model.parameters()).dtype


@torch.inference_mode()
def probe_latency(
    target,
    draft,
    exit_layers: list[int],
    plan: ProbePlan,
    vocab: int,
    log: Callable[[str], None] = lambda _: None,
    draft_layer: int = NO_LAYER,
) -> pd.DataFrame:
    """Latency samples (rows of latency.parquet) for the points of ``plan``; ``draft_layer``
    is the exit layer that drafts batched steps and tree expansions when there is no draft model.
    Exit heads are timed where there are ``exit_layers`` (the shadow tokens they serve).

    Repeats are interleaved (round r times every point, at every context length, once) so that
    a burst of load from elsewhere spreads over all points instead of biasing a few: timing
    each context length's points together let one busy minute raise a whole column (the
    Qwen pair's ctx=256 figures once came out 10-35% above both neighbours). Every point gets
    one untimed warm-up call first.
    """
    device = target.device
    gen = torch.Generator().manual_seed(0)
    if draft is None and draft_layer == NO_LAYER and (plan.trees or any(b > 1 for b in plan.batches)):
        raise SimlabError("batched draft steps and tree expansions need a draft model or a drafting exit layer")
    if plan.exit_heads and not exit_layers:
        raise SimlabError("the exit-head axis times the shadow tokens of exit layers: record with --exit-layers, "
                          "or pass exit_head=none")
    ops = [op for ctx in plan.contexts
           for op in _ops(target, draft, exit_layers, plan, ctx, vocab, gen, draft_layer)]
    ops += _exit_head_ops(target, plan, gen)
    for op in ops:
        with op.scope():
            op.run()
    rows: list[dict] = []
    for repeat in range(plan.repeats):
        log(f"latency probe: round {repeat + 1} of {plan.repeats}")
        for op in ops:
            with op.scope():
                seconds = _timed(op.run, device) if op.load is None else _corun(op.run, op.load, device)
            rows.append({"op": op.op, "k": op.k, "context_len": op.ctx, "layer": op.layer,
                         "corun": op.load is not None, "repeat": repeat, "seconds": seconds, "batch": op.batch})
    if not rows:
        raise SimlabError("the latency probe timed nothing")
    return pd.DataFrame(rows)

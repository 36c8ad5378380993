"""Small hand-built traces for tests: acceptance patterns you can check by eye."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simlab.common.errors import SimlabError
from simlab.policies.base import Decision, Parallel, Policy, Serial
from simlab.trace.checksums import rehash
from simlab.trace.io import Trace, empty_table, read_trace
from simlab.trace.schema import NO_LAYER, Manifest


def put_table(trace_dir: Path, name: str, table: pd.DataFrame | pa.Table) -> Path:
    """``table`` written over ``name.parquet`` of the trace in ``trace_dir`` as another tool would,
    then vouched for with ``simlab trace rehash`` (a deliberate edit), so that what loading the
    trace checks next is the table's content."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    pq.write_table(table, Path(trace_dir) / f"{name}.parquet")
    rehash(trace_dir)
    return Path(trace_dir)


def expect_error(path, *fragments: str) -> str:
    """The one-line message with which loading the trace in ``path`` is refused; it holds ``fragments``."""
    with pytest.raises(SimlabError) as info:
        read_trace(path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def latency_table(draft: float = 0.1, verify: dict[int, float] | None = None, ctx=(0, 10_000),
                  layers: dict[int, float] | None = None, corun: tuple[float, float] | None = None,
                  slope: float = 0.0, tree: dict[int, float] | None = None,
                  expand: dict[int, float] | None = None, heads: dict[int, float] | None = None,
                  plain: float | None = None, prefill: dict[int, tuple[float, float]] | None = None) -> pd.DataFrame:
    """Latency samples: draft step ``draft`` s, k-token verify ``verify[k]`` s, each plus
    ``slope`` s per token of context (a forward at context c takes ``x + slope * c``; the
    default 0 is flat in context); ``layers`` adds early-exit draft steps (exit layer -> s);
    ``corun`` = (draft factor, verify factor) adds co-running samples, each solo figure times
    its factor; ``tree`` and ``expand`` add the probe's tree axis (solo): a k-token tree
    verification ``tree[k]`` s, the draft's expansion of w nodes ``expand[w]`` s; ``heads`` the
    probe's exit-head axis: the exit head over n rows ``heads[n]`` s (context 0); ``plain`` the
    target's plain decoding step timed on its own (``target_step``, as llama.cpp's trace tool does);
    ``prefill`` the prefills of k prompt tokens timed as a server runs them, k -> (target's s, draft's s)."""
    verify = verify or {k: 1.0 for k in range(1, 40)}
    rows = [("draft_step", 1, c, NO_LAYER, False, 0, draft + slope * c) for c in ctx]
    rows += [("target_forward", k, c, NO_LAYER, False, 0, s + slope * c) for k, s in verify.items() for c in ctx]
    rows += [("draft_step", 1, c, layer, False, 0, s + slope * c) for layer, s in (layers or {}).items() for c in ctx]
    if corun:
        rows += [(op, k, c, layer, True, 0, s * corun[op == "target_forward"]) for op, k, c, layer, _, _, s in rows]
    rows += [(op, k, c, NO_LAYER, False, 0, s + slope * c) for op, series in (("target_tree", tree), ("draft_tree", expand))
             for k, s in (series or {}).items() for c in ctx]
    rows += [("exit_head", n, 0, NO_LAYER, False, 0, s) for n, s in (heads or {}).items()]
    rows += [("target_step", 1, c, NO_LAYER, False, 0, plain + slope * c) for c in ctx] if plain is not None else []
    rows += [(f"{model}_prefill", k, c, NO_LAYER, False, 0, s + slope * c) for k, pair in (prefill or {}).items()
             for model, s in zip(("target", "draft"), pair) for c in ctx]
    return pd.DataFrame(rows, columns=["op", "k", "context_len", "layer", "corun", "repeat", "seconds"])


def random_trace(seed: int, layers: tuple[int, ...] = (), rolled: tuple[int, ...] = (NO_LAYER,), temperature: float = 0.0,
                 corun: bool = False) -> Trace:
    """Prompts (up to five, 1 to 24 positions) of random draft and exit-layer matches and
    confidences, for pinning a compiled replay to the round protocol through every branch: the
    drafters of ``rolled`` (``NO_LAYER``: the draft) have their own rollouts, some short (overruns),
    some prompts a tail past the path's end (step 0 at n) and some none; the others none
    (teacher-forced signals stand in); some prompts end on an end token with a budget past it, some
    at the budget; at ``temperature`` > 0 the draft's acceptance is drawn from q/p under the seed.
    Latency: contexts matter, exit heads and catch-ups are priced, ``corun`` adds co-running samples."""
    rng = random.Random(seed)
    prompts, positions, layer_rows, rollouts = [], [], [], []
    budget = 24
    for pid in range(rng.randint(1, 5)):
        n = rng.choice([1, 2, 3, rng.randint(4, budget)])
        target = 100 + np.arange(n)
        matches, confs = {}, {}
        for drafter in (NO_LAYER, *layers):
            p_match = rng.choice([0.2, 0.6, 0.95, 1.0])
            matches[drafter] = np.array([rng.random() < p_match for _ in range(n)])
            confs[drafter] = np.array([rng.choice([rng.random(), 0.97, 0.999]) for _ in range(n)])
        match, conf = matches[NO_LAYER], confs[NO_LAYER]
        positions.append(pd.DataFrame({
            "prompt_id": pid, "pos": np.arange(n), "target_token": target, "draft_token": np.where(match, target, 9_000),
            "draft_conf": conf, "draft_entropy": 0.1, "q_target": np.where(match, conf, 0.0) if not temperature else
            np.array([rng.random() for _ in range(n)]), "p_target": np.array([rng.uniform(0.05, 1.0) for _ in range(n)]),
            "p_draft": 1.0, "accept_prob": 1.0}))
        prompts.append({"prompt_id": pid, "source": f"random/{pid}", "prompt_len": rng.randint(3, 40), "n_tokens": n,
                        "stop": rng.choice(["eos", "length"]) if n < budget else "length", "prompt_text": ""})
        for layer in layers:
            layer_rows.append(pd.DataFrame({"prompt_id": pid, "pos": np.arange(n), "layer": layer,
                                            "token": np.where(matches[layer], target, 9_000), "draft_conf": confs[layer],
                                            "draft_entropy": 0.5}))
        for drafter in rolled:
            diverged = np.flatnonzero(~matches[drafter]).tolist() if not temperature or drafter != NO_LAYER else \
                rng.sample(range(n), rng.randint(0, n))  # sampled acceptance: any position may diverge
            for d in [*diverged, n]:
                if d == n and rng.random() < 0.4:
                    continue  # no tail: the last position's signal stands in, an overrun
                steps = np.arange(0 if d == n else 1, 1 + rng.choice([1, 2, 5, 12]))  # a tail: step 0 and more
                rollouts.append(pd.DataFrame({"prompt_id": pid, "pos": d, "step": steps, "token": 7,
                                              "draft_conf": [rng.choice([rng.random(), 0.98]) for _ in steps],
                                              "draft_entropy": 0.5, "layer": drafter}))
    manifest = Manifest(kind="synthetic", draft_model="random", target_model="random", dataset="random",
                        hardware="none", temperature=temperature, max_new_tokens=budget, exit_layers=list(layers),
                        n_layers=max(layers, default=0) + 2 if layers else 0, eos_token_ids=[7])
    latency = latency_table(draft=0.013, layers={layer: 0.01 * layer + 0.001 for layer in layers}, slope=0.0007,
                            verify={k: 0.3 + 0.05 * k for k in range(1, 40)}, corun=(1.3, 1.1) if corun else None,
                            heads={r: 0.001 * r + 0.0003 for r in range(1, 40)})
    return Trace(manifest=manifest, prompts=pd.DataFrame(prompts), positions=pd.concat(positions, ignore_index=True),
                 rollouts=pd.concat(rollouts, ignore_index=True) if rollouts else empty_table("rollouts"),
                 latency=latency, layers=pd.concat(layer_rows, ignore_index=True) if layer_rows else None)


def assert_same_run(protocol, compiled) -> None:
    """Two executors' reports (``SimRun``) are equal: every count and time of every prompt, to the
    last bit, and the per-position histograms."""
    assert [p.prompt_id for p in compiled.prompts] == [p.prompt_id for p in protocol.prompts]
    assert [dataclasses.asdict(p.counts) for p in compiled.prompts] == [dataclasses.asdict(p.counts) for p in protocol.prompts]
    for hist in ("checked_hist", "accepted_hist"):
        ours, theirs = getattr(compiled.positions, hist), getattr(protocol.positions, hist)
        assert {n: c for n, c in ours.items() if c} == {n: c for n, c in theirs.items() if c}


def noisy_latency(fn, ks, contexts, repeats=5, noise=0.02, seed=0, op="target_forward", corun=False,
                  layer=NO_LAYER) -> pd.DataFrame:
    """Latency samples ``fn(k, ctx) * (1 + noise * N(0, 1))``, ``repeats`` probe rounds of every point."""
    rng = np.random.default_rng(seed)
    rows = [(op, k, c, layer, corun, r, fn(k, c) * (1 + noise * rng.standard_normal()))
            for r in range(repeats) for k in ks for c in contexts]
    return pd.DataFrame(rows, columns=["op", "k", "context_len", "layer", "corun", "repeat", "seconds"])


def hand_trace(patterns: list[str], conf: list[list[float]] | None = None, latency: pd.DataFrame | None = None,
               temperature: float = 0.0, stop: str = "length", max_new_tokens: int = 0,
               layers: dict[int, list[str]] | None = None, layer_conf: dict[int, list[list[float]]] | None = None,
               n_layers: int | None = None) -> Trace:
    """One prompt per pattern; pattern[t] is '1' if the draft matches the target at position t.

    Position 0 (the prefill's token) is part of the pattern but is never drafted. With
    ``stop="eos"`` the last position is the end token and drafting is capped by
    ``max_new_tokens`` instead. ``layers`` adds early-exit signals: exit layer -> one pattern
    per prompt, '1' where that layer's token matches the target's, with confidences from
    ``layer_conf`` (default 0.9 on a match, 0.4 elsewhere); ``n_layers`` is the target's layer
    count (default: deepest exit layer + 1).
    """
    prompts, positions, layer_rows = [], [], []
    for pid, pattern in enumerate(patterns):
        bits = np.array([ch == "1" for ch in pattern])
        n = len(bits)
        target = 100 + np.arange(n) + 1000 * pid
        c = np.array(conf[pid]) if conf else np.where(bits, 0.9, 0.4)
        positions.append(pd.DataFrame({
            "prompt_id": pid, "pos": np.arange(n), "target_token": target,
            "draft_token": np.where(bits, target, target + 50_000), "draft_conf": c,
            "draft_entropy": 1.0 - c, "q_target": np.where(bits, c, 0.0), "p_target": 1.0,
            "p_draft": bits.astype(float), "accept_prob": bits.astype(float),
        }))
        # the prompt holds the answer's first tokens, in two copies, so that lookups find matches
        prompts.append({"prompt_id": pid, "source": f"hand/{pid}", "prompt_len": 10, "n_tokens": n,
                        "stop": stop, "prompt_text": "", "prompt_token_ids": [*target[:5], *target[:5]][:10] +
                        [7] * (10 - min(10, 2 * min(5, n)))})
        for layer, layer_patterns in (layers or {}).items():
            match = np.array([ch == "1" for ch in layer_patterns[pid]])
            lc = np.array(layer_conf[layer][pid]) if layer_conf else np.where(match, 0.9, 0.4)
            layer_rows.append(pd.DataFrame({
                "prompt_id": pid, "pos": np.arange(n), "layer": layer, "token": np.where(match, target, target + 70_000),
                "draft_conf": lc, "draft_entropy": 1.0 - lc,
            }))
    exits = sorted(layers or {})
    manifest = Manifest(kind="synthetic", draft_model="hand", target_model="hand", dataset="hand",
                        hardware="none", temperature=temperature, max_new_tokens=max_new_tokens, exit_layers=exits,
                        n_layers=n_layers or (exits[-1] + 1 if exits else 0))
    return Trace(manifest=manifest, prompts=pd.DataFrame(prompts), positions=pd.concat(positions, ignore_index=True),
                 rollouts=empty_table("rollouts"), latency=latency if latency is not None else latency_table(),
                 layers=pd.concat(layer_rows, ignore_index=True) if layer_rows else None)


class EveryRoundParallel(Policy):
    """PEARL-shaped test policy: every round is parallel with a window of 3 (pre-verify when
    nothing is pending, post-verify otherwise)."""

    name, summary, paper, parallel = "test-parallel", "", "", True

    def plan(self, state):
        return Parallel(3)


class SerialThenParallel(Policy):
    """SPIDE-shaped test policy: draft serially until a low-confidence token, then hand the
    drafts to parallel rounds until a rejection."""

    name, summary, paper, parallel = "test-switch", "", "", True

    def plan(self, state):
        return Parallel(2) if state.pending else Serial(6)

    def on_draft(self, signal):
        return Decision.PARALLEL if signal.confidence < 0.6 else Decision.DRAFT


def simlab_cmd(*args) -> list[str]:
    """The command line of ``simlab ARGS`` in a fresh interpreter."""
    return [sys.executable, "-m", "simlab", *map(str, args)]


def with_hardware(trace: Path, out: Path, hardware: str) -> Path:
    """A copy of ``trace`` at ``out`` whose manifest says it was recorded on ``hardware``."""
    shutil.copytree(trace, out)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "hardware": hardware}))
    return out


def kill_moments(seed: int, n: int, low: float, high: float) -> list[float]:
    """``n`` reproducible moments (seconds after a start) at which to kill a writer."""
    rng = random.Random(seed)
    return sorted(round(rng.uniform(low, high), 2) for _ in range(n))


def run_killed(cmd: list[str], after: float) -> bool:
    """Run ``cmd`` and SIGKILL it ``after`` seconds from its start; False if it finished first."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=after)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def greedy_continuation(model, prefix: list[int], steps: int) -> tuple[list[int], list[float]]:
    """What a draft that never stops reads after ``prefix``: ``steps`` greedy tokens and their
    confidences, on past its end tokens, decoding one token at a time with a KV cache (the
    obvious slow way that rollouts must equal)."""
    import torch

    from simlab.models.kv_cache import cache_kwargs, cache_of
    from simlab.record.signals import greedy_stats

    tokens, confs = [], []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prefix]), use_cache=True)
        for _ in range(steps):
            stats = greedy_stats(out.logits[:, -1])
            tokens.append(int(stats.token[0]))
            confs.append(float(stats.conf[0]))
            out = model(input_ids=torch.tensor([[tokens[-1]]]), **cache_kwargs(model, cache_of(out)), use_cache=True)
    return tokens, confs

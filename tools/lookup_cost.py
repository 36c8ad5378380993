"""Time the lookup policies' own propose() on shipped traces and fit the CPU cost they are priced at.

    python tools/lookup_cost.py [--repeats 3]

For each lookup policy (pld, ngram, suffix, rest) it walks every prompt of the shipped Qwen traces
position by position, as a decoder sees them (the prompt, then one committed token more each
step; suffix decoding's trees fed in order, as in a run), times each propose() call with
``time.perf_counter`` (best of ``--repeats`` per call, the least disturbed), and fits
seconds = fixed + per_token x context tokens by least squares. The printed pairs are what ``pld``'s,
``ngram``'s and ``rest``'s ``COST`` hold (``simlab/policies/lookup.py``, ``rest.py``; ``suffix`` is
priced as Arctic Inference's C++ cache runs, ``results/lookup/arctic_check.py``, and its line here is
simlab's Python model of it); the CPU share other processes took while it ran is printed beside
them (docs/policies/lookup.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from simlab.common.cpu_load import OtherLoad
from simlab.common.datastore import Datastore
from simlab.common.locations import TRACES
from simlab.policies import make_policy
from simlab.policies.base import PolicyContext, PromptInfo
from simlab.trace.io import read_trace
from simlab.trace.replay import TraceReplay

TRACES_TIMED = ("qwen-coder-humaneval", "qwen-coder-mtbench")
CAP = 10  # proposals as long as pld's default


def timings(name: str, params: dict, replay: TraceReplay, repeats: int) -> tuple[np.ndarray, np.ndarray]:
    eos = list(replay.trace.manifest.eos_token_ids)
    contexts, seconds = [], []
    policy = make_policy(name, PolicyContext(latency=None, eos_token_ids=eos), **params)
    stateful = name == "suffix"  # its trees take each token once: one timing per call, in order
    for rp in replay.prompts:
        policy.reset(PromptInfo(rp.prompt_id, rp.prompt_len, rp.n_tokens, rp.budget))
        for t in range(1, rp.n_tokens):
            context = rp.tokens[:rp.prompt_len + t]
            best = float("inf")
            for _ in range(1 if stateful else repeats):
                t0 = time.perf_counter()
                policy.propose(context, CAP)
                best = min(best, time.perf_counter() - t0)
            contexts.append(len(context))
            seconds.append(best)
        if stateful:
            policy.settle(rp.tokens[:rp.prompt_len + rp.n_tokens])
    return np.asarray(contexts, float), np.asarray(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    replays = [TraceReplay(read_trace(TRACES / name)) for name in TRACES_TIMED]
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "d.npz"  # REST's datastore: the outputs of every prompt timed (each skips its own)
        Datastore.of_outputs([(rp.prompt_tokens, rp.target_tokens) for r in replays for rp in r.prompts]).save(store)
        for name, params in (("pld", {}), ("ngram", {}), ("suffix", {}), ("rest", {"datastore": str(store)})):
            load = OtherLoad()
            make_policy(name, PolicyContext(latency=None), **params).propose(list(range(50)), CAP)  # compile, load
            ctx, sec = map(np.concatenate, zip(*(timings(name, params, r, args.repeats) for r in replays)))
            per_token, fixed = np.polyfit(ctx, sec, 1)
            share = load.share()
            print(f"{name}: COST = ({fixed:.2e}, {per_token:.2e})  median {np.median(sec) * 1e6:.1f} us, "
                  f"p90 {np.quantile(sec, 0.9) * 1e6:.1f} us over {len(sec)} lookups at contexts "
                  f"{int(ctx.min())}-{int(ctx.max())}; others took {share if share is None else f'{share:.0%}'} "
                  "of the CPU")


if __name__ == "__main__":
    main()

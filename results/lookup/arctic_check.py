"""simlab's suffix policy against Arctic Inference's own SuffixDecodingCache, at every position.

Run with a Python that has Arctic Inference's suffix_decoding (its C++ tree built from the
arctic-inference 0.3.0 sdist, see README.md) and simlab importable:

    PYTHONPATH=ARCTIC_DIR:. python results/lookup/arctic_check.py traces/qwen-coder-humaneval ...

At every position of every prompt (in trace order, the cache kept across prompts as vLLM keeps
it) it feeds both the same tokens and compares the proposals, for vLLM's defaults and a few other
settings. Why every position and not only a run's round starts: the trees hold the context token
by token, so their state at a position does not depend on how earlier rounds cut the tokens.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

from simlab.policies import make_policy
from simlab.policies.base import PolicyContext, PromptInfo
from simlab.trace.io import read_trace
from simlab.trace.replay import TraceReplay

SETTINGS = [
    dict(num_tokens=24, max_tree_depth=24, max_spec_factor=1.0, min_token_prob=0.1),  # vLLM's defaults
    dict(num_tokens=8, max_tree_depth=24, max_spec_factor=1.0, min_token_prob=0.1),
    dict(num_tokens=16, max_tree_depth=12, max_spec_factor=2.0, min_token_prob=0.3),
    dict(num_tokens=32, max_tree_depth=32, max_spec_factor=0.5, min_token_prob=0.0),
]


def check(path: str, setting: dict, clock: dict | None = None) -> tuple[int, int, int]:
    """Positions compared, proposing the same tokens, with a proposal; ``clock`` collects each
    side's seconds per lookup (the tokens taken and the speculation, as one round does)."""
    replay = TraceReplay(read_trace(path))
    policy = make_policy("suffix", PolicyContext(latency=None), **setting)
    cache = SuffixDecodingCache(max_tree_depth=setting["max_tree_depth"], max_cached_requests=10000)
    compared = same = proposed = 0
    for rp in replay.prompts:
        policy.reset(PromptInfo(rp.prompt_id, rp.prompt_len, rp.n_tokens, rp.budget))
        tokens = rp.tokens.astype(np.int32)
        pl = rp.prompt_len
        cache.start_request(rp.prompt_id, tokens[:pl])
        for t in range(1, rp.n_tokens):
            t0 = time.perf_counter()
            cache.add_active_response(rp.prompt_id, tokens[pl + t - 1:pl + t])
            context = tokens[:pl + t]
            theirs = cache.speculate(rp.prompt_id, context[-setting["max_tree_depth"]:],
                                     max_spec_tokens=setting["num_tokens"], max_spec_factor=setting["max_spec_factor"],
                                     min_token_prob=setting["min_token_prob"]).token_ids
            t1 = time.perf_counter()
            ours = list(policy.propose(context.astype(np.int64), setting["num_tokens"]))
            t2 = time.perf_counter()
            if clock is not None:
                clock.setdefault("arctic", []).append(t1 - t0)
                clock.setdefault("simlab", []).append(t2 - t1)
            compared += 1
            same += ours == list(theirs)
            proposed += bool(theirs)
            if ours != list(theirs) and compared - same <= 3:
                print(f"  differ: prompt {rp.prompt_id} pos {t}: simlab {ours} arctic {list(theirs)}")
        cache.add_active_response(rp.prompt_id, tokens[pl + rp.n_tokens - 1:pl + rp.n_tokens])
        policy.settle(tokens[:pl + rp.n_tokens].astype(np.int64))
        cache.stop_request(rp.prompt_id)
    return compared, same, proposed


if __name__ == "__main__":
    for path in sys.argv[1:]:
        for i, setting in enumerate(SETTINGS):
            clock = {} if i == 0 else None
            compared, same, proposed = check(path, setting, clock)
            print(f"{path} {setting}: {same}/{compared} positions propose the same tokens "
                  f"({proposed} with a proposal)")
            if clock:
                print("  seconds per lookup (a prompt's first, which builds its tree, included): " + ", ".join(
                    f"{side} median {np.median(s) * 1e6:.1f} us, mean {np.mean(s) * 1e6:.1f} us"
                    for side, s in clock.items()))

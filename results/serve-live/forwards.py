"""Where a batched decode spends its time: the live decoder's own forwards against the rest.

Decodes the first B prompts of a trace (64 tokens each, after an 8-token warm-up) twice under
`sd` γ = 4 and `ad`, alternating, and prints each decode's wall time, the share spent inside
forwards (`BatchedRun.forwards`: each timed from the feed to the synchronised logits) and the
median forward per kind and width. What is not in a forward (acceptance, cache crops and
compaction, the protocol's bookkeeping) is what `serve`'s latency model does not price.

Usage: python results/serve-live/forwards.py TRACE [B ...]   (default B: 1 8)
"""
import sys

import pandas as pd

from simlab.common.openmp import wait_passively

wait_passively()  # before torch loads OpenMP, as serve --live and the probe do

from simlab.live.batched import BatchedDecoder  # noqa: E402
from simlab.live.serve import cut_trace, load_executor  # noqa: E402
from simlab.policies import make_policy  # noqa: E402
from simlab.sim.run import Simulator  # noqa: E402
from simlab.trace.io import read_trace  # noqa: E402

trace = cut_trace(read_trace(sys.argv[1]), 64)
batches = [int(b) for b in sys.argv[2:]] or [1, 8]
x = load_executor(trace)
context = Simulator(trace).context()
prompts = trace.prompts.sort_values("prompt_id")
for B in batches:
    ids = [(int(p.prompt_id), [int(t) for t in p.prompt_token_ids]) for p in prompts.head(B).itertuples()]
    BatchedDecoder(x).run([make_policy("sd", context, gamma=4) for _ in ids], ids, 8)
    for _ in range(2):
        for policy, params in (("sd", {"gamma": 4}), ("ad", {})):
            run = BatchedDecoder(x).run([make_policy(policy, context, **params) for _ in ids], ids, 64)
            f = pd.DataFrame([vars(s) for s in run.forwards])
            busy = (f.end - f.start).sum()
            print(f"B={B} {policy}: wall {run.wall_s:.2f} s, in forwards {busy:.2f} s ({busy / run.wall_s:.1%}), "
                  f"{run.tokens_per_s:.2f} tok/s")
            print(f.assign(seconds=f.end - f.start).groupby(["what", "width"]).seconds.agg(["count", "median"]).to_string())

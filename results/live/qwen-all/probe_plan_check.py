"""Does the latency probe's mix of forwards raise its price of a draft step? simlab's own
`probe_latency` on the Qwen pair (2 intra-op threads, OpenMP waiting passively, as `simlab record`
runs it) with each plan given on the command line; prints the solo draft step's and the target's
k = 1 and 6 medians (ms) per context length, first those of the shipped traces/qwen-coder-tree.

Usage: python results/live/qwen-all/probe_plan_check.py "k=1,6;ctx=128,512;repeats=5;batch=1;corun=no;tree=none" \\
           "k=1-17,24,32,64;ctx=128,512;repeats=3;batch=1;corun=no;tree=none"
(output of 2026-11-24 16:38-16:44 UTC on the AMD EPYC 2-core box, alone: probe_plan_check.txt)

With ``--interleave N`` the plans take turns, one round each (their ``repeats`` ignored), N rounds
in all, so that the machine's drift over minutes falls on every plan alike (output:
probe_plan_interleaved.txt, its time beside it).
"""

import os
import sys
import time
from dataclasses import replace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from simlab.common.locations import TRACES  # noqa: E402
from simlab.models.load import load_model, resolve  # noqa: E402
from simlab.record.latency import ProbePlan, probe_latency  # noqa: E402


def medians(df: pd.DataFrame) -> pd.DataFrame:
    solo = df[(~df.corun) & (df.batch == 1) & df.op.isin(["draft_step", "target_forward"])]
    solo = solo[(solo.op == "draft_step") | solo.k.isin([1, 6])]
    return (solo.groupby(["op", "k", "context_len"]).seconds.median() * 1000).round(1).unstack()


def main() -> None:
    print("shipped trace:\n", medians(pd.read_parquet(TRACES / "qwen-coder-tree" / "latency.parquet")).to_string())
    torch.set_num_threads(2)
    target = load_model(resolve("qwen2.5-coder-1.5b"), "cpu", "float32").eval()
    draft = load_model(resolve("qwen2.5-coder-0.5b"), "cpu", "float32").eval()
    args, rounds = sys.argv[1:], 0
    if args[0] == "--interleave":
        rounds, args = int(args[1]), args[2:]
    if not rounds:
        for spec in args:
            start = time.time()
            df = probe_latency(target, draft, [], ProbePlan.parse(spec), target.config.vocab_size)
            print(f"\n{spec}  ({time.time() - start:.0f} s)\n", medians(df).to_string(), flush=True)
        return
    start, frames = time.time(), {spec: [] for spec in args}
    for _ in range(rounds):
        for spec in args:
            plan = replace(ProbePlan.parse(spec), repeats=1)
            frames[spec].append(probe_latency(target, draft, [], plan, target.config.vocab_size))
    print(f"\n{rounds} rounds, the plans in turn ({time.time() - start:.0f} s)")
    for spec, dfs in frames.items():
        print(f"\n{spec}\n", medians(pd.concat(dfs)).to_string(), flush=True)


if __name__ == "__main__":
    main()

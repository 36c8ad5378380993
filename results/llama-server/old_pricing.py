"""The speedups `qwen-d4-p0.0-baseline`'s latencies predict with and without its plain decoding
steps (`target_step`): without them AD is priced as one-token verifications, as simlab did
before the trace tool timed the plain step. Same view and predictions as `simlab llama-cpp serve`.

Usage: python results/llama-server/old_pricing.py  (output: old_pricing.txt beside it)
"""

from dataclasses import replace
from pathlib import Path

import pandas as pd

from simlab.engines.llama_cpp.server import Drafting
from simlab.live import llama_server as serve_llama
from simlab.trace.io import read_trace

HERE = Path(__file__).resolve().parent


def main() -> None:
    trace = read_trace(HERE.parents[1] / "traces" / "qwen-coder-llama-cpp")
    latency = pd.read_csv(HERE / "qwen-d4-p0.0-baseline.latency.csv")
    print("| AD priced from | B | speculative tokens/s | plain tokens/s | speedup |")
    print("|---|---|---|---|---|")
    for what, samples in (("target_step (plain steps)", latency),
                          ("one-token verifications", latency[latency["op"] != "target_step"])):
        view = serve_llama.server_view(replace(trace, latency=samples.reset_index(drop=True)), 64)
        for b in (1, 2, 4):
            sd = serve_llama.predict(view, b, Drafting(4))[1]["tokens_per_s"]
            ad = serve_llama.predict(view, b, None)[1]["tokens_per_s"]
            print(f"| {what} | {b} | {sd:.2f} | {ad:.2f} | {sd / ad:.3f}× |")


if __name__ == "__main__":
    main()

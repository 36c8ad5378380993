"""What a target forward of k tokens costs at every k from 1 to 64, not only at the probe's k
(1-17, 24, 32, 48, 64), and what linear interpolation between the probed k makes of the rest.
The Qwen pair on CPU, 2 intra-op threads, OpenMP waiting passively as `simlab live` does, the
target's KV cache holding CONTEXT random tokens, every forward the latency probe's own
(`simlab.record.latency._Stepper`: all k logits, the cache rolled back after it); REPEATS rounds,
each over every k in order. Also counts the major page faults (`ru_majflt`) during the timed
forwards: the models' weights are memory-mapped from their files, so a forward that faults had
its weight pages evicted (this machine's kernel pages out memory it sees as cold).

Usage: python results/live/qwen-probe/k_staircase_check.py  (output: k_staircase_check.txt beside it)
"""

import os
import resource
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from simlab.models.load import load_model, resolve  # noqa: E402
from simlab.record.latency import _Stepper  # noqa: E402

CONTEXT = 200
KS = range(1, 65)
PROBED = (*range(1, 18), 24, 32, 48, 64)  # the k of qwen-probe/run.sh's long-verification spec
REPEATS = 3


def main() -> None:
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    ms: dict[int, list[float]] = {k: [] for k in KS}
    faults = 0
    with torch.inference_mode():
        target = _Stepper(load_model(resolve("qwen2.5-coder-1.5b"), "cpu", "float32").eval(), CONTEXT, 150000, gen)
        for k in (1, 32, 64):  # warm-up
            target(k)
        for _ in range(REPEATS):
            for k in KS:
                before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
                start = time.perf_counter()
                target(k)
                ms[k].append((time.perf_counter() - start) * 1000)
                faults += resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before
    median = {k: statistics.median(v) for k, v in ms.items()}
    probed = [median[k] for k in PROBED]
    print(f"target forward of k tokens at context {CONTEXT}, median of {REPEATS} (ms); 'interpolated': linear "
          f"between the probed k {PROBED[17:]}; major page faults during the timed forwards: {faults}")
    print("| k | measured ms | interpolated ms | interpolated / measured - 1 |")
    print("|---|---|---|---|")
    for k in KS:
        guess = float(np.interp(k, PROBED, probed))
        print(f"| {k} | {median[k]:.0f} | {guess:.0f} | {guess / median[k] - 1:+.1%} |")


if __name__ == "__main__":
    main()

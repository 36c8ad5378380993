"""Why do long verifications run over their price? The Qwen pair on CPU, 2 intra-op threads,
OpenMP waiting passively as `simlab record` and `simlab live` do, each model's KV cache holding
CONTEXT random tokens, every forward the latency probe's own (`simlab.record.latency._Stepper`:
all k logits, the cache rolled back after it). A target forward of K tokens timed in three
settings, interleaved within each repeat so that the machine's drift falls on all three alike:

- `probe`: right after target forwards of 32 and 48 tokens, the order `--probe`'s k axis runs in;
- `decode`: right after DRAFT_STEPS one-token draft steps, as an AdaEDL round reaches it;
- `second`: a second K-token forward straight after `decode`'s (is the first one after drafting dear?).

Usage: python results/live/qwen-probe/long_verify_check.py  (output: long_verify_check.txt beside it)
"""

import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from simlab.models.load import load_model, resolve  # noqa: E402
from simlab.record.latency import _Stepper  # noqa: E402

CONTEXT = 200
K = 41  # adaedl's commonest long verification on the first 8 HumanEval prompts (tokens)
DRAFT_STEPS = 40
REPEATS = 8


def timed(step: _Stepper, k: int) -> float:
    start = time.perf_counter()
    step(k)
    return (time.perf_counter() - start) * 1000


def qwen_steppers(context: int) -> tuple[_Stepper, _Stepper]:
    """The Qwen target and draft, each with a KV cache of ``context`` random tokens, on 2 threads
    (call under torch.inference_mode(); draft_step_check.py uses it too)."""
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    target, draft = (_Stepper(load_model(resolve(name), "cpu", "float32").eval(), context, 150000, gen)
                     for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"))
    return target, draft


def main() -> None:
    with torch.inference_mode():
        target, draft = qwen_steppers(CONTEXT)
        for k in (1, K, 64):  # warm-up
            timed(target, k)
        timed(draft, 1)
        ms: dict[str, list[float]] = {"probe": [], "decode": [], "second": []}
        for _ in range(REPEATS):
            timed(target, 32)
            timed(target, 48)
            ms["probe"].append(timed(target, K))
            for _ in range(DRAFT_STEPS):
                timed(draft, 1)
            ms["decode"].append(timed(target, K))
            ms["second"].append(timed(target, K))
    for what, values in ms.items():
        q = statistics.quantiles(values, n=4)
        print(f"target x{K} after {what:7s} n={len(values):2d} median {statistics.median(values):7.1f} ms "
              f"(q1 {q[0]:.1f}, q3 {q[2]:.1f})")


if __name__ == "__main__":
    main()

"""Is one draft step timed by itself a fair price for the draft steps of a decode? The Qwen pair
on CPU, 2 intra-op threads, OpenMP waiting passively as `simlab record` and `simlab live` do, each
model's KV cache holding CONTEXT random tokens, every forward the latency probe's own
(`simlab.record.latency._Stepper`). Each repeat runs a target verification of K tokens (what a
round, and the probe's k axis, runs just before drafting), then RUN one-token draft steps in a
row, each timed: the spread by position says whether the first step after a verification is
dearer than the rest, and the spread over repeats how many samples a stable price needs.

Usage: python results/live/qwen-probe/draft_step_check.py  (output: draft_step_check.txt beside it)
"""

import statistics  # noqa: I001  (long_verify_check sets OMP_WAIT_POLICY before torch is imported)

from long_verify_check import qwen_steppers, timed  # this folder: the script's own directory is on sys.path

import torch

CONTEXT = 128
K = 17
RUN = 8
REPEATS = 10


def main() -> None:
    with torch.inference_mode():
        target, draft = qwen_steppers(CONTEXT)
        timed(target, K)  # warm-up
        timed(draft, 1)
        by_position: list[list[float]] = [[] for _ in range(RUN)]
        for _ in range(REPEATS):
            timed(target, K)
            for position in range(RUN):
                by_position[position].append(timed(draft, 1))
    for position, values in enumerate(by_position, start=1):
        print(f"draft step {position} after a {K}-token verification: n={len(values)} "
              f"median {statistics.median(values):6.1f} ms, min {min(values):6.1f}, max {max(values):6.1f}")
    firsts = by_position[0]
    rest = [v for values in by_position[1:] for v in values]
    print(f"first step: median {statistics.median(firsts):.1f} ms; steps 2-{RUN}: median {statistics.median(rest):.1f} ms")
    spread = [statistics.median(firsts[i:i + 3]) for i in range(0, REPEATS - 2, 3)]
    print(f"medians of 3 first steps (the probe's samples per point): {', '.join(f'{s:.1f}' for s in spread)} ms")


if __name__ == "__main__":
    main()

"""Does a draft step cost more right after a big target forward? The Qwen pair on CPU, 2 intra-op
threads, OpenMP waiting passively as `simlab record` and `simlab live` do; KV caches of 200
random tokens, cropped back after each forward. A target forward of K tokens (untimed), then 6
draft steps timed one by one; prints the median per step over 10 repeats, for K = 1, 6 and 64.

Usage: python results/live/qwen-all/after_big_forward_check.py  (output of 2026-11-24
17:43-17:44 UTC on the AMD EPYC 2-core box, alone: after_big_forward_check.txt)
"""

import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from simlab.models.load import load_model, resolve  # noqa: E402

CONTEXT = 200


def main() -> None:
    torch.set_num_threads(2)
    target = load_model(resolve("qwen2.5-coder-1.5b"), "cpu", "float32").eval()
    draft = load_model(resolve("qwen2.5-coder-0.5b"), "cpu", "float32").eval()
    gen = torch.Generator().manual_seed(0)

    def step(model, cache, k: int) -> float:
        ids = torch.randint(0, 150000, (1, k), generator=gen)
        start = time.perf_counter()
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=k)
        seconds = time.perf_counter() - start
        cache.crop(CONTEXT)
        return seconds

    with torch.inference_mode():
        prompt = torch.randint(0, 150000, (1, CONTEXT), generator=gen)
        ct = target(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
        cd = draft(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
        for k in (1, 6, 64):  # warm-up
            step(target, ct, k)
        for _ in range(3):
            step(draft, cd, 1)
        ms: dict[int, list[list[float]]] = {}
        for _ in range(10):
            for k in (1, 6, 64):
                step(target, ct, k)
                ms.setdefault(k, []).append([step(draft, cd, 1) * 1000 for _ in range(6)])
    for k, rows in ms.items():
        medians = [round(statistics.median(r[i] for r in rows), 1) for i in range(6)]
        print(f"after target k={k:3d}: draft steps 1..6 median ms", medians)


if __name__ == "__main__":
    main()

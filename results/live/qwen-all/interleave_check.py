"""Is a forward's time the same interleaved with the other model's forwards (as the latency probe
times it) and back to back (as the live decoder runs it)? The Qwen pair on CPU, 2 intra-op
threads, OpenMP waiting passively as `simlab record` and `simlab live` do; KV caches of 200
random tokens, cropped back after each pattern. Prints the median (and quartiles) per pattern.

Usage: python results/live/qwen-all/interleave_check.py  (output of 2026-11-24 09:42-09:44 UTC on
the AMD EPYC 2-core box, alone: interleave_check.txt)
"""

import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from simlab.models.load import load_model, resolve  # noqa: E402

CONTEXT = 200


def crop_to(cache, n: int = CONTEXT) -> None:
    extra = cache.get_seq_length() - n
    if extra > 0:
        cache.crop(-extra)


def main() -> None:
    torch.set_num_threads(2)
    target = load_model(resolve("qwen2.5-coder-1.5b"), "cpu", "float32").eval()
    draft = load_model(resolve("qwen2.5-coder-0.5b"), "cpu", "float32").eval()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 150000, (1, CONTEXT), generator=gen)
    times: dict[str, list[float]] = {}

    def step(model, cache, k: int) -> float:
        ids = torch.randint(0, 150000, (1, k), generator=gen)
        start = time.perf_counter()
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=k)
        return time.perf_counter() - start

    def add(pattern: str, seconds: float) -> None:
        times.setdefault(pattern, []).append(seconds * 1000)

    with torch.inference_mode():
        ct = target(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
        cd = draft(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
        for _ in range(2):  # warm-up
            step(target, ct, 1), crop_to(ct), step(draft, cd, 1), crop_to(cd)
        for _ in range(3):
            for _ in range(8):  # as the probe: one forward of each kind in turn, cropped back each time
                add("interleaved target x1", step(target, ct, 1)), crop_to(ct)
                add("interleaved draft x1", step(draft, cd, 1)), crop_to(cd)
                add("interleaved target x6", step(target, ct, 6)), crop_to(ct)
            for _ in range(8):  # as sd rounds: 5 draft steps back to back, then a 6-token verification
                for _ in range(5):
                    add("rounds draft x1", step(draft, cd, 1))
                add("rounds target x6", step(target, ct, 6))
                crop_to(cd), crop_to(ct)
            for _ in range(24):  # as autoregressive decoding: target steps back to back
                add("ad target x1", step(target, ct, 1))
            crop_to(ct)
            for _ in range(24):  # draft steps back to back, nothing between
                add("solo-loop draft x1", step(draft, cd, 1))
            crop_to(cd)
    for pattern, ms in times.items():
        ms = sorted(ms)
        print(f"{pattern:24s} n={len(ms):3d} median {statistics.median(ms):7.1f} ms  "
              f"(q1 {ms[len(ms) // 4]:.1f}, q3 {ms[3 * len(ms) // 4]:.1f})")


if __name__ == "__main__":
    main()

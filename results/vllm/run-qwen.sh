#!/usr/bin/env bash
# The Qwen-pair vLLM runs of results/vllm/README.md, in order; every step resumes where it stopped
# (run it again after an interruption). About 1.5 hours on this project's 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=results/vllm/traces/qwen-coder-humaneval-vllm
simlab vllm record --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --prompts humaneval:4 \
    --max-new-tokens 128 --tail 8 --k 4 --batch 1,2,4 --probe-steps 6 --out "$T" --resume
simlab vllm run --trace "$T" --out results/vllm/qwen-k4 --k 4 --batch 1,4 --repeats 2
mkdir -p results/vllm/agreement-humaneval
simlab vllm record --trace traces/qwen-coder-humaneval --limit 8 --out results/vllm/agreement-humaneval

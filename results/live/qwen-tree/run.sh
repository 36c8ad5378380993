#!/usr/bin/env bash
# Tree policies decoding live on the Qwen pair (Qwen2.5-Coder 0.5B drafting for the 1.5B, fp32):
# the first 2 HumanEval prompts x 128 tokens, greedy, each policy at its defaults, predicted from
# traces/qwen-coder-tree (recorded on the measuring machine, so not re-probed). Resumable and
# REPROBE=1 as ../smollm2-all/run.sh, which runs it.
here="$(cd "$(dirname "$0")" && pwd)"
OUT="$here" TRACE=../../../traces/qwen-coder-tree TOKENS=128 PROMPTS=humaneval:2 POLICIES="eagle2 tree-static" \
    MODELS="--draft qwen2.5-coder-0.5b --target qwen2.5-coder-1.5b" exec "$here/../smollm2-all/run.sh"

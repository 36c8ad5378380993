#!/usr/bin/env bash
# Every policy that decodes live with a separate draft model, on the Qwen pair (Qwen2.5-Coder 0.5B
# drafting for the 1.5B, fp32): the first 8 HumanEval prompts x 128 tokens, greedy, each policy at
# its defaults, predicted from traces/qwen-coder-tree (recorded and probed on the measuring
# machine, so not re-probed). LayerSkip and DEL draft with the target's own exit layers and are
# measured on SmolLM2 (../smollm2-all). Resumable and REPROBE=1 as ../smollm2-all/run.sh, which
# runs it.
here="$(cd "$(dirname "$0")" && pwd)"
OUT="$here" TRACE=../../../traces/qwen-coder-tree TOKENS=128 PROMPTS=humaneval:8 \
    POLICIES=${POLICIES:-"sd pearl spide hf-heuristic hf-confidence svip adaedl dv specdecpp ags pacer
              spide-no-dyna-draft spide-no-para-verify llama-cpp"} \
    MODELS="--draft qwen2.5-coder-0.5b --target qwen2.5-coder-1.5b" exec "$here/../smollm2-all/run.sh"

#!/usr/bin/env bash
# The Qwen policies whose predictions drafted past the end token (../qwen-all: svip, adaedl,
# spide-no-para-verify, pacer), decoded again and predicted from traces/qwen-coder-tree after
# its rollouts were recorded again with the tail (the draft's continuation past the target's
# last token). Same setup as ../qwen-all: the first 8 HumanEval prompts x 128 tokens, greedy,
# each policy at its defaults; the trace was committed before the first decode. Resumable and
# REPROBE=1 as ../smollm2-all/run.sh, which runs it.
here="$(cd "$(dirname "$0")" && pwd)"
OUT="$here" TRACE=../../../traces/qwen-coder-tree TOKENS=128 PROMPTS=humaneval:8 \
    POLICIES=${POLICIES:-"svip spide-no-para-verify adaedl pacer"} \
    MODELS="--draft qwen2.5-coder-0.5b --target qwen2.5-coder-1.5b" exec "$here/../smollm2-all/run.sh"

#!/usr/bin/env bash
# The tree policies decoding live on SmolLM2-135M drafting with its own first 24 of 30 layers:
# the first 3 HumanEval prompts x 64 tokens, greedy, each policy at its defaults, predicted from
# traces/smollm2-tree (its latencies, tree-mask forwards included, re-probed on the measuring
# machine by the first policy run). Resumable and REPROBE=1 as ../smollm2-all/run.sh, which runs it.
here="$(cd "$(dirname "$0")" && pwd)"
OUT="$here" TRACE=../../../traces/smollm2-tree TOKENS=64 POLICIES="tree-static eagle2 ags-tree" \
    exec "$here/../smollm2-all/run.sh"

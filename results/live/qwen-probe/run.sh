#!/usr/bin/env bash
# every policy that decodes live but layerskip and del (self-speculative), in the README's row order
all="sd hf-heuristic hf-confidence svip adaedl dv specdecpp ags pacer pearl spide spide-no-dyna-draft
     spide-no-para-verify llama-cpp"
# The Qwen pair of ../qwen-all (the first 8 HumanEval prompts x 128 tokens, greedy, each policy at
# its defaults, predicted from traces/qwen-coder-tree), with each policy's forwards timed again in
# its own decoding process just before its decodes (simlab live --probe): the k values it verifies
# at two contexts, the draft step, co-running forwards for a parallel policy. Policies that verify
# at most 6 tokens (sd's gamma = 5, llama-cpp's 3 drafts) probe k = 1-6 only; the others every size
# their prediction verifies (k=auto: a CPU forward's cost is jagged in k, so sizes between probed
# ones are mispriced; sd, llama-cpp, adaedl, pearl, spide and hf-confidence ran before k=auto, with
# the k axis 1-17,24,32,48,64). Resumable as ../smollm2-all/run.sh.
here="$(cd "$(dirname "$0")" && pwd)"
probe_for() {
    case "$1" in
        sd|llama-cpp) echo 'k=1-6;ctx=128,256;repeats=5' ;;
        *) echo 'k=auto;ctx=128,256;repeats=3' ;;
    esac
}
export -f probe_for
OUT="${OUT:-$here}" TRACE=../../../traces/qwen-coder-tree TOKENS=128 PROMPTS=humaneval:8 \
    POLICIES=${POLICIES:-$all} \
    MODELS="--draft qwen2.5-coder-0.5b --target qwen2.5-coder-1.5b" exec "$here/../smollm2-all/run.sh"

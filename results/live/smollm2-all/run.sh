#!/usr/bin/env bash
# Every policy that decodes live, on SmolLM2-135M drafting with its own first 24 of 30 layers:
# the first 3 HumanEval prompts x 128 tokens, greedy, predicted from traces/smollm2-selfspec (its
# latencies re-probed once on the measuring machine, automatically). A policy whose .json exists
# is skipped, so an interrupted run continues where it stopped. REPROBE=1 measures the latencies
# again (the first policy run does it, before its first decode) on a machine that has drifted;
# PROBE (a --latency-probe spec, or a function probe_for POLICY that prints one) times each
# policy's forwards again in its own decoding process, just before its decodes (live --probe).
# Other runs of the same kind call this script with OUT (their directory), TRACE, TOKENS,
# POLICIES and, for other models, MODELS and PROMPTS set (../smollm2-tree/run.sh, ../qwen-tree/run.sh);
# EXTRA holds further options of simlab live (../qwen-reprobe/run.sh).
set -euo pipefail
cd "${OUT:-$(dirname "$0")}"
SIMLAB=${SIMLAB:-simlab}
TRACE=${TRACE:-../../../traces/smollm2-selfspec}
TOKENS=${TOKENS:-128}
MODELS=${MODELS:-"--target smollm2 --draft-layer 24"}
PROMPTS=${PROMPTS:-humaneval:3}
POLICIES=${POLICIES:-"sd hf-heuristic hf-confidence svip adaedl dv specdecpp ags pacer pearl spide
                      spide-no-dyna-draft spide-no-para-verify layerskip del llama-cpp"}
reprobe=()
[ "${REPROBE:-0}" = 1 ] && reprobe=(--reprobe)
for policy in $POLICIES; do
    [ -s "$policy.json" ] && continue
    probe=()
    if declare -F probe_for > /dev/null; then probe=(--probe "$(probe_for "$policy")")
    elif [ -n "${PROBE:-}" ]; then probe=(--probe "$PROBE"); fi
    # shellcheck disable=SC2086  # MODELS and EXTRA are several options
    "$SIMLAB" live $MODELS --prompts "$PROMPTS" --max-new-tokens "$TOKENS" \
        --policy "$policy" --trace "$TRACE" --out "$policy.csv" --log "$policy.log" \
        "${reprobe[@]}" "${probe[@]}" ${EXTRA:-} --json > "$policy.json.part"
    mv "$policy.json.part" "$policy.json"
    reprobe=()
done

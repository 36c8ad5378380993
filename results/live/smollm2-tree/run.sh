#!/usr/bin/env bash
# The tree policies decoding live on SmolLM2-135M drafting with its own first 24 of 30 layers:
# the first 3 HumanEval prompts x 64 tokens, greedy, each policy at its defaults, predicted from
# traces/smollm2-tree (its latencies, tree-mask forwards included, re-probed on the measuring
# machine by the first policy run). A policy whose .json exists is skipped, so an interrupted run
# continues where it stopped; REPROBE=1 measures the latencies again on a machine that has drifted.
set -euo pipefail
cd "$(dirname "$0")"
SIMLAB=${SIMLAB:-simlab}
reprobe=()
[ "${REPROBE:-0}" = 1 ] && reprobe=(--reprobe)
for policy in tree-static eagle2 ags-tree; do
    [ -s "$policy.json" ] && continue
    "$SIMLAB" live --target smollm2 --draft-layer 24 --prompts humaneval:3 --max-new-tokens 64 \
        --policy "$policy" --trace ../../../traces/smollm2-tree --out "$policy.csv" --log "$policy.log" \
        "${reprobe[@]}" --json > "$policy.json.part"
    mv "$policy.json.part" "$policy.json"
    reprobe=()
done

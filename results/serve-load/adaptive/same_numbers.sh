#!/bin/bash
# Serve the same loads from two checkouts of simlab and compare `simlab serve --json` byte for byte:
#   results/serve-load/adaptive/same_numbers.sh OLD_CHECKOUT NEW_CHECKOUT [PYTHON]
# Policies sd (K=4), vllm, sd + SmartSpec <= 8 and sd + a K-by-batch-size table, at 3 rates, on the
# shipped trace's CPU samples (max batch 8) and the H100 roofline (max batch 16), 60 requests each.
set -eu
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd); py=${3:-python}
out=$(mktemp -d)
for tree in "$old" "$new"; do
  mkdir -p "$out/$(basename "$tree")"
done
n=0; same=0
for rate in 0.05 0.2 1; do
  for spec in "sd --gamma 4" "vllm" "sd --gamma 8 --smartspec 8" "sd --gamma 8 --gamma-by-batch 1:6,4:4,16:2"; do
    for clock in "--max-batch 8" "--max-batch 16 --latency calibrate/roofline/qwen2.5-coder-0.5b-1.5b-h100.json"; do
      files=()
      for tree in "$old" "$new"; do
        f="$out/$(basename "$tree")/$n.json"
        # shellcheck disable=SC2086  # the policy and clock words are meant to split
        (cd "$tree" && PYTHONPATH="$tree" "$py" -m simlab serve --trace traces/qwen-coder-humaneval --policy $spec \
          --rate "$rate" --requests 60 $clock --json > "$f" 2>/dev/null)
        files+=("$f")
      done
      if cmp -s "${files[0]}" "${files[1]}"; then same=$((same + 1)); else echo "differs: --policy $spec --rate $rate $clock"; fi
      n=$((n + 1))
    done
  done
done
echo "$same of $n serve --json outputs byte-identical"
[ "$same" = "$n" ]

#!/usr/bin/env bash
# simlab serve --live on a quiet machine: SmolLM2-135M drafting with its own first 24 of 30
# layers, the first B HumanEval prompts of traces/smollm2-selfspec decoding as one batch,
# B = 1, 2, 4, 8, 64 tokens per request, sd (gamma 4) against ad alternating, 3 repeats each.
# The prediction comes from the shipped trace with the latencies in latency/ (re-probed on the
# measuring machine just before, with the batch axis: see README.md); ../predict.py wrote
# predicted.json from it before the first live decode. A batch whose CSV exists is skipped, so an
# interrupted run continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")"
SIMLAB=${SIMLAB:-simlab}
PYTHON=${PYTHON:-python}
TOKENS=64
if [ ! -d trace ]; then
    cp -r ../../../traces/smollm2-selfspec trace.part
    cp latency/latency.parquet latency/manifest.json trace.part/
    "$SIMLAB" trace rehash trace.part  # the manifest came with other tables: list the checksums of these
    mv trace.part trace
fi
[ -s predicted.json ] || "$PYTHON" ../predict.py trace "$TOKENS"
for B in 1 2 4 8; do
    [ -s "b$B.csv" ] && continue
    { echo "== B=$B $(date -u)  $(uptime)"; } >> run.log
    "$SIMLAB" serve --trace trace --live --max-batch "$B" --live-tokens "$TOKENS" --gamma 4 --repeats 3 \
        --out "b$B.part.csv" 2>&1 | tee -a run.log
    mv "b$B.part.csv" "b$B.csv"
    { echo "== end B=$B $(date -u)  $(uptime)"; } >> run.log
done

#!/usr/bin/env bash
# simlab serve --live on a quiet machine, for the run described by DIR/config.sh:
#   SHIPPED      the shipped trace the requests come from
#   RECORD_ARGS  (array) the `simlab record` arguments that trace was recorded with (for --resume)
#   PROBE        the latency points to measure again, with the batch axis
#   GAMMA, TOKENS  sd's draft length; tokens per request (the trace is cut to it)
# The first B prompts of the trace decode as one batch, B = 1, 2, 4, 8, sd against ad
# alternating, 3 repeats each.
# 1. The trace's latencies are measured again on this machine, into a copy (its rollouts kept as
#    recorded: only the latencies change); the samples and manifest land in DIR/latency/.
# 2. DIR/trace/ is the shipped trace with those latencies; predict.py writes DIR/predicted.json
#    from it before the first live decode.
# 3. The live decodes, one CSV per batch size (DIR/bB.csv), logged to DIR/run.log.
# With REPROBE (a --latency-probe spec) and LATENCY (an earlier run's latency/) in config.sh, step 1
# is skipped and DIR/trace/ takes LATENCY's samples; `serve --live --reprobe` then times each batch
# size's forwards again in the decoding process, just before its decodes, and predicts from them
# (the prediction is in DIR/bB.csv, the samples in DIR/bB.latency.csv).
# Every step is skipped when its output exists, so an interrupted run continues where it stopped;
# BATCHES="2 4" runs some batch sizes only.
# Usage: results/serve-live/run.sh results/serve-live/qwen
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$1"
. ./config.sh
SIMLAB=${SIMLAB:-simlab}
PYTHON=${PYTHON:-python}
LATENCY=${LATENCY:-latency}
if [ -z "${REPROBE:-}" ] && [ ! -d latency ]; then
    rm -rf probe.part
    cp -r "$SHIPPED" probe.part
    { echo "== probe $(date -u)  $(uptime)"; } >> run.log
    "$SIMLAB" record "${RECORD_ARGS[@]}" --out probe.part --resume --reprobe --keep-rollouts \
        --latency-probe "$PROBE" --quiet 2>&1 | tee -a run.log
    mkdir -p latency.part
    cp probe.part/latency.parquet probe.part/manifest.json latency.part/
    mv latency.part latency
    rm -rf probe.part
fi
if [ ! -d trace ]; then
    cp -r "$SHIPPED" trace.part
    cp "$LATENCY/latency.parquet" "$LATENCY/manifest.json" trace.part/
    "$SIMLAB" trace rehash trace.part  # the manifest came with other tables: list the checksums of these
    mv trace.part trace
fi
[ -n "${REPROBE:-}" ] || [ -s predicted.json ] || "$PYTHON" "$HERE/predict.py" trace "$TOKENS" "$GAMMA"
for B in ${BATCHES:-1 2 4 8}; do
    [ -s "b$B.csv" ] && continue
    { echo "== B=$B $(date -u)  $(uptime)"; } >> run.log
    "$SIMLAB" serve --trace trace --live --max-batch "$B" --live-tokens "$TOKENS" --gamma "$GAMMA" --repeats 3 \
        ${REPROBE:+--reprobe "$REPROBE"} --out "b$B.part.csv" 2>&1 | tee -a run.log
    [ -z "${REPROBE:-}" ] || mv "b$B.part.latency.csv" "b$B.latency.csv"
    mv "b$B.part.csv" "b$B.csv"
    { echo "== end B=$B $(date -u)  $(uptime)"; } >> run.log
done

#!/usr/bin/env bash
# simlab serve --live on the Qwen pair (Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B, fp32, CPU):
# the first B HumanEval prompts of traces/qwen-coder-humaneval decoding as one batch, B = 1, 2, 4, 8,
# 64 tokens per request, sd (gamma 4) against ad alternating, 3 repeats each.
# 1. The trace's latencies are measured again on this machine with the batch axis, into a copy
#    (its rollouts kept as recorded: only the latencies change); the samples and manifest land in
#    latency/, from which trace/ is rebuilt.
# 2. ../predict.py writes predicted.json from trace/ before the first live decode.
# 3. The live decodes, one CSV per batch size.
# Every step is skipped when its output exists, so an interrupted run continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")"
SIMLAB=${SIMLAB:-simlab}
PYTHON=${PYTHON:-python}
TOKENS=64
SHIPPED=../../../traces/qwen-coder-humaneval
PROBE='k=1-5;ctx=128,256;repeats=5;corun=no;batch=1,2,4,8;batch_k=1-5'
if [ ! -d latency ]; then
    rm -rf probe.part
    cp -r "$SHIPPED" probe.part
    { echo "== probe $(date -u)  $(uptime)"; } >> run.log
    "$SIMLAB" record --draft qwen2.5-coder-0.5b --target qwen2.5-coder-1.5b --prompts humaneval:40 \
        --max-new-tokens 128 --out probe.part --resume --reprobe --keep-rollouts --latency-probe "$PROBE" \
        --quiet 2>&1 | tee -a run.log
    mkdir -p latency.part
    cp probe.part/latency.parquet probe.part/manifest.json latency.part/
    mv latency.part latency
    rm -rf probe.part
fi
if [ ! -d trace ]; then
    cp -r "$SHIPPED" trace.part
    cp latency/latency.parquet latency/manifest.json trace.part/
    mv trace.part trace
fi
[ -s predicted.json ] || "$PYTHON" ../predict.py trace "$TOKENS" 4
for B in 1 2 4 8; do
    [ -s "b$B.csv" ] && continue
    { echo "== B=$B $(date -u)  $(uptime)"; } >> run.log
    "$SIMLAB" serve --trace trace --live --max-batch "$B" --live-tokens "$TOKENS" --gamma 4 --repeats 3 \
        --out "b$B.part.csv" 2>&1 | tee -a run.log
    mv "b$B.part.csv" "b$B.csv"
    { echo "== end B=$B $(date -u)  $(uptime)"; } >> run.log
done

#!/usr/bin/env bash
# ../qwen-probe's runs (the Qwen pair, the first 8 HumanEval prompts x 128 tokens, greedy, predicted
# from traces/qwen-coder-tree, each policy's forwards timed in its own decoding process first) with
# --reprobe-drift 0.03: after a prompt whose autoregressive baselines ran more than 3% off their
# price, the same forwards are timed again and the prompts that follow are priced from them.
# Resumable as ../smollm2-all/run.sh.
here="$(cd "$(dirname "$0")" && pwd)"
OUT="$here" POLICIES=${POLICIES:-sd} EXTRA="--reprobe-drift 0.03" exec "$here/../qwen-probe/run.sh"

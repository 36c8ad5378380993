# The Qwen pair again (Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B, fp32, CPU; run with ../run.sh),
# the requests and settings of qwen-reprobe-2/ at batch size 16.
SHIPPED=$HERE/../../traces/qwen-coder-humaneval
LATENCY=$HERE/qwen/latency
REPROBE='k=1-5;ctx=128,256;repeats=7'
GAMMA=4
TOKENS=64
BATCHES=16

# The Qwen pair: Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B, fp32, CPU (run with ../run.sh).
SHIPPED=$HERE/../../traces/qwen-coder-humaneval
RECORD_ARGS=(--draft qwen2.5-coder-0.5b --target qwen2.5-coder-1.5b --prompts humaneval:40 --max-new-tokens 128)
PROBE='k=1-5;ctx=128,256;repeats=5;corun=no;batch=1,2,4,8;batch_k=1-5'
GAMMA=4
TOKENS=64

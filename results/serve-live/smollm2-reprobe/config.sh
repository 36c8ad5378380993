# SmolLM2 self-speculative (exit layer 24 drafting for all 30 layers, fp32, CPU; run with ../run.sh), the
# requests and settings of quiet/, each batch size's forwards timed again just before its decodes.
SHIPPED=$HERE/../../traces/smollm2-selfspec
LATENCY=$HERE/quiet/latency
REPROBE='k=1-5;ctx=128,256;repeats=7'
GAMMA=4
TOKENS=64

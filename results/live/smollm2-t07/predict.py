"""The T = 0.7 prediction for SmolLM2 sd γ=3 on humaneval:2, made before the live runs."""
import datetime
import json
import os

from simlab.sim.spread import sampling_spread
from simlab.trace.io import read_trace

D = "results/live/smollm2-t07/traces/seed"
trs = [read_trace(D + str(s)) for s in range(4)]
trs = [t.select_prompts(t.prompts[t.prompts["source"].isin(sorted(t.prompts["source"])[:0] or list(trs[0].prompts.sort_values("prompt_id")["source"][:2]))]["prompt_id"]) for t in trs]
out = {"made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "load": os.getloadavg(),
       "policy": "sd", "params": {"gamma": 3}, "prompts": list(trs[0].prompts["source"])}
for k in (1, 4):
    sp = sampling_spread(trs[:k], "sd", {"gamma": 3}, seeds=20)
    out[f"continuations_{k}"] = {"method": sp.describe(), **sp.to_dict()}
print(json.dumps(out, indent=1))

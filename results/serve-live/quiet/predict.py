"""Write predicted.json: `simlab serve`'s prediction for every batch of run.sh, made (and committed)
before the live decodes it is compared with. Usage: python predict.py TRACE TOKENS"""
import json
import sys
from pathlib import Path

from simlab.serve_live import cut_trace, predicted
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace

trace, tokens = read_trace(Path(sys.argv[1])), int(sys.argv[2])
sim = Simulator(cut_trace(trace, tokens))
out = {"trace_hardware": trace.manifest.hardware, "tokens_per_request": tokens, "batches": {}}
for batch in (1, 2, 4, 8):
    out["batches"][batch] = {name: predicted(sim, batch, name, kw)
                             for name, kw in (("sd", {"gamma": 4}), ("ad", {}))}
Path("predicted.json").write_text(json.dumps(out, indent=1) + "\n")

"""Write predicted.json (in the current directory): `simlab serve`'s prediction for every batch
that a run.sh here decodes live, made (and committed) before the decodes it is compared with.
Usage: python predict.py TRACE TOKENS [GAMMA] (GAMMA: sd's draft length, 4 by default)"""
import json
import sys
from pathlib import Path

from simlab.live.serve import cut_trace, predicted
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace

trace, tokens = read_trace(Path(sys.argv[1])), int(sys.argv[2])
gamma = int(sys.argv[3]) if len(sys.argv) > 3 else 4
sim = Simulator(cut_trace(trace, tokens))
out = {"trace_hardware": trace.manifest.hardware, "tokens_per_request": tokens, "batches": {}}
for batch in (1, 2, 4, 8):
    out["batches"][batch] = {name: predicted(sim, batch, name, kw)
                             for name, kw in (("sd", {"gamma": gamma}), ("ad", {}))}
Path("predicted.json").write_text(json.dumps(out, indent=1) + "\n")

"""What each run here would have predicted from its first probe alone (no re-probe): the prompts
priced from that probe's samples (``probe`` 1 in POLICY.latency.csv), set beside the measured
speedups and the errors of the re-priced prediction the run reported. Usage:
``python first_probe_only.py [POLICY ...]`` (default: every POLICY.json here)."""

import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from simlab.record.reprobe import with_points
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace

here = Path(__file__).resolve().parent
for policy in sys.argv[1:] or sorted(p.stem for p in here.glob("*.json")):
    table = pd.read_csv(here / f"{policy}.csv")
    samples = pd.read_csv(here / f"{policy}.latency.csv")
    trace = read_trace(here / "../../../traces/qwen-coder-tree")
    first = replace(trace, latency=with_points(trace.latency, samples[samples["probe"] == 1]))
    predicted = Simulator(first, topology="one-device").run(policy, with_cost=False).per_prompt
    rows = table.merge(predicted[["prompt_id", "speedup", "wall_time_s", "ad_wall_time_s"]], on="prompt_id")
    error_first = rows["speedup"] / rows["measured_speedup"] - 1
    print(f"{policy}: re-probes {int(table['probe'].max()) - 1}")
    print(pd.DataFrame({"prompt": rows["source"], "probe": rows["probe"], "measured": rows["measured_speedup"],
                        "re-priced": rows["error_speedup"], "first probe only": error_first}).to_string(
        index=False, float_format=lambda x: f"{x:+.1%}" if abs(x) < 0.5 else f"{x:.3f}"))
    overall = rows["ad_wall_time_s"].sum() / rows["wall_time_s"].sum() / (
        rows["measured_ad_wall_time_s"].sum() / rows["measured_wall_time_s"].sum()) - 1
    reported = rows["predicted_ad_wall_time_s"].sum() / rows["predicted_wall_time_s"].sum() / (
        rows["measured_ad_wall_time_s"].sum() / rows["measured_wall_time_s"].sum()) - 1
    print(f"overall speedup error: re-priced {reported:+.1%}, first probe only {overall:+.1%}; median |error| per "
          f"prompt: re-priced {rows['error_speedup'].abs().median():.1%}, first probe only "
          f"{error_first.abs().median():.1%}")

"""What each run here would have predicted from its first probe alone (no re-probe): the prompts
priced from that probe's samples (``probe`` 1 in POLICY.latency.csv), set beside the measured
speedups and the errors of the re-priced prediction the run reported. Usage:
``python first_probe_only.py [POLICY ...]`` (default: every POLICY.json here); ``--table``: one
markdown row per run, as the README's table shows them."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from simlab.record.reprobe import with_points
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace

here = Path(__file__).resolve().parent


def compared(policy: str) -> tuple[pd.DataFrame, dict]:
    """Per prompt: the run's rows with the first probe's prediction (``first_*``) beside them;
    and the run's figures, re-priced (as reported) and from the first probe alone."""
    table = pd.read_csv(here / f"{policy}.csv")
    if "probe" not in table:  # a run that never re-probed, from before the column was always written
        table["probe"] = 1
    samples = pd.read_csv(here / f"{policy}.latency.csv")
    trace = read_trace(here / "../../../traces/qwen-coder-tree")
    first = replace(trace, latency=with_points(trace.latency, samples[samples["probe"] == 1]))
    predicted = Simulator(first, topology="one-device").run(policy, with_cost=False).per_prompt
    rows = table.merge(predicted[["prompt_id", "speedup", "wall_time_s", "ad_wall_time_s"]]
                       .add_prefix("first_").rename(columns={"first_prompt_id": "prompt_id"}), on="prompt_id")
    rows["first_error_speedup"] = rows["first_speedup"] / rows["measured_speedup"] - 1
    measured = rows["measured_ad_wall_time_s"].sum() / rows["measured_wall_time_s"].sum()
    run = json.loads((here / f"{policy}.json").read_text())
    figures = {"reprobes": run["reprobes"], "measured": run["measured_speedup"], "predicted": run["predicted_speedup"],
               "error": run["error_speedup"], "median": rows["error_speedup"].abs().median(),
               "median_tokens_per_s": run["median_abs_error_tokens_per_s"],
               "first_error": rows["first_ad_wall_time_s"].sum() / rows["first_wall_time_s"].sum() / measured - 1,
               "first_median": rows["first_error_speedup"].abs().median(),
               "target_calls_equal": f"{run['target_calls_equal']}/{run['prompts']}",
               "lossless": f"{run['lossless']}/{run['prompts']}", "disturbed": f"{run['disturbed']}/{run['prompts']}"}
    return rows, figures


def markdown_row(policy: str, f: dict) -> str:
    return (f"| `{policy}` | {f['reprobes']} | {f['measured']:.3f}× | {f['predicted']:.3f}× | {f['error']:+.1%} | "
            f"{f['median']:.1%} / {f['median_tokens_per_s']:.1%} | {f['first_error']:+.1%} | {f['first_median']:.1%} | "
            f"{f['target_calls_equal']} | {f['lossless']} | {f['disturbed']} |")


if __name__ == "__main__":
    as_table = "--table" in sys.argv
    policies = [a for a in sys.argv[1:] if a != "--table"] or sorted(p.stem for p in here.glob("*.json"))
    for policy in policies:
        rows, f = compared(policy)
        if as_table:
            print(markdown_row(policy, f))
            continue
        print(f"{policy}: re-probes {f['reprobes']}")
        print(pd.DataFrame({"prompt": rows["source"], "probe": rows["probe"], "measured": rows["measured_speedup"],
                            "re-priced": rows["error_speedup"], "first probe only": rows["first_error_speedup"]})
              .to_string(index=False, float_format=lambda x: f"{x:+.1%}" if abs(x) < 0.5 else f"{x:.3f}"))
        print(f"overall speedup error: re-priced {f['error']:+.1%}, first probe only {f['first_error']:+.1%}; median "
              f"|error| per prompt: re-priced {f['median']:.1%}, first probe only {f['first_median']:.1%}")

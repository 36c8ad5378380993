"""What each modelling choice does to the prediction of `qwen-arrivals-r0.25` (llama-server -np 4
under 16 Poisson arrivals), from the run's own re-probed latencies (`.latency.csv`), against the
two measured rounds: the prediction as made (prompts prefilled in the running requests' step,
priced from the timed prefills), the prefill-first scheduler (a prefill forward of its own before
the step, vLLM's order), and prefills priced as k-token verifications (the timed prefill rows left
out). Usage: python results/llama-server/arrivals_check.py > results/llama-server/arrivals_check.txt
"""

from dataclasses import replace
from pathlib import Path

import pandas as pd

from simlab.engines.llama_cpp.server import Drafting
from simlab.latency.batch import BatchLatency
from simlab.live.llama_server import N_BATCH, policy_of, server_view
from simlab.serve.run import ServeConfig, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.serve.workload import poisson_arrivals
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace

HERE = Path(__file__).resolve().parent
RUN = "qwen-arrivals-r0.25"


def main() -> None:
    measured = pd.read_csv(HERE / f"{RUN}.csv")
    latency = pd.read_csv(HERE / f"{RUN}.latency.csv")
    trace = read_trace(HERE.parents[1] / "traces" / "qwen-coder-llama-cpp")
    arrivals = poisson_arrivals(0.25, 16, 0)
    policy, params = policy_of(Drafting(4))
    by_round = measured.groupby("repeat")[["measured_ttft_s", "measured_e2e_s"]].mean()
    print(f"measured, rounds 1 and 2: mean TTFT {', '.join(f'{x:.2f}' for x in by_round['measured_ttft_s'])} s; "
          f"mean end to end {', '.join(f'{x:.2f}' for x in by_round['measured_e2e_s'])} s")
    print("| prediction | mean TTFT (s) | error vs rounds 1, 2 | mean end to end (s) | error vs rounds 1, 2 "
          "| median per-request TTFT error |\n|---|---|---|---|---|---|")
    timed = latency[~latency["op"].isin(["target_prefill", "draft_prefill"])]
    for label, lat, mixed in (("as made: prompts in the step's verification, timed prefills", latency, True),
                              ("prefill-first (a forward of its own), timed prefills", latency, False),
                              ("prompts in the step's verification, prefills priced as verifications", timed, True)):
        sim = Simulator(server_view(replace(trace, latency=lat), 64))
        run = serve_once(sim, arrivals, ServeConfig(policy, params, Scheduler(4, N_BATCH, mixed)), policy, params,
                         latency=BatchLatency(sim.latency))
        ttft = pd.Series({r.request_id: r.first_token - r.arrival for r in run.requests})
        e2e = pd.Series({r.request_id: r.finish - r.arrival for r in run.requests})
        per_request = [(ttft / g.set_index("request")["measured_ttft_s"] - 1).abs().median()
                       for _, g in measured.groupby("repeat")]
        print(f"| {label} | {ttft.mean():.2f} | "
              + ", ".join(f"{ttft.mean() / x - 1:+.1%}" for x in by_round["measured_ttft_s"])
              + f" | {e2e.mean():.2f} | " + ", ".join(f"{e2e.mean() / x - 1:+.1%}" for x in by_round["measured_e2e_s"])
              + " | " + ", ".join(f"{x:.1%}" for x in per_request) + " |")


if __name__ == "__main__":
    main()

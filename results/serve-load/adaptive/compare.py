"""vLLM's adaptive verification against SmartSpec, a tuned K-by-batch-size table and fixed K,
across request rates, on shipped traces and three clocks (simulated; README.md beside this file).

    python results/serve-load/adaptive/compare.py            # writes compare.csv, prints compare.md's table
    python results/serve-load/adaptive/compare.py --quick    # one rate per setup, 200 requests: a smoke run
    python results/serve-load/adaptive/compare.py --fit > results/serve-load/adaptive/fit.txt

Every served row is appended to compare.csv as it is done and a rerun skips the rows already there,
so an interrupted run resumes. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from simlab.cli.simulate import load_inputs
from simlab.common.locations import ROOT
from simlab.serve.adaptive_verify import feature
from simlab.serve.batch_policy import BatchSpec
from simlab.serve.run import ServeConfig, serve_once
from simlab.serve.scheduler import Scheduler
from simlab.serve.tune import tune
from simlab.serve.workload import poisson_arrivals
from simlab.sim.run import Simulator

HERE = Path(__file__).resolve().parent
K = 8  # the longest draft: SmartSpec's range, the tuned table's, adaptive verification's drafts
TOKEN_BUDGET = 100_000  # admission bounded by --max-batch only
# (name, trace, latency profile or None for the trace's CPU samples, max batch, rates, requests)
SETUPS = [
    ("cpu", "qwen-coder-humaneval", None, 8, (0.01, 0.02, 0.05, 0.1), 500),
    ("cpu", "qwen-coder-mtbench", None, 8, (0.01, 0.02, 0.05, 0.1), 500),
    ("h100-hf-eager", "qwen-coder-humaneval", "calibrate/roofline/qwen2.5-coder-0.5b-1.5b-h100.json", 64,
     (2.0, 5.0, 10.0, 20.0), 3000),
    ("h100-hf-eager", "qwen-coder-mtbench", "calibrate/roofline/qwen2.5-coder-0.5b-1.5b-h100.json", 64,
     (2.0, 5.0, 10.0, 20.0), 3000),
    ("h100-ideal", "qwen-coder-humaneval", "results/serve-load/adaptive/qwen2.5-coder-0.5b-1.5b-h100-ideal.json", 256,
     (100.0, 300.0, 1000.0, 3000.0), 12000),
    ("h100-ideal", "qwen-coder-mtbench", "results/serve-load/adaptive/qwen2.5-coder-0.5b-1.5b-h100-ideal.json", 256,
     (100.0, 300.0, 1000.0, 3000.0), 12000),
]
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def configs(table: str):
    """(label, policy, params, batch-level spec) of every served configuration."""
    return [("ad (no SD)", "ad", {}, BatchSpec()),
            ("fixed K=4", "sd", {"gamma": 4}, BatchSpec()),
            (f"fixed K={K}", "sd", {"gamma": K}, BatchSpec()),
            (f"tuned table ≤{K}", "sd", {"gamma": K}, BatchSpec(gamma_by_batch=table)),
            (f"SmartSpec ≤{K}", "sd", {"gamma": K}, BatchSpec(smartspec=K)),
            (f"adaptive verify K={K}", "sd", {"gamma": K}, BatchSpec(adaptive_verify=K))]


def row(setup, trace, sim, label, policy, params, spec, max_batch, rate, requests, table):
    start = time.process_time()
    run = serve_once(sim, poisson_arrivals(rate, requests, 0), ServeConfig(policy, params, Scheduler(max_batch, TOKEN_BUDGET),
                                                                            spec), policy, params)
    s, stats = run.summary, run.stats
    drafted = sum(r.counts.drafted for r in run.requests)
    verified = sum(r.counts.verified for r in run.requests)
    return {"clock": setup, "trace": trace, "max_batch": max_batch, "rate_per_s": rate, "requests": requests,
            "config": label, "table": table if spec.gamma_by_batch else "",
            "throughput_tokens_per_s": s["throughput_tokens_per_s"], "tpot_p50_s": s["tpot_p50_s"],
            "e2e_mean_s": s["e2e_mean_s"], "mean_batch": stats.batch_sizes / max(1, stats.decode_steps),
            "engine_steps": stats.steps, "drafted": drafted, "verified_share": verified / drafted if drafted else 0.0,
            "acceptance_rate": s["acceptance_rate"], "cpu_seconds": time.process_time() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="One rate per setup and 200 requests: a smoke run.")
    ap.add_argument("--out", type=Path, default=HERE / "compare.csv", help="CSV to append rows to (resumed).")
    ap.add_argument("--fit", action="store_true", help="Print what the acceptance fit learnt on the CPU traces at "
                    "0.1 requests/s (fit.txt), and nothing else.")
    args = ap.parse_args()
    if args.fit:
        return fit_report()
    done = pd.read_csv(args.out) if args.out.is_file() else pd.DataFrame()
    seen = {tuple(r) for r in done[["clock", "trace", "rate_per_s", "config"]].itertuples(index=False)} if len(done) else set()
    for setup, trace, latency, max_batch, rates, requests in SETUPS:
        if args.quick:
            rates, requests = rates[-1:], 200
        tr, lat = load_inputs(ROOT / "traces" / trace, ROOT / latency if latency else None)
        sim = Simulator(tr, lat)
        table = tune(sim, [b for b in BATCHES if b <= max_batch], K, token_budget=TOKEN_BUDGET).table()
        print(f"{setup} {trace}: tuned table {table}", file=sys.stderr, flush=True)
        for rate in rates:
            for label, policy, params, spec in configs(table):
                if (setup, trace, rate, label) in seen:
                    continue
                out = row(setup, trace, sim, label, policy, params, spec, max_batch, rate, requests, table)
                pd.DataFrame([out]).to_csv(args.out, mode="a", header=not args.out.is_file(), index=False)
                print(f"{setup} {trace} rate {rate}: {label}: {out['throughput_tokens_per_s']:.1f} tok/s, "
                      f"TPOT p50 {out['tpot_p50_s'] * 1e3:.2f} ms, verified {out['verified_share']:.2f} "
                      f"({out['cpu_seconds']:.1f} CPU s)", file=sys.stderr, flush=True)
    print(markdown(pd.read_csv(args.out)))


def fit_report() -> None:
    """Adaptive verification's fit after serving each CPU setup's highest rate: its coefficients,
    what it predicts for a draft of confidence 0.9 at each position, and its calibration: the mean
    probability it predicted for the positions the target judged (when they were drafted) beside
    the share of them accepted."""
    for setup, trace, latency, max_batch, rates, requests in SETUPS[:2]:
        tr, lat = load_inputs(ROOT / "traces" / trace, None)
        spec = BatchSpec(adaptive_verify=K)
        run = serve_once(Simulator(tr, lat), poisson_arrivals(rates[-1], requests, 0),
                         ServeConfig("sd", {"gamma": K}, Scheduler(max_batch, TOKEN_BUDGET), spec), "sd", {"gamma": K})
        fit = run.batch.fit
        print(f"{setup} {trace}, {rates[-1]} requests/s, {requests} requests: {fit.refits} refits, slope "
              f"{fit.slope:.3f}, intercepts {' '.join(f'{b:.2f}' for b in fit.bias)}")
        print("  predicted at confidence 0.9:", " ".join(f"{p:.3f}" for p in fit.probabilities([feature(0.9)] * K)))
        print("  judged positions, predicted:", " ".join(f"{p / n:.3f}" for p, n in zip(fit.seen_predicted, fit.seen)))
        print("  judged positions, accepted: ", " ".join(f"{a / n:.3f}" for a, n in zip(fit.seen_accepted, fit.seen)),
              f"(of {' '.join(map(str, fit.seen))})")


def markdown(frame: pd.DataFrame) -> str:
    """One table per clock and trace: TPOT p50 (ms) and throughput (tokens/s) by configuration and rate."""
    parts = []
    for (clock, trace), part in frame.groupby(["clock", "trace"], sort=False):
        rates = sorted(part["rate_per_s"].unique())
        mb = part["max_batch"].iat[0]
        parts.append(f"**{clock}, {trace}, max batch {mb}** — TPOT p50 ms / throughput tokens/s (verified share of drafts)\n")
        parts.append("| config | " + " | ".join(f"{r:g} req/s" for r in rates) + " |")
        parts.append("|---|" + "---|" * len(rates))
        for label, rows in part.groupby("config", sort=False):
            cells = []
            for r in rates:
                x = rows[rows["rate_per_s"] == r]
                if x.empty:
                    cells.append("")
                    continue
                x = x.iloc[0]
                share = f" ({x.verified_share:.2f})" if x.drafted and x.verified_share < 1 else ""
                cells.append(f"{_figure(x.tpot_p50_s * 1e3)} / {_figure(x.throughput_tokens_per_s)}{share}")
            parts.append(f"| {label} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def _figure(v: float) -> str:
    """Three significant figures, written out in full (1,285, not 1.28e+03)."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


if __name__ == "__main__":
    main()

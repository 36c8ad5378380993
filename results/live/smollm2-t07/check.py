"""Each live run of this directory against the committed T = 0.7 predictions.

Usage: python results/live/smollm2-t07/check.py. ``prediction.json`` (resampled percentile
range) was made before runs 1-5, ``prediction-t.json`` (Student's t predictive interval,
simlab.sim.spread) after them and before runs 6-10. Target calls are compared only where the
run generated the predicted number of tokens (a sampled continuation may end early).
"""

import json
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
METRICS = ("mean_acceptance_length", "tokens_per_target_call", "target_calls")


def verdicts(prediction: dict, run: int) -> dict[str, str]:
    table = pd.read_csv(HERE / f"live{run}.csv")
    tokens = int(table["measured_tokens"].sum())
    measured = {
        "mean_acceptance_length": json.loads((HERE / f"live{run}.json").read_text())["measured_mean_acceptance_length"],
        "tokens_per_target_call": tokens / table["measured_target_calls"].sum(),
        "target_calls": float(table["measured_target_calls"].sum()),
    }
    out = {}
    for m in METRICS:
        iv = prediction[m]
        if m == "target_calls" and tokens != round(prediction["tokens"]["mean"]):
            out[m] = f"{measured[m]:.0f} (n/a: {tokens} tokens)"
            continue
        out[m] = f"{measured[m]:.3f} ({'in' if iv['low'] <= measured[m] <= iv['high'] else 'OUT'})"
    return out


def main() -> None:
    for name, runs in (("prediction.json", range(1, 6)), ("prediction-t.json", range(1, 11))):
        prediction = json.loads((HERE / name).read_text())["continuations_4"]
        print(f"{name}: {prediction['method']}")
        print("| run | " + " | ".join(METRICS) + " |")
        print("|---|" + "---|" * len(METRICS))
        print("| predicted | " + " | ".join(f"{prediction[m]['mean']:.3f} [{prediction[m]['low']:.3f}, "
                                           f"{prediction[m]['high']:.3f}]" for m in METRICS) + " |")
        for run in runs:
            if (HERE / f"live{run}.json").exists():
                v = verdicts(prediction, run)
                print(f"| live `--seed {run}` | " + " | ".join(v[m] for m in METRICS) + " |")
        print()


if __name__ == "__main__":
    main()

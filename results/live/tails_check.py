"""Committed live decodes against their trace as it is now, its rollouts recorded again with the tail.

A check made after the fact, not a prediction: the decodes of a run directory were predicted
from their trace (the ``trace`` of each policy's JSON) as it was before its rollouts were
recorded again with the tail (the draft's continuation past the target's last token,
``simlab.record.rollouts``) and, where it says so, longer; same tokens, same latencies. This
replays every policy on the trace as it is now and sets, per policy, the committed
prediction's errors beside the replay's: overall speedup error, median per-prompt error,
prompts over 10%, and prompts whose drafted tokens equal the decode's (``rounds-N.json`` of the
decode log; serial rounds only). A prompt whose replay did not change must keep the committed
prediction exactly; the last column says it does (the largest difference in predicted wall
time over those prompts).

Run from the repository root: ``python results/live/tails_check.py results/live/qwen-all``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from simlab.sim.run import Simulator
from simlab.trace import read_trace


def live_drafted(run: Path, policy: str, prompt_id: int) -> int | None:
    """Draft tokens of a decode's serial rounds; None where it ran parallel rounds, whose log
    counts a window's tokens otherwise than the simulator's ``drafted``."""
    rounds = json.loads((run / f"{policy}.log" / f"rounds-{prompt_id}.json").read_text())
    return None if any(r["mode"] != "serial" for r in rounds) else sum(r["drafted"] for r in rounds)


def check(directory: Path, policy: str) -> dict:
    run = json.loads((directory / f"{policy}.json").read_text())
    live = pd.read_csv(directory / f"{policy}.csv").set_index("prompt_id")
    trace = read_trace(next(p for p in (directory / run["trace"], Path(run["trace"])) if p.exists()))
    sim = Simulator(trace.select_prompts(live.index))  # as simlab live simulates: the run's prompts only
    replay = sim.run(policy, run["params"]).per_prompt.set_index("prompt_id").loc[live.index]
    error = replay["speedup"] / live["measured_speedup"] - 1
    overall = replay["ad_wall_time_s"].sum() / replay["wall_time_s"].sum() / run["measured_speedup"] - 1
    drafted = [live_drafted(directory, policy, pid) for pid in live.index]
    moved = (replay["wall_time_s"] - live["predicted_wall_time_s"]).abs()
    same = moved < 0.05
    return {
        "policy": policy,
        "overall committed": f"{run['error_speedup']:+.1%}",
        "overall replayed": f"{overall:+.1%}",
        "median committed": f"{live['error_speedup'].abs().median():.1%}",
        "median replayed": f"{error.abs().median():.1%}",
        ">10% committed": int((live["error_speedup"].abs() > 0.10).sum()),
        ">10% replayed": int((error.abs() > 0.10).sum()),
        "drafted equal": "n/a (parallel)" if None in drafted else
                         f"{sum(int(p) == d for p, d in zip(replay['drafted'], drafted))}/{len(live)}",
        "prompts moved": ",".join(str(p) for p in live.index[~same]) or "-",
        "unmoved max diff s": f"{moved[same].max():.4f}",
    }


def main() -> None:
    directory = Path(sys.argv[1])
    rows = [check(directory, p.stem) for p in sorted(directory.glob("*.json"))]
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row.values()) + " |")


if __name__ == "__main__":
    main()

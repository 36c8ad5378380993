"""Print the README's table of every live policy on SmolLM2 from this directory's runs, or of
another directory of runs made the same way (a run.sh and one POLICY.json per policy).

Usage: python results/live/smollm2-all/table.py [DIRECTORY] [--forwards] (tests/test_readme_figures.py
checks that the README shows exactly these tables, for this directory and for ../smollm2-tree).
``--forwards`` prints instead where the time went: per policy and kind of forward, the device
seconds of the live decodes against the simulator's price, summed over the prompts of the decode
logs (``POLICY.log/live-P.json`` against ``sim-P.json``).
"""

import json
import re
import sys
from pathlib import Path

from simlab.sim.timeline import kind_of, read_chrome_trace, seconds_by_kind

HERE = Path(__file__).resolve().parent
HEADER = ("| policy | measured speedup | predicted | error | median per-prompt error (speedup / tok/s) "
          "| target calls equal | mean acceptance length (vLLM), measured = predicted | lossless "
          "| disturbed prompts | AD drift (median) |\n|---|---|---|---|---|---|---|---|---|---|")


def row(run: dict) -> str:
    mal = run["measured_mean_acceptance_length"]
    same_mal = "=" if abs(mal - run["predicted_mean_acceptance_length"]) < 1e-9 else "≠"
    return (f"| `{run['policy']}` | {run['measured_speedup']:.3f}× | {run['predicted_speedup']:.3f}× "
            f"| {run['error_speedup']:+.1%} | {run['median_abs_error_speedup']:.1%} / "
            f"{run['median_abs_error_tokens_per_s']:.1%} | {run['target_calls_equal']}/{run['prompts']} "
            f"| {mal:.3f} {same_mal} | {run['lossless']}/{run['prompts']} | {run['disturbed']}/{run['prompts']} "
            f"| {run['median_ad_drift']:+.1%} |")


def table(directory: Path = HERE) -> str:
    runs = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    runs.sort(key=lambda run: place(directory, run["policy"]))
    return "\n".join([HEADER, *map(row, runs)])


def place(directory: Path, policy: str) -> int:
    """Where run.sh's POLICIES list names ``policy``: rows follow that order."""
    order = (directory / "run.sh").read_text()
    found = re.search(rf"(?<![\w-]){re.escape(policy)}(?![\w-])", order)
    return found.start() if found else len(order)


def logged_by_kind(path: Path) -> dict[str, float]:
    """Device seconds per kind of forward in a decode log (the sums `simlab live` reports)."""
    return seconds_by_kind((kind_of(s.name), s.end - s.start) for s in read_chrome_trace(path)[1])


def forwards_table(directory: Path = HERE) -> str:
    rows = ["| policy | forward | measured s | priced s | measured / priced − 1 |", "|---|---|---|---|---|"]
    finished = [log for log in directory.glob("*.log") if log.with_suffix(".json").exists()]
    for log in sorted(finished, key=lambda log: place(directory, log.stem)):
        totals: dict[str, list[float]] = {}
        for live in sorted(log.glob("live-*.json")):
            for side, path in enumerate((live, live.with_name(live.name.replace("live-", "sim-")))):
                for kind, seconds in logged_by_kind(path).items():
                    totals.setdefault(kind, [0.0, 0.0])[side] += seconds
        for kind, (measured, priced) in sorted(totals.items()):
            rows.append(f"| `{log.stem}` | {kind} | {measured:.1f} | {priced:.1f} | {measured / priced - 1:+.1%} |")
    return "\n".join(rows)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--forwards"]
    directory = Path(args[0]) if args else HERE
    print(forwards_table(directory) if "--forwards" in sys.argv else table(directory))

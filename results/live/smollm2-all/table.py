"""Print the README's table of every live policy on SmolLM2 from this directory's runs, or of
another directory of runs made the same way (a run.sh and one POLICY.json per policy).

Usage: python results/live/smollm2-all/table.py [DIRECTORY] (tests/test_readme_figures.py checks
that the README shows exactly these tables, for this directory and for ../smollm2-tree).
"""

import json
import re
import sys
from pathlib import Path

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
    order = (directory / "run.sh").read_text()  # rows in the order its POLICIES list names them

    def place(run: dict) -> int:
        found = re.search(rf"(?<![\w-]){re.escape(run['policy'])}(?![\w-])", order)
        return found.start() if found else len(order)

    runs.sort(key=place)
    return "\n".join([HEADER, *map(row, runs)])


if __name__ == "__main__":
    print(table(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))

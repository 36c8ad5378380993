"""Prove that no number of a valid run moves: ``simlab simulate --json`` for every policy on
every shipped trace, in each topology, before and after a change, compared field by field; and
on the shipped trace ``simlab serve --json``, ``simlab analytic --json`` and a small sweep, whose
output is compared as it is printed.

    PYTHONPATH=OLD_CHECKOUT python tools/simulate_json_diff.py run before.jsonl
    PYTHONPATH=.            python tools/simulate_json_diff.py run after.jsonl
    python tools/simulate_json_diff.py compare before.jsonl after.jsonl --new FIELD [--new FIELD ...]

``run`` writes one JSON line per (trace, command): the exit status, stdout and stderr of the
command, run in-process. ``compare`` says, per line, whether the two runs are identical once the
fields named by ``--new`` (those the change adds, which must be present after) are taken out of
the second, and exits non-zero if any differs. Refused runs (a policy a trace cannot replay) must
be refused with the same message.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path("traces")  # relative to ROOT, where `run` works: two checkouts print the same paths
VARIANTS = (("sd", "--param", "gamma=3"), ("pearl", "--topology", "one-device"))
TOPOLOGIES = ((), ("--topology", "two-devices"), ("--topology", "one-device"))
SHIPPED = str(TRACES / "qwen-coder-humaneval")
# on the shipped trace: commands whose output is compared as printed (not as one JSON object)
COMMANDS = (("serve", "--json", "--trace", SHIPPED, "--requests", "40", "--rate", "2"),
            ("analytic", "--json", "--trace", SHIPPED),
            ("sweep", "--trace", SHIPPED, "--policy", "sd:gamma=1..6", "--policy", "svip:entropy_threshold=0.3,0.6",
             "--no-cache", "--workers", "1"))


def policies() -> list[tuple[str, ...]]:
    """Every registered policy in every topology (the recorded one, then each named), then the variants."""
    from simlab.policies import REGISTRY

    return [(name, *where) for name in sorted(REGISTRY) for where in TOPOLOGIES] + list(VARIANTS)


def run(out: Path) -> None:
    out = out.resolve()
    os.chdir(ROOT)
    runs = [(trace.name, ["simulate", "--json", "--trace", str(trace), "--policy", *policy], policy)
            for trace in sorted(p for p in TRACES.iterdir() if p.is_dir()) for policy in policies()]
    runs += [("qwen-coder-humaneval", list(command), command) for command in COMMANDS]
    with out.open("w") as f:
        for trace, args, shown in runs:
            f.write(json.dumps({"trace": trace, "args": list(shown), **_run(args)}) + "\n")


def _run(args: list[str]) -> dict:
    """One simlab command in-process: its exit status, stdout and stderr."""
    from simlab.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code
    return {"code": code, "out": stdout.getvalue(), "err": stderr.getvalue()}


def _untimed(out: str) -> str:
    return re.sub(r"[0-9.]+ s with (\d+) (\w+) worker", r"T s with \1 \2 worker", out)


def compare(before: Path, after: Path, new: list[str]) -> int:
    old = [json.loads(line) for line in before.open()]
    now = [json.loads(line) for line in after.open()]
    if [(r["trace"], r["args"]) for r in old] != [(r["trace"], r["args"]) for r in now]:
        print("the two files hold different runs")
        return 1
    differ = ran = 0
    for b, a in zip(old, now):
        what = f"{b['trace']} {' '.join(b['args'])}"
        if (b["code"], b["err"]) != (a["code"], a["err"]):
            print(f"DIFF {what}: exit {b['code']} -> {a['code']}")
            differ += 1
            continue
        if b["code"]:
            print(f"same refusal {what}")
            continue
        if b["args"][0] in ("serve", "analytic", "sweep"):  # compared as printed, but for the sweep's own wall time
            same = _untimed(b["out"]) == _untimed(a["out"])
            differ += not same
            print(f"{'same' if same else 'DIFF'} {what}")
            continue
        jb, ja = json.loads(b["out"]), json.loads(a["out"])
        missing = [k for k in new if k not in ja]
        added = {k: ja.pop(k) for k in new if k in ja}
        moved = sorted(k for k in set(jb) | set(ja) if jb.get(k) != ja.get(k))
        if missing or moved:
            print(f"DIFF {what}: moved {moved}, missing {missing}")
            differ += 1
            continue
        ran += 1
        print(f"same {what} {added}")
    print(f"{len(old) - differ} of {len(old)} identical apart from {new}; {ran} of them ran")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument("--new", action="append", default=[], help="a field the change adds (repeatable)")
    args = parser.parse_args()
    if args.command == "run":
        run(args.out)
        return 0
    return compare(args.before, args.after, args.new)


if __name__ == "__main__":
    sys.exit(main())

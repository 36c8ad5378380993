"""Prove that no number of a valid run moves: ``simlab simulate --json`` for several policies on
every shipped trace, before and after a change, compared field by field.

    PYTHONPATH=OLD_CHECKOUT python tools/simulate_json_diff.py run before.jsonl
    PYTHONPATH=.            python tools/simulate_json_diff.py run after.jsonl
    python tools/simulate_json_diff.py compare before.jsonl after.jsonl --new FIELD [--new FIELD ...]

``run`` writes one JSON line per (trace, policy): the exit status, stdout and stderr of the
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
import sys
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1] / "traces"
POLICIES = (("sd",), ("sd", "--param", "gamma=3"), ("ad",), ("spide",), ("pearl",), ("hf-heuristic",), ("oracle",),
            ("svip",), ("ags",), ("pld",), ("del",), ("tree-static",), ("eagle2",), ("dv",),
            ("pearl", "--topology", "one-device"))


def run(out: Path) -> None:
    from simlab.cli import main

    with out.open("w") as f:
        for trace in sorted(p for p in TRACES.iterdir() if p.is_dir()):
            for policy in POLICIES:
                args = ["simulate", "--json", "--trace", str(trace), "--policy", *policy]
                stdout, stderr = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    try:
                        main(args)
                        code = 0
                    except SystemExit as exc:
                        code = exc.code
                f.write(json.dumps({"trace": trace.name, "args": list(policy), "code": code, "out": stdout.getvalue(),
                                    "err": stderr.getvalue()}) + "\n")


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

"""Mutation testing of simlab's core with mutmut, module by module, and its report.

    python tools/mutation.py                      # every core module, then the report
    python tools/mutation.py metrics rounds       # some modules (names below)
    python tools/mutation.py --report-only        # rewrite the report from mutmut's last results
    python tools/mutation.py sim --sample 150     # a seeded random sample of a module's mutants

mutmut (configured in pyproject.toml, ``[tool.mutmut]``) copies the package to ``mutants/``,
plants one small change at a time (an operator, a constant, a comparison...) and runs the fast
test subset against it: the tests that cover the mutated function, from that list. A mutant
that no test notices *survived*. Each run adds to mutmut's cache in ``mutants/``, so modules
can be run one at a time, and a re-run only tests what changed. On a slow machine a large
module can be *sampled*: ``--sample N`` checks N of its mutants drawn at random (seeded, so a
re-run draws the same ones); the report then scores the checked mutants and counts the rest as
not checked, so a sampled score is an estimate with the sample size beside it.

mutmut's cache (``mutants/``, not committed) is discarded when the test selection changes, and
a sample is drawn anew when the code does. So each run's outcome is added to a committed
ledger, ``tools/mutation_results.json``: per module run, when, how many mutants were drawn (and
the seed), the counts per status and each survivor's diff. The report is written from the
ledger, so it keeps the runs of earlier caches; a module's row adds up its runs (a full,
unsampled run of a module replaces its earlier runs). Draw a further sample of a module with a
new ``--seed``: the same seed on unchanged code draws the same mutants again.

The report (``docs/mutation-report.md``) gives per module killed / survived / score, the runs
behind them, and lists every survivor with its diff, annotated from
``tools/mutation_notes.toml``: ``equivalent`` (no test can tell it apart, and why) or ``open``
(a test is still wanting). The notes also list ``killed_by``: survivors and the tests added
since that kill them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
NOTES = ROOT / "tools" / "mutation_notes.toml"
REPORT = ROOT / "docs" / "mutation-report.md"
LEDGER = ROOT / "tools" / "mutation_results.json"
# module -> mutmut's mutant-name pattern (its names are dotted module paths): the core, what the
# simulator's numbers rest on
CORE = {
    "rounds": "simlab.policies.rounds.*",
    "policies": "simlab.policies.*",
    "sim": "simlab.sim.*",
    "replay": "simlab.trace.replay.*",
    "metrics": "simlab.common.metrics.*",
    "latency": "simlab.latency.*",
    "frontier": "simlab.sweep.frontier.*",
    "serve": "simlab.serve.*",
    "trees": "simlab.trees.*",
    "tree_policies": "simlab.policies.trees.*",  # also in policies' pattern: the longer one wins
    "tree_replay": "simlab.trace.tree_replay.*",
    "analytic": "simlab.analytic.closed_form.*",
}
# beyond the core (issue 44): what users read from live runs, recordings, serving's tuner and
# sweeps; reported in a table of their own beside the core's
AREAS = {
    "live": "simlab.live.*",
    "record": "simlab.record.*",
    "serve_tune": "simlab.serve.tune.*",  # also in serve's pattern: the longer one wins
    "sweep": "simlab.sweep.*",  # frontier's is longer
}
MODULES = {**CORE, **AREAS}
KILLED = {"killed", "timeout", "caught by type check"}  # mutmut's statuses that count as detected
MISSED = ("survived", "no tests")  # undetected: a survivor, or a mutant no selected test runs


def mutmut(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    return run_group([sys.executable, "-m", "mutmut", *args], timeout)


def run_group(cmd: list[str], timeout: float | None) -> subprocess.CompletedProcess:
    """``cmd`` in a process group of its own, all of it stopped at ``timeout`` (then
    TimeoutExpired): mutmut forks a process per mutant, which stopping mutmut alone leaves
    running (a mutant that hangs would go on taking a core after --stop-at)."""
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# mutmut's first step alone (what `mutmut run` does before it collects its test map): copy the
# package and the selected tests to mutants/ and write every mutant there, "not checked"
GENERATE = ("import os, mutmut.__main__ as m; m.set_mutant_under_test('mutant_generation'); "
            "os.makedirs('mutants', exist_ok=True); m.copy_src_dir(); m.copy_also_copy_files(); "
            "m.setup_source_paths(); m.create_mutants(1)")


def targets(modules: list[str], sample: int | None, seed: int) -> list[str]:
    """What to hand mutmut: the modules' name patterns, or (``sample``) the not yet checked
    mutants of a seeded random draw of ``sample`` mutants per module. A module the cache holds
    no mutant of (a new cache, or a module new to ``only_mutate``) has its mutants generated
    first, so that the draw is from all of them."""
    if sample is None:
        return [MODULES[m] for m in modules]
    statuses = results()
    if any(all(module_of(n) != m for n in statuses) for m in modules):
        run_group([sys.executable, "-c", GENERATE], None)
        statuses = results()
    chosen = []
    for module in modules:
        names = sorted(n for n in statuses if module_of(n) == module)
        drawn = random.Random(f"{seed}:{module}").sample(names, min(sample, len(names)))
        chosen += [n for n in drawn if statuses[n] == "not checked"]  # named mutants are re-run
    return chosen


def run(names: list[str], max_children: int, stop_at: dt.datetime | None) -> None:
    """One mutmut run over all of ``names`` (each run starts by running the selected tests clean)."""
    if not names:
        print("nothing to run")
        return
    timeout = None
    if stop_at is not None:
        timeout = (stop_at - dt.datetime.now(dt.timezone.utc)).total_seconds()
        if timeout <= 0:
            print("skipped, past --stop-at")
            return
    try:
        proc = mutmut("run", "--max-children", str(max_children), *names, timeout=timeout)
        print(f"mutmut exited {proc.returncode}")
    except subprocess.TimeoutExpired:
        print("stopped at --stop-at; the remaining mutants stay unchecked")


def results() -> dict[str, str]:
    """mutant name -> status, from mutmut's cache."""
    out = mutmut("results", "--all", "true").stdout
    return dict(re.findall(r"^\s+(\S+): (.+)$", out, flags=re.M))


def module_of(name: str) -> str | None:
    """The module whose pattern names the mutant (the longest, where two do)."""
    matches = [m for m, pattern in MODULES.items() if name.startswith(pattern[:-1])]
    return max(matches, key=lambda m: len(MODULES[m]), default=None)


def diff_of(name: str) -> str:
    """The changed lines of a mutant (``-`` original, ``+`` mutated)."""
    lines = mutmut("show", name).stdout.splitlines()
    return "\n".join(line for line in lines if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def record(ledger: list[dict], modules: list[str], drawn: list[str] | None, sample: int | None,
           seed: int) -> list[dict]:
    """``ledger`` with this run's outcome added, one entry per module that checked a mutant:
    the mutants drawn this run (``drawn``), or with no sample every checked mutant of the
    module, which then replaces the module's earlier entries."""
    statuses = results()
    when = f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
    for module in modules:
        names = [n for n in statuses if module_of(n) == module]
        mine = [n for n in (drawn if sample is not None else names) if module_of(n) == module]
        checked = {n: statuses[n] for n in mine if statuses.get(n, "not checked") != "not checked"}
        if not checked:
            continue
        if sample is None:
            ledger = [e for e in ledger if e["module"] != module]
        counts = Counter("killed" if s in KILLED else s for s in checked.values())
        ledger.append({"date": when, "module": module, "mutants": len(names), "sample": sample,
                       "seed": seed if sample is not None else None, "counts": dict(sorted(counts.items())),
                       "survivors": {n: {"status": s, "diff": diff_of(n)} for n, s in sorted(checked.items())
                                     if s in MISSED}})
    return ledger


def score_table(counts: dict[str, Counter], mutants: dict[str, int], modules: dict[str, str]) -> list[str]:
    """The rows of one table of scores: each of ``modules``, then their sum."""
    lines = ["| module | mutants | checked | killed | survived | no tests | equivalent | killed since | "
             "score | with tests since |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    totals = Counter()
    for module, c in [*((m, counts[m]) for m in modules), ("**all**", None)]:
        c = c if c is not None else totals
        if module != "**all**":
            totals.update({**c, "mutants": mutants.get(module, 0)})
        checked = c["killed"] + c["survived"] + c["no tests"]
        score = f"{c['killed'] / checked:.1%}" if checked else "–"
        since = f"{(c['killed'] + c['killed since']) / checked:.1%}" if checked else "–"
        total = c["mutants"] if module == "**all**" else mutants.get(module, "–")
        lines.append(f"| {module} | {total} | {checked} | {c['killed']} | {c['survived']} | "
                     f"{c['no tests']} | {c['equivalent']} | {c['killed since']} | {score} | {since} |")
    return lines


def report(ledger: list[dict], notes: dict) -> str:
    """The report, from the ledger's runs. A mutant that no selected test runs ("no tests")
    counts as undetected, like a survivor. ``killed_by`` notes name survivors that a test added
    since the run kills (checked on the mutant by hand); the last column scores them as killed."""
    equivalent, killed_by = notes.get("equivalent", {}), notes.get("killed_by", {})
    beyond = notes.get("beyond_core", {})  # runs: where and beside what the areas' runs ran
    counts = {m: Counter() for m in MODULES}
    mutants: dict[str, int] = {}
    survivors: dict[str, dict] = {}
    for entry in ledger:  # a mutant that survived two runs (a name drawn again) counts in both
        module = entry["module"]
        counts[module].update(entry["counts"])
        counts[module]["equivalent"] += sum(name in equivalent for name in entry["survivors"])
        counts[module]["killed since"] += sum(name in killed_by for name in entry["survivors"])
        mutants[module] = entry["mutants"]  # the latest run's count: the code as it is now
        survivors.update(entry["survivors"])
    dates = sorted({e["date"] for e in ledger})
    lines = ["# Mutation report", "",
             f"`python tools/mutation.py` (mutmut, fast test subset of `[tool.mutmut]` in pyproject.toml), "
             f"runs of {dates[0] if dates else '–'} to {dates[-1] if dates else '–'} (listed below). Score: killed "
             "/ checked, where a checked mutant was killed, survived, or had no test in the subset that runs its "
             "code (\"no tests\"); equivalent survivors are listed below and count as not killed. \"killed "
             "since\": survivors that tests added after the run kill (each checked on its mutant).", "",
             *score_table(counts, mutants, CORE)]
    if any(mutants.get(m) is not None for m in AREAS):
        lines += ["", "## Beyond the core", "",
                  "Modules outside the simulator's core (issue 44): what `simlab live`, `simlab record`, "
                  "`simlab serve --tune` and `simlab sweep` print and write, against their own fast tests "
                  "(listed last in the subset)." + (f" {beyond['runs']}" if beyond.get("runs") else ""), "",
                  *score_table(counts, mutants, AREAS)]
    lines += ["", "Where \"checked\" is below \"mutants\", the module was sampled (`--sample N`, a seeded "
              "random draw) or stopped at `--stop-at`: its score estimates the module's from the checked "
              "ones. \"mutants\" counts the module's mutants at its latest run.", "", "## Runs", "",
              "| when | module | drawn | seed | checked |", "|---|---|---|---|---|"]
    for e in ledger:
        drawn = e["sample"] if e["sample"] is not None else "all"
        lines.append(f"| {e['date']} | {e['module']} | {drawn} | {e['seed'] if e['seed'] is not None else '–'} | "
                     f"{sum(e['counts'].values())} |")
    lines += ["", "## Survivors and mutants no test runs", ""]
    if not survivors:
        lines.append("None.")
    for name in sorted(survivors):
        if name in killed_by:
            verdict = f"killed since by `{killed_by[name]}`"
        elif name in equivalent:
            verdict = f"equivalent: {equivalent[name]}"
        else:
            verdict = "open: no test tells it apart yet"
        lines += [f"- `{name}` ({survivors[name]['status']}) — {verdict}", "", "  ```diff",
                  *[f"  {line}" for line in survivors[name]["diff"].splitlines()], "  ```", ""]
    earlier = {k: v for k, v in killed_by.items() if k not in survivors}
    lines += ["## Survivors of earlier campaigns, killed by new tests", ""]
    for name, test in sorted(earlier.items()):
        lines.append(f"- {name} — killed by `{test}`")
    return "\n".join(lines) + "\n"


def stop_time(hhmm: str, now: dt.datetime) -> dt.datetime:
    """The first moment after ``now`` whose time of day is ``hhmm``: a run started at 23:30 with
    ``--stop-at 01:00`` stops tomorrow."""
    hour, minute = map(int, hhmm.split(":"))
    at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return at if at > now else at + dt.timedelta(days=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"modules to run, of {', '.join(MODULES)} (default: the core, {', '.join(CORE)})")
    parser.add_argument("--max-children", type=int, default=2, help="parallel mutant runs (default 2)")
    parser.add_argument("--sample", type=int, help="check only this many mutants per module, drawn at random")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample's draw (default 0)")
    parser.add_argument("--stop-at", help="UTC time HH:MM after which no mutant is started (partial results kept)")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report from the ledger")
    parser.add_argument("--report", type=Path, default=REPORT, help=f"report path (default {REPORT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown modules {unknown}; known: {', '.join(MODULES)}")
    stop_at = stop_time(args.stop_at, dt.datetime.now(dt.timezone.utc)) if args.stop_at else None
    ledger = json.loads(LEDGER.read_text()) if LEDGER.exists() else []
    if not args.report_only:
        modules = args.modules or list(CORE)
        drawn = targets(modules, args.sample, args.seed)
        run(drawn, args.max_children, stop_at)
        ledger = record(ledger, modules, drawn, args.sample, args.seed)
        LEDGER.write_text(json.dumps(ledger, indent=1, ensure_ascii=False) + "\n")
    notes = tomllib.loads(NOTES.read_text()) if NOTES.exists() else {}
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(report(ledger, notes))
    print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

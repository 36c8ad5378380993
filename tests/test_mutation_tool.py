"""tools/mutation.py's own logic (the campaign itself is too long for CI)."""

import datetime as dt
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("mutation", Path(__file__).resolve().parent.parent / "tools" / "mutation.py")
mutation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation)


def test_stop_at_is_the_next_such_time_of_day():
    utc = dt.timezone.utc
    evening, morning = dt.datetime(2026, 11, 24, 23, 25, 7, tzinfo=utc), dt.datetime(2026, 11, 25, 9, 0, tzinfo=utc)
    assert mutation.stop_time("00:20", evening) == dt.datetime(2026, 11, 25, 0, 20, tzinfo=utc)  # past midnight
    assert mutation.stop_time("23:59", evening) == dt.datetime(2026, 11, 24, 23, 59, tzinfo=utc)
    assert mutation.stop_time("09:30", morning) == dt.datetime(2026, 11, 25, 9, 30, tzinfo=utc)
    assert mutation.stop_time("09:00", morning) == dt.datetime(2026, 11, 26, 9, 0, tzinfo=utc)  # now: tomorrow


def test_a_run_stopped_at_its_timeout_takes_the_processes_it_forked_with_it(tmp_path):
    # as mutmut forks a process per mutant: the command starts a child that would outlive it
    pid_file = tmp_path / "child"
    script = ("import subprocess, sys, time; "
              f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        mutation.run_group([sys.executable, "-c", script], timeout=2)
    # promptly: a child left running would hold the output pipes open for its whole minute
    assert time.monotonic() - started < 30
    child = int(pid_file.read_text())
    for _ in range(50):  # the child is gone (or a zombie awaiting its new parent) within moments
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {child}, forked by the stopped command, is still running")


def test_the_committed_report_is_the_ledgers_and_the_development_page_states_its_figures():
    """docs/mutation-report.md is what tools/mutation.py writes from the committed ledger and notes
    (so neither drifts from the other), no survivor of the core is left open, and docs/development.md states
    the core's mutant count, checked count and lowest module score with tests (the modules beyond
    the core have a table of their own)."""
    import json
    import re

    ledger = json.loads(mutation.LEDGER.read_text())
    notes = mutation.tomllib.loads(mutation.NOTES.read_text())
    text = mutation.report(ledger, notes)
    assert mutation.REPORT.read_text() == text
    # no core survivor is left open; beyond the core an open one is work the report lists
    left_open = re.findall(r"^- `(\S+)` \([^)]*\) — open: no test tells it apart yet", text, flags=re.M)
    assert [name for name in left_open if mutation.module_of(name) not in mutation.AREAS] == []
    core = text.split("## Beyond the core")[0]  # the development page states the core's figures
    rows = {r[0]: r[1:] for r in (line.strip("| ").split(" | ") for line in core.splitlines()
                                   if re.match(r"\| (\*\*all\*\*|[a-z_]+) \| \d+ \|", line))}
    total, checked = int(rows.pop("**all**")[0]), sum(int(r[1]) for r in rows.values())
    lowest = min(float(r[-1].rstrip("%")) for r in rows.values())
    readme = " ".join((mutation.ROOT / "docs" / "development.md").read_text().split())
    m = re.search(r"core is about ([\d,]+) mutants \(([\d,]+) checked so far; every module scores at least "
                  r"([\d.]+)% with the tests added for its survivors", readme)
    assert m, "docs/development.md no longer states the mutation figures"
    assert round(total, -2) == int(m.group(1).replace(",", ""))
    assert checked == int(m.group(2).replace(",", "")) and lowest == float(m.group(3))


def test_modules_beyond_the_core_are_named_by_their_longest_pattern_and_scored_in_a_table_of_their_own():
    assert mutation.module_of("simlab.serve.tune.x_tune__mutmut_3") == "serve_tune"
    assert mutation.module_of("simlab.serve.engine.xǁEngineǁ_step__mutmut_1") == "serve"
    assert mutation.module_of("simlab.sweep.frontier.x_pareto_mask__mutmut_2") == "frontier"
    assert mutation.module_of("simlab.sweep.grid.x_parse_spec__mutmut_2") == "sweep"
    entry = {"date": "2026-12-02 16:00 UTC", "module": "live", "mutants": 40, "sample": 4, "seed": 0,
             "counts": {"killed": 3, "survived": 1}, "survivors": {}}
    text = mutation.report([entry], {})
    core, beyond = text.split("## Beyond the core")
    assert "| live |" not in core and "| **all** | 0 | 0 |" in core
    # 3 killed of 4 checked: 75%, in the table beyond the core and in its sum
    assert "| live | 40 | 4 | 3 | 1 | 0 | 0 | 0 | 75.0% | 75.0% |" in beyond
    assert "| **all** | 40 | 4 | 3 | 1 | 0 | 0 | 0 | 75.0% | 75.0% |" in beyond

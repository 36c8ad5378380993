"""Writers killed outright (SIGKILL, no chance to clean up) at reproducible random moments:
what they leave is either a complete output or nothing new, never a mix, and running the
command again finishes with exactly what an uninterrupted run writes. (``record`` and
``live --out`` have theirs in tests/test_record.py and tests/test_live.py, beside their models.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.common.locations import TRACES
from simlab.latency.model import load_profile
from simlab.trace.io import read_trace
from tests.helpers import kill_moments, run_killed, simlab_cmd

pytestmark = pytest.mark.slow

SYNTH = ("synth", "--prompts", "100", "--tokens", "512")
GRID = ("--policy", "sd:gamma=1..8", "--workers", "1")
TIMING = ["sim_seconds", "cpu_seconds"]  # how long each configuration took: differs run to run


def _run(*args) -> None:
    proc = subprocess.run(simlab_cmd(*args), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """``old`` and ``new``: two synthetic traces a killed ``synth --force`` must never mix."""
    root = tmp_path_factory.mktemp("kill")
    _run(*SYNTH, "--seed", "1", "--out", root / "old")
    _run(*SYNTH, "--seed", "2", "--out", root / "new")
    return root


@pytest.mark.parametrize("after", kill_moments(seed=12, n=3, low=0.3, high=2.5))
def test_killed_synth_leaves_the_old_trace_or_the_new_one(traces, tmp_path, after):
    out = tmp_path / "t"
    shutil.copytree(traces / "old", out)  # the trace a user had
    old, new = read_trace(traces / "old"), read_trace(traces / "new")
    run_killed(simlab_cmd(*SYNTH, "--seed", "2", "--out", out, "--force"), after)
    if out.exists():
        left = read_trace(out)
        assert left.positions.equals(old.positions) or left.positions.equals(new.positions)
        assert left.rollouts.equals(old.rollouts if left.manifest.seed == 1 else new.rollouts)
    else:  # killed between moving the old trace aside and renaming the new one in
        (aside,) = tmp_path.glob(".t.old-*")
        assert read_trace(aside).positions.equals(old.positions)
    _run(*SYNTH, "--seed", "2", "--out", out, "--force")
    assert read_trace(out).positions.equals(new.positions)
    assert _leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def reference(traces) -> pd.DataFrame:
    """The sweep table of an uninterrupted run."""
    _run("sweep", "--trace", traces / "new", *GRID, "--no-cache", "--out", traces / "ref.csv")
    return pd.read_csv(traces / "ref.csv").drop(columns=TIMING)


@pytest.mark.parametrize("after", kill_moments(seed=13, n=3, low=0.5, high=4.0))
def test_killed_sweep_leaves_no_partial_table_and_resumes_identically(traces, reference, tmp_path, after):
    out, cache = tmp_path / "sweep.csv", tmp_path / "cache"
    args = ("sweep", "--trace", traces / "new", *GRID, "--cache", cache, "--out", out)
    run_killed(simlab_cmd(*args), after)
    if out.exists():  # written only once the sweep is complete
        assert pd.read_csv(out).drop(columns=TIMING).equals(reference)
    _run(*args, "--force")
    assert pd.read_csv(out).drop(columns=TIMING).equals(reference)
    assert _leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def profile(traces) -> dict:
    """The profile of an uninterrupted ``calibrate fit``."""
    _run("calibrate", "fit", TRACES / "smollm2-selfspec", "--out", traces / "profile.json")
    return json.loads((traces / "profile.json").read_text())


@pytest.mark.parametrize("after", kill_moments(seed=14, n=2, low=0.5, high=6.0))
def test_killed_calibrate_leaves_a_whole_profile_or_none(profile, tmp_path, after):
    out = tmp_path / "profile.json"
    args = ("calibrate", "fit", TRACES / "smollm2-selfspec", "--out", out)
    run_killed(simlab_cmd(*args), after)
    if out.exists():
        load_profile(out)
    _run(*args, "--force")
    assert json.loads(out.read_text()) == profile
    assert _leftovers(tmp_path) == []


def test_a_half_written_trace_directory_is_refused_as_incomplete(traces, tmp_path):
    """What a killed writer leaves beside its target (tables, no manifest yet) never loads."""
    half = tmp_path / ".t.tmp-999999"
    half.mkdir()
    for table in ("latency", "positions"):
        (half / f"{table}.parquet").write_bytes((traces / "new" / f"{table}.parquet").read_bytes())
    with pytest.raises(SimlabError, match=r"incomplete trace \(interrupted write\?\)"):
        read_trace(half)

"""A fixed sample of mutants of the core that the fast test subset must kill.

The full mutation campaign (``python tools/mutation.py``, mutmut) takes hours. This sample keeps the plausible one-line bugs that once survived the suite (issue 15) and a few
more, each applied to a temporary copy of the ``simlab`` package; the fast subset (the test
files of ``[tool.mutmut] pytest_add_cli_args_test_selection`` in pyproject.toml) is run
against the copy and must fail. A surviving mutant means a test stopped checking something.

One mutant run costs 60-125 s on 2 cores (issue 44's timing; 33 of them: half of CI's budget on a
loaded machine), so the runs are a named command,
``python -m pytest tests/test_mutation_sample.py --mutants``; the default suite checks only that
every mutant still applies to the current source.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


class Mutant(NamedTuple):
    file: str  # relative to the repository root
    original: str  # must occur exactly once in the file
    mutated: str
    why: str  # the bug it stands for


MUTANTS = [
    Mutant("simlab/common/metrics.py", "acceptance_rate=_ratio(c.accepted, c.drafted)",
           "acceptance_rate=_ratio(c.accepted, c.target_calls)", "acceptance rate per target call"),
    Mutant("simlab/common/metrics.py", "tokens_per_s=_ratio(c.tokens, c.wall_time_s)",
           "tokens_per_s=_ratio(c.tokens, c.ad_wall_time_s)", "throughput over the AD wall time"),
    Mutant("simlab/common/metrics.py", "if n > i) for i in range(top)", "if n >= i) for i in range(top)",
           "per-position counts off by one"),
    Mutant("simlab/policies/spide.py", "self.reliability = self.prior", "self.reliability = 1.0",
           "SPIDE's prior Γ_0 (eq. 5) ignored"),
    Mutant("simlab/policies/spide.py", "stop = self.reliability <= self.tau", "stop = self.reliability < self.tau",
           "SPIDE's switch Γ ≤ τ (eq. 4) made strict"),
    Mutant("simlab/policies/hf.py", "max(1, self.n - 1)", "max(0, self.n - 1)",
           "HF heuristic may fall to N = 0 (autoregressive)"),
    Mutant("simlab/sim/executor.py", 'row[pl + c], "verify", c, k + 1, accepted)\n                note_verify((k + 1) * stride + pl + c)\n                if cache.most > pl + c + accepted:  # else',
           'row[pl + c + k], "verify", c, k + 1, accepted)\n                note_verify((k + 1) * stride + pl + c)\n                if cache.most > pl + c + accepted:  # else',
           "verify priced at context c + k"),
    Mutant("simlab/sim/executor.py", "start = ctx + m\n", "start = ctx\n",
           "parallel drafts priced before the pending ones"),
    Mutant("simlab/sim/executor.py", "grid.target_step_row()[prompt_len + 1 : prompt_len + n_tokens]",
           "grid.target_step_row()[prompt_len : prompt_len + n_tokens - 1]", "AD baseline one context too short"),
    Mutant("simlab/latency/model.py", "np.maximum((values[-1] - values[-2]) / (ks[-1] - ks[-2]), 0.0)",
           "(values[-1] - values[-2]) / (ks[-1] - ks[-2])", "verify cost extrapolated downwards"),
    Mutant("simlab/policies/rounds.py", "room = budget - committed - m - 1  #", "room = budget - committed - m  #",
           "parallel window may reach the budget's last position"),
    Mutant("simlab/trace/replay.py", "run[t + 1] + 1 if accept[t] else 0", "run[t + 1] if accept[t] else 0",
           "accepted runs not counted"),
    Mutant("simlab/sweep/frontier.py", "if top > best_below:", "if top >= best_below:",
           "a tie with a cheaper row counted as optimal"),
    Mutant("simlab/sim/devices.py", "self.busy_s += seconds", "self.busy_s = seconds",
           "busy time keeps only the last forward"),
    Mutant("simlab/latency/grid.py", "return cum[context_len + k] - cum[context_len]",
           "return cum[context_len + k] - cum[context_len + 1]", "k draft steps priced as k - 1"),
    Mutant("simlab/policies/timing.py", "best = s\n", "best = s - 1\n", "eq. 6 window one short"),
    Mutant("simlab/policies/rounds.py", "(committed, budget - committed, len(pending)", "(committed, budget + committed, len(pending)",
           "policies told the wrong number of tokens left"),
    Mutant("simlab/policies/rounds.py", "(True, window, checked, accepted, emitted, first_new)",
           "(True, window, checked, accepted, accepted, first_new)", "a parallel round's emitted count lost"),
    Mutant("simlab/sim/timeline.py", 'e.get("ph") == "M" and e["name"] == "process_name"',
           'e.get("ph") == "M" or e["name"] == "process_name"', "a timeline's title read from any metadata event"),
    Mutant("simlab/trace/replay.py", "yield new(TokenSignal, (i, rconf[j], rent[j], nan",
           "yield new(TokenSignal, (i, rconf[j], rent[j - 1], nan",
           "a rollout's entropy read one step behind its confidence"),
    Mutant("simlab/trace/replay.py", "signal = NEW(TokenSignal, (i, rconf[j], rent[j], NAN",
           "signal = NEW(TokenSignal, (i, rconf[j], rent[j - 1], NAN",
           "a rollout's entropy read one step behind its confidence, where a stop rule drafts"),
    Mutant("simlab/trace/tree_replay.py", "topk ** 2  # nodes per position", "topk * 2  # nodes per position",
           "recorded EAGLE-2 trees cut at the wrong node count (right only for top-2)"),
    Mutant("simlab/trees/candidates.py", "if not 0 <= c < len(self.parents):", "if not 0 <= c <= len(self.parents):",
           "a chosen candidate one past the last accepted"),
    Mutant("simlab/sim/draft_cache.py", "self.held[layer] = known + steps - 1", "self.held[layer] = known + steps",
           "a run's last draft counted as fed to the draft's cache (no catch-up after a fully accepted round)"),
    Mutant("simlab/latency/grid.py", "return step * (max(growth, 1.0) - 1.0)", "return step * (growth - 1.0)",
           "a catch-up cheaper than one draft step where a 2-token forward measured faster"),
    Mutant("simlab/sim/vanilla.py", "(self.prompt[stretch[1:]] == self.prompt[stretch[:-1]])",
           "(stretch[1:] == stretch[:-1])", "fixed-γ SD's catch-up missed after a stretch that ended fully accepted"),
    Mutant("simlab/sim/trees.py", "leaf = (accepted > 0) & ~has_children[node + 1]",
           "leaf = (accepted > 0) & has_children[node + 1]", "a fixed tree's catch-up after an expanded node, not a leaf"),
    Mutant("simlab/policies/del_update.py", "sums[j] = sums[j] * omega + total", "sums[j] = sums[j] + total",
           "DEL's sums not decayed (eq. 2's ω ignored)"),
    Mutant("simlab/sim/del_rounds.py", "held[i] = min(held[i], pl + c + accepted)",
           "held[i] = min(held[i], pl + c + accepted + 1)", "DEL's draft caches keep the first rejected draft"),
    Mutant("simlab/sim/del_rounds.py", "if accepted >= n - c:", "if accepted > n - c:",
           "DEL's replay accepts the end token as a draft"),
    Mutant("simlab/sim/draft_paths.py", "if t <= d and t < n:", "if t < d and t < n:",
           "a compiled replay reads a run's first rejected draft from its rollout"),
    Mutant("simlab/sim/spide_rounds.py", "first_new = accepted == m and c + m < n - 1 and",
           "first_new = accepted == m and c + m < n and", "SPIDE's replay accepts the end token as a new draft"),
    Mutant("simlab/sim/spide_rounds.py", "np.maximum(new, verify)", "new + verify",
           "a parallel round priced as its two forwards one after the other"),
]


def fast_tests() -> list[str]:
    """The fast subset the mutation campaign runs (one list, in pyproject.toml)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]


def apply(mutant: Mutant, root: Path) -> None:
    path = root / mutant.file
    text = path.read_text()
    assert text.count(mutant.original) == 1, f"{mutant.file}: {mutant.original!r} must occur exactly once"
    path.write_text(text.replace(mutant.original, mutant.mutated))


# files with functions numba compiles (and caches): a mutant of one must not meet the cache
COMPILED = {str(p.relative_to(ROOT)) for p in (ROOT / "simlab").rglob("*.py") if "@njit" in p.read_text()}


@pytest.fixture(scope="session")
def copies(tmp_path_factory) -> Path:
    """Where every run's copy lives (one place, so that numba's cache, keyed on the source's path
    and stamp, serves the runs after the first: compiling was a third of a run)."""
    return tmp_path_factory.mktemp("mutants")


def killed(mutant: Mutant | None, copies: Path, tmp_path: Path) -> bool:
    """Run the fast subset on a copy of the package with ``mutant`` applied; True if it fails.

    The copy runs from ``copies / "copy"`` (with the tests and the data they read), so that
    nothing imports this checkout's unmutated ``simlab``. numba's compiled functions are cached in
    ``copies`` for the next run; a mutant of a compiled file gets a cache of its own (``tmp_path``),
    as numba checks only a function's own file and would keep the unmutated callee compiled into
    its callers."""
    root = copies / "copy"
    shutil.rmtree(root, ignore_errors=True)
    for part in ("simlab", "tests", "calibrate", "traces", "results"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    if mutant is not None:
        apply(mutant, root)
    cache = tmp_path if mutant is not None and mutant.file in COMPILED else copies / "numba"
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", "NUMBA_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *fast_tests()]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode == 1  # 1: a test failed (2-5: collection or usage errors are not kills)


def test_every_sample_mutant_applies_to_the_current_source():
    for mutant in MUTANTS:
        assert (ROOT / mutant.file).read_text().count(mutant.original) == 1, mutant


@pytest.mark.mutants
def test_the_fast_subset_passes_on_an_unmutated_copy(copies, tmp_path):
    # otherwise a "kill" below could be the copy failing for another reason
    assert not killed(None, copies, tmp_path)


@pytest.mark.mutants
@pytest.mark.parametrize("mutant", MUTANTS, ids=[f"{Path(m.file).stem}:{m.why}" for m in MUTANTS])
def test_the_fast_subset_kills_the_sample_mutant(mutant, copies, tmp_path):
    assert killed(mutant, copies, tmp_path), f"survived: {mutant.file}: {mutant.original!r} -> {mutant.mutated!r}"


def test_hypothesis_is_derandomised_unless_asked():
    from hypothesis import settings

    if "HYPOTHESIS_PROFILE" not in os.environ:
        assert settings.default.derandomize and settings.default.database is None

"""`simlab` answers without waiting: the root group lists the commands from a table and imports a
command's module only when it is resolved (simlab/cli/commands.py), and `simlab simulate` reads and
replays a trace without pandas (simlab/trace/tables.py). How fast is `simlab bench`'s start-up
rows' business; these tests pin what the speed rests on."""

import json
import os
import pkgutil
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

import simlab.cli
from simlab.cli import app
from simlab.cli.bench import STARTUP_GOAL, StartupResult, startup_env, time_startup
from simlab.cli.commands import COMMANDS, load

HEAVY = ("numpy", "pandas", "pyarrow", "rich", "simpy", "scipy", "matplotlib", "torch", "tqdm", "pydantic")
NOT_COMMANDS = {"app", "commands", "output", "policy_options", "serve_options"}


def imported_by(*args: str) -> dict:
    """The heavy modules and the simlab.cli modules that ``simlab ARGS`` imports, from a fresh process."""
    code = ("import sys, simlab.cli as c\n"
            "try:\n    c.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print({{'heavy': sorted(m for m in {HEAVY!r} if m in sys.modules), "
            "'cli': sorted(m for m in sys.modules if m.startswith('simlab.cli.'))}, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return eval(done.stderr.strip().splitlines()[-1])


def test_the_table_lists_every_command_the_modules_define_with_their_help():
    load()
    commands = typer.main.get_command(app).commands
    assert set(commands) == set(COMMANDS)
    for name, (_, text) in COMMANDS.items():
        first_paragraph = (commands[name].help or "").split("\n\n")[0]
        assert " ".join(first_paragraph.split()) == " ".join(text.split()), name


def test_every_command_module_is_named_by_the_table():
    modules = {m.name for m in pkgutil.iter_modules(simlab.cli.__path__)} - NOT_COMMANDS
    assert modules == {m for mods, _ in COMMANDS.values() for m in mods}


def test_simlab_help_imports_no_command_and_no_heavy_library():
    got = imported_by("--help")
    assert got == {"heavy": [], "cli": ["simlab.cli.app", "simlab.cli.commands"]}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_commands_help_imports_only_its_own_modules_and_no_heavy_library(name):
    got = imported_by(*name.split(), "--help")
    assert not set(HEAVY) & set(got["heavy"]), got["heavy"]
    own = {f"simlab.cli.{m}" for m in COMMANDS[name][0]}
    others = {f"simlab.cli.{m}" for n, (mods, _) in COMMANDS.items() if n != name for m in mods} - own
    # a command may import another's helpers (simulate's trace loading), but never the whole table
    assert own <= set(got["cli"]) and len(others & set(got["cli"])) <= 2, got["cli"]


@pytest.mark.parametrize("args", [(), ("--json",), ("--policy", "spide")])
def test_simulate_on_the_default_trace_imports_no_pandas(args):
    # pandas alone is about 0.4 s of a 2-core box's start-up, more than the rest of the command
    got = imported_by("simulate", *args)
    assert {"numpy", "pyarrow", "simpy"} <= set(got["heavy"]) and "pandas" not in got["heavy"], got["heavy"]


def test_the_lazy_root_help_is_the_help_of_every_command_loaded():
    lazy = subprocess.run([sys.executable, "-m", "simlab", "--help"], capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "400"}).stdout
    load()
    eager = CliRunner().invoke(app, ["--help"], prog_name="simlab", terminal_width=400).output
    assert lazy.replace("python -m simlab", "simlab").split() == eager.split()


def test_a_command_runs_through_the_table_without_being_loaded_first():
    got = imported_by("policies", "--json")
    assert "simlab.cli.policies" in got["cli"] and "simlab.cli.sweep" not in got["cli"]


def test_startup_figures_time_every_commands_help_and_pass_below_their_goal():
    fast = StartupResult("x", ("--help",), STARTUP_GOAL * 0.99, 1.0, STARTUP_GOAL)
    slow = StartupResult("x", ("--help",), STARTUP_GOAL, 1.0, STARTUP_GOAL)
    assert fast.passed and not slow.passed
    results = time_startup(repeats=1)
    assert [r.what.split(" (")[0] for r in results] == [
        "start-up: simlab --help", "start-up: slowest command --help", "start-up: simulate on the default trace"]
    assert results[1].command[0] in COMMANDS and all(r.cpu_seconds > 0 for r in results)
    json.dumps([r.__dict__ for r in results])


def test_startup_figures_are_timed_with_simlabs_modules_compiled(monkeypatch):
    """A process barred from writing .pyc compiles every module each run, which a user's does not."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("SIMLAB_SOMETHING", "kept")
    env = startup_env()
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["SIMLAB_SOMETHING"] == "kept"


@pytest.mark.parametrize("user", [None, "2"])
def test_the_cli_starts_numpys_blas_on_one_thread_unless_the_user_said(user):
    """Importing the CLI sets OPENBLAS_NUM_THREADS before numpy loads (its threads spin at start-up,
    simlab.common.openmp.one_blas_thread); a value in the environment is kept. The process's own
    thread count shows what OpenBLAS started."""
    code = ("import os, simlab.cli, numpy\n"
            "threads = [l for l in open('/proc/self/status') if l.startswith('Threads:')][0].split()[1]\n"
            "print(os.environ['OPENBLAS_NUM_THREADS'], threads)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user:
        env["OPENBLAS_NUM_THREADS"] = user
    said, threads = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   env=env).stdout.split()
    assert said == (user or "1")
    assert int(threads) == int(user or 1)

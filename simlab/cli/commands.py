"""Which module defines each command, so that ``simlab`` imports only the command it runs.

Importing every command module to answer ``simlab --help`` cost more than a second of CPU:
the commands import pandas, the policies, the serving engine. So the root group lists the
commands from :data:`COMMANDS` (name, modules, the one-line help ``simlab --help`` shows) and
imports a command's modules only when that command is resolved (to run it or print its help).
``tests/test_cli_startup.py`` checks the table against the commands the modules define: a new
command module fails there until it has its row.
"""

from __future__ import annotations

import importlib

import typer
from typer.core import TyperCommand, TyperGroup

# name: (the modules that define it, the first paragraph of its help), in the pipeline's order (docs/architecture.md)
COMMANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "models": (("models",), "Install and list real models that need no model hub."),
    "record": (("record",), "Record a trace: per-position signals, divergence rollouts and forward latencies."),
    "datastore": (("datastore",), "Build the token datastore that the rest policy retrieves drafts from."),
    "trace": (("trace",), "Check traces against the checksums of their tables, or write the checksums."),
    "calibrate": (("calibrate",), "Fit latency profiles and acceptance predictors: `simlab calibrate TRACE --out "
                                  "calibrate/NAME.json`."),
    "simulate": (("simulate",), "Replay a trace in the SimPy simulator under a drafting policy."),
    "serve": (("serve",), "Serve a trace's prompts under load: continuous batching, batched drafting and verification."),
    "policies": (("policies",), "List every drafting policy with its parameters, defaults and the paper section it "
                                "implements."),
    "sweep": (("sweep",), "Simulate every combination of policies and parameters; mark the speed-vs-cost Pareto front."),
    "recommend": (("recommend",), "The best configurations for a trace's pair, how sure, and each as an engine's own "
                                  "settings."),
    "plot": (("plot",), "Figures of sweeps, traces, timelines and live runs."),
    "live": (("live",), "Decode prompts for real under a policy and compare measured with predicted."),
    "llama-cpp": (("llama_cpp", "llama_serve"), "llama.cpp as the engine: build it, record traces with it, predict "
                                                "its runs."),
    "vllm": (("vllm",), "vLLM as the engine: install it, record traces with it, predict its speculative decoding."),
    "synth": (("synth",), "Write a synthetic trace: i.i.d., bursty (markov) or histogram-driven (table) acceptance."),
    "analytic": (("analytic",), "Expected tokens per round, walltime speedup and the optimal γ under i.i.d. acceptance;\n"
                                "with --trace, the same beside the simulator and a run-length model, plus h(k), s and TPL."),
    "bench": (("bench",), "Simulator speed beside its goals: whole-process `simulate` on a 1M-token synthetic trace\n"
                          "(wall clock), every policy and fixed-γ SD in simulated tokens per CPU-second (best of N);\n"
                          "PASS or FAIL per figure; and start-up: CPU-seconds of `simlab --help`, every command's --help "
                          "and\n`simulate` on the default trace. With --sweep: the wall time of a whole sweep per worker "
                          "count."),
}


def load(names=None) -> None:
    """Import the modules of the commands ``names`` (every command by default); each registers
    its commands on the shared app as it is imported."""
    for name in COMMANDS if names is None else names:
        for module in COMMANDS[name][0]:
            importlib.import_module(f"simlab.cli.{module}")


class CommandTable(TyperGroup):
    """The root group: every command listed from :data:`COMMANDS`, each built when it is resolved.
    ``app`` is the Typer app the command modules register on (simlab/cli/app.py sets it)."""

    app: typer.Typer | None = None

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name in self.commands or name not in COMMANDS:
            return self.commands.get(name)
        # listed, not loaded: what ``simlab --help`` needs of it
        return TyperCommand(name, help=COMMANDS[name][1], rich_markup_mode=self.rich_markup_mode)

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name in COMMANDS and name not in self.commands:
            load([name])
            self.add_command(typer.main.get_command(self.app).commands[name], name)
        return super().resolve_command(ctx, args)

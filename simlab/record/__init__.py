"""``simlab record``: real draft/target models decode real prompts into a trace.

Modules, in the order a recording uses them: ``prompts`` (prompt sources and chat templates),
``forward`` (teacher-forced passes and early exits), ``signals`` (per-position statistics),
``rollouts`` (the draft's own continuation after each divergence), ``latency`` (forward-time
probes), ``machine`` (hardware and library descriptions) and ``recorder`` (the loop that ties
them together and writes the trace after every prompt). All of them import torch; the CLI
imports this package only inside the command.
"""

"""``simlab record``: real draft/target models decode real prompts into a trace.

Modules, in the order a recording uses them: ``recorder`` (checks the request before any
model loads, then drives the rest), ``prompts`` (prompt sources and chat templates),
``latency`` (forward-time probes), ``prompt_rows`` (one prompt through the models:
``decode`` for the target's path, ``forward`` for teacher-forced passes and early exits,
``signals`` for per-position statistics, ``rollouts`` for the draft's continuation after each
divergence, ``tree_expansion`` for the draft's top-K and EAGLE-2 trees) and ``writer`` (the trace rewritten crash-safely after every prompt); ``machine``
describes the hardware and libraries. These modules import torch; the CLI imports them only
inside the command.
"""

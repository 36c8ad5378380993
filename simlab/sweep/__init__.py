"""Sweeps: grids of policies and parameters simulated on a trace, in parallel and resumable.

``grid`` parses what to run; ``runner`` runs it (process pool or Ray) and builds the table;
``store`` keeps finished rows on disk by configuration.
"""

from simlab.sweep.grid import PolicyGrid, combine, parse_policy, read_grid
from simlab.sweep.runner import Config, SweepInterrupted, SweepResult, run_sweep

__all__ = ["Config", "PolicyGrid", "SweepInterrupted", "SweepResult", "combine", "parse_policy", "read_grid",
           "run_sweep"]

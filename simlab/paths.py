"""Where the data shipped with the project lives (a source checkout: ``traces/``, ``calibrate/``)."""

from __future__ import annotations

import os
from pathlib import Path

from simlab.errors import SimlabError

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
CALIBRATE = ROOT / "calibrate"

# The default trace of `simlab simulate`, best first: the real Qwen recording once it ships,
# else the synthetic one.
DEFAULT_TRACES = ("qwen-coder-humaneval", "synthetic-iid")


def default_trace() -> Path:
    for name in DEFAULT_TRACES:
        path = TRACES / name
        if (path / "manifest.json").exists():
            return path
    raise SimlabError(f"no shipped trace found under {TRACES}; pass --trace PATH")


def cache_root() -> Path:
    """Where simlab keeps what it can rebuild (installed models, sweep results):
    ``$SIMLAB_CACHE``, default ``~/.cache/simlab``."""
    return Path(os.environ.get("SIMLAB_CACHE") or Path.home() / ".cache" / "simlab")

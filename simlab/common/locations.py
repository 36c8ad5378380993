"""Where the data shipped with the project lives (a source checkout: ``traces/``, ``calibrate/``)."""

from __future__ import annotations

import os
from pathlib import Path

from simlab.common.errors import SimlabError

ROOT = Path(__file__).resolve().parents[2]
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


def shipped_traces() -> list[Path]:
    """Every trace directory under ``traces/``, by name."""
    return sorted(p for p in TRACES.iterdir() if (p / "manifest.json").exists())


def cache_root() -> Path:
    """Where simlab keeps what it can rebuild (installed models, sweep results):
    ``$SIMLAB_CACHE``, default ``~/.cache/simlab``."""
    return Path(os.environ.get("SIMLAB_CACHE") or Path.home() / ".cache" / "simlab")


def portable_path(path: str | Path) -> str:
    """``path`` as results files record it: relative to the working directory when inside it,
    else with the home directory written ``~``, so a committed result names no user's machine."""
    p = Path(path).absolute()
    for base, shown in ((Path.cwd(), None), (Path.home(), "~")):
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        return str(Path(shown, rel)) if shown else str(rel)
    return str(p)

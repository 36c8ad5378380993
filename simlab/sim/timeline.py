"""Per-device timelines as Chrome trace JSON (opens in Perfetto and chrome://tracing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from simlab.sim.devices import Slice

DEVICES = ("draft", "target")


def chrome_trace(slices: Iterable[Slice], title: str = "simlab") -> dict:
    """One complete ("X") event per forward; one thread row per device; times in microseconds."""
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": title}}]
    for tid, dev in enumerate(DEVICES):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": dev}})
    for s in sorted(slices, key=lambda s: (s.start, s.device)):
        events.append({
            "name": s.name, "ph": "X", "pid": 0, "tid": DEVICES.index(s.device),
            "ts": s.start * 1e6, "dur": (s.end - s.start) * 1e6, "args": s.args,
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(slices: Iterable[Slice], path: str | Path, title: str = "simlab") -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(chrome_trace(slices, title)))
    return out

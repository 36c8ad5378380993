"""Per-device timelines as Chrome trace JSON (opens in Perfetto and chrome://tracing)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from simlab.common.atomic import replace_file
from simlab.common.errors import SimlabError
from simlab.common.inputs import input_file
from simlab.sim.devices import Slice

DEVICES = ("draft", "target")
COUNT_SUFFIX = re.compile(r"\s+x\d+$")


def kind_of(name: str) -> str:
    """'verify (parallel) x5' -> 'verify (parallel)': what a slice's forward did, without its
    token count (live decode logs name their forwards the same way)."""
    return COUNT_SUFFIX.sub("", name)


def seconds_by_kind(forwards: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Device seconds per kind of forward, from (kind, seconds) pairs, the prefill left out (the
    simulator starts after it). A live decode and its simulated timeline summed alike say which
    forwards ran slower or faster than priced."""
    out: dict[str, float] = {}
    for kind, seconds in forwards:
        if kind != "prefill":
            out[kind] = out.get(kind, 0.0) + seconds
    return out


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
    text = json.dumps(chrome_trace(slices, title))
    return replace_file(path, lambda tmp: tmp.write_text(text))


def read_chrome_trace(path: str | Path) -> tuple[str, list[Slice]]:
    """The title and the slices of a Chrome trace JSON file (the inverse of
    :func:`write_chrome_trace`; a live decode log in the same format reads the same way).
    A row's device is its thread name, or ``tid N`` when the file names none."""
    p = input_file(path, "timeline")
    try:
        events = json.loads(p.read_text())["traceEvents"]
        title = next((e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"), p.stem)
        threads = {e.get("tid"): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
        slices = [Slice(threads.get(e.get("tid"), f"tid {e.get('tid')}"), e["name"], e["ts"] / 1e6,
                        (e["ts"] + e["dur"]) / 1e6, e.get("args", {}))
                  for e in events if e.get("ph") == "X"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise SimlabError(f"{p} is not a Chrome trace JSON file with traceEvents ({exc!r})") from None
    return title, slices

"""How much of the machine's CPU other processes took while we measured.

Latencies and wall times measured on a shared CPU are only as good as the machine was quiet,
so the recorder, ``simlab live`` and ``simlab llama-cpp serve`` store this figure beside what
they time. No torch here: the llama.cpp comparisons run without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

_MIN_SPAN = 1.0  # seconds


class OtherLoad:
    """Share of the machine's CPU time that other processes have used since construction.

    The recorder stores it with the probe and with the recording so that a noisy measurement
    can be seen (and the probe re-run with ``--reprobe``). Linux only (``/proc/stat``);
    elsewhere :meth:`share` is None.
    """

    def __init__(self, pids: Sequence[int] = ()) -> None:
        """``pids``: processes of ours besides this one (a server it started), whose CPU time is
        not the others'."""
        self._pids = tuple(pids)
        self._start = (_busy_seconds(), self._own(), time.perf_counter())

    def _own(self) -> float:
        return _own_cpu_seconds() + sum(_process_cpu_seconds(pid) for pid in self._pids)

    def share(self) -> float | None:
        busy0, own0, t0 = self._start
        busy1, own1, t1 = _busy_seconds(), self._own(), time.perf_counter()
        if busy0 is None or busy1 is None or t1 - t0 < _MIN_SPAN:
            return None  # /proc/stat counts in clock ticks: too coarse for a short span
        return other_share(busy1 - busy0, own1 - own0, t1 - t0, os.cpu_count() or 1)

    def seconds(self) -> float:
        """The span :meth:`share` covers: seconds since construction."""
        return time.perf_counter() - self._start[2]


def other_share(busy: float, own: float, seconds: float, cpus: int) -> float:
    """The share of ``cpus`` cores over ``seconds`` that others used: every process's busy CPU
    seconds (``/proc/stat``) less this process's own (all its threads, and its finished
    children), clipped to [0, 1] because the two counters tick at different moments."""
    return round(min(1.0, max(0.0, busy - own) / (seconds * cpus)), 3)


def _busy_seconds() -> float | None:
    """CPU seconds all processes spent busy since boot (``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a running process (``/proc/PID/stat``); 0
    where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def _own_cpu_seconds() -> float:
    """This process's CPU seconds and those of its children it has waited for (a llama.cpp
    tool it ran to the end is ours, not the others')."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system

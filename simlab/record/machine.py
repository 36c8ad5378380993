"""What a trace says about where and with what it was recorded."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import resource
import time

import torch

LIBRARIES = ("simlab", "torch", "transformers", "accelerate", "gguf", "safetensors", "numpy", "pandas", "pyarrow")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_name() -> str:
    """The CPU model as ``lscpu`` prints it (from /proc/cpuinfo), else the platform's guess."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_name(device: str) -> str:
    """E.g. ``Intel(R) Xeon(R) Processor, 2 cores`` or ``NVIDIA H100 80GB HBM3``."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_name()}, {os.cpu_count()} cores"


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_MIN_SPAN = 1.0  # seconds


class OtherLoad:
    """Share of the machine's CPU time that other processes have used since construction.

    Latencies and wall times measured on a shared CPU are only as good as the machine was
    quiet; the recorder stores this figure with the probe and with the recording so that a
    noisy measurement can be seen (and the probe re-run with ``--reprobe``). Linux only
    (``/proc/stat``); elsewhere :meth:`share` is None.
    """

    def __init__(self) -> None:
        self._start = (_busy_seconds(), _own_cpu_seconds(), time.perf_counter())

    def share(self) -> float | None:
        busy0, own0, t0 = self._start
        busy1, own1, t1 = _busy_seconds(), _own_cpu_seconds(), time.perf_counter()
        if busy0 is None or busy1 is None or t1 - t0 < _MIN_SPAN:
            return None  # /proc/stat counts in clock ticks: too coarse for a short span
        return other_share(busy1 - busy0, own1 - own0, t1 - t0, os.cpu_count() or 1)

    def seconds(self) -> float:
        """The span :meth:`share` covers: seconds since construction."""
        return time.perf_counter() - self._start[2]


def other_share(busy: float, own: float, seconds: float, cpus: int) -> float:
    """The share of ``cpus`` cores over ``seconds`` that others used: every process's busy CPU
    seconds (``/proc/stat``) less this process's own (all its threads), clipped to [0, 1]
    because the two counters tick at different moments."""
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


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system

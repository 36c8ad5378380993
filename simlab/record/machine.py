"""What a trace says about where and with what it was recorded."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import resource

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

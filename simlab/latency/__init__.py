"""Latency models: how long each forward takes, fed by measured data files."""

from simlab.latency.model import LatencyModel, TableLatency, load_profile, save_profile

__all__ = ["LatencyModel", "TableLatency", "load_profile", "save_profile"]

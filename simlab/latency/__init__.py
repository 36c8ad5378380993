"""Latency models: how long each forward takes, fed by measured data files.

Importing the package registers every profile kind (``table``, ``fitted``, ``roofline``) with
:func:`load_profile`.
"""

from simlab.latency import fitted as _fitted  # noqa: F401  (registers the "fitted" kind)
from simlab.latency import roofline as _roofline  # noqa: F401  (registers the "roofline" kind)
from simlab.latency.model import LatencyModel, TableLatency, load_profile, save_profile

__all__ = ["LatencyModel", "TableLatency", "load_profile", "save_profile"]

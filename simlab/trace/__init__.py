"""Traces: the schema, reading and writing, replay views and synthetic traces."""

from simlab.trace.io import Trace, empty_table, read_trace, write_trace
from simlab.trace.schema import SCHEMA_VERSION, Manifest

__all__ = ["Trace", "Manifest", "SCHEMA_VERSION", "read_trace", "write_trace", "empty_table"]

"""Traces: the schema, reading and writing, replay views and synthetic traces.

The names below load on first use (PEP 562), so a module that needs only the schema's
constants (the policies do) does not import pandas and pyarrow with the reader.
"""

import importlib

_NAMES = {"Trace": "io", "empty_table": "io", "read_trace": "io", "write_trace": "io",
          "SCHEMA_VERSION": "schema", "Manifest": "schema"}

__all__ = ["Trace", "Manifest", "SCHEMA_VERSION", "read_trace", "write_trace", "empty_table"]


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)

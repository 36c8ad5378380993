"""A trace in memory: its manifest and its tables, each readable as a DataFrame or as numpy columns.

Apart from reading and writing (:mod:`simlab.trace.io`) so that the checks a reader runs
(:mod:`simlab.trace.checks`) can name the type they check without importing the reader.

A trace holds each table as it came: the pyarrow Table read from its Parquet file, or the pandas
DataFrame a recorder, a synthetic trace or a test built. Two ways read it:

- ``trace.positions`` (and every other table's field) is a DataFrame, always: one held as a
  pyarrow Table is converted on first read and the DataFrame kept in its place, so that an edit
  to it is what every later read sees;
- :meth:`Trace.columns` gives a table's columns as numpy arrays from whichever is held, without
  pandas. Importing pandas costs a command about 0.4 s on a 2-core box, more than the rest of
  ``simlab simulate`` on the shipped trace, so what a plain replay reads (the checks of the
  required tables, :class:`~simlab.trace.replay.TraceReplay`, the latency medians) reads columns;
  tests/test_cli_startup.py pins that ``simlab simulate`` imports no pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa

from simlab.trace.schema import DEFAULTED_COLUMNS, Manifest, with_defaults

if TYPE_CHECKING:
    import pandas as pd


class _Table:
    """A dataclass field holding one of a trace's tables (a descriptor-typed field: the dataclass
    sets and reads it through :meth:`__set__` and :meth:`__get__`): held as given, read as a
    DataFrame. ``optional``: the field defaults to None; else it has no default."""

    def __init__(self, optional: bool = False):
        self.optional = optional

    def __set_name__(self, owner, name: str) -> None:
        self.name, self.slot = name, f"_{name}"

    def __get__(self, trace, owner=None):
        if trace is None:  # the dataclass asking for the field's default
            if self.optional:
                return None
            raise AttributeError(self.name)
        held = trace.__dict__[self.slot]
        if isinstance(held, pa.Table):
            held = trace.__dict__[self.slot] = with_defaults(self.name, held.to_pandas())
        return held

    def __set__(self, trace, value) -> None:
        trace.__dict__[self.slot] = value


@dataclass
class Trace:
    """A trace in memory: the manifest and its tables (module docstring: each a DataFrame when read
    as a field, numpy arrays through :meth:`columns`).

    ``layers`` is None when the trace has no per-layer early-exit signals, ``topk`` and
    ``tree`` when it was recorded without ``--topk`` / ``--tree-depth``, ``past_end`` when it
    holds no positions past the prompts' ends (every trace but ``simlab vllm record``'s).
    """

    manifest: Manifest
    prompts: pd.DataFrame = _Table()
    positions: pd.DataFrame = _Table()
    rollouts: pd.DataFrame = _Table()
    latency: pd.DataFrame = _Table()
    layers: pd.DataFrame | None = _Table(optional=True)
    path: Path | None = None
    topk: pd.DataFrame | None = _Table(optional=True)
    tree: pd.DataFrame | None = _Table(optional=True)
    past_end: pd.DataFrame | None = _Table(optional=True)

    @property
    def n_prompts(self) -> int:
        return len(self.columns("prompts"))

    @property
    def n_positions(self) -> int:
        return len(self.columns("positions"))

    def table(self, name: str) -> pd.DataFrame | None:
        return getattr(self, name)

    def has(self, name: str) -> bool:
        """Whether the trace holds table ``name`` (read without converting it)."""
        return self.__dict__[f"_{name}"] is not None

    def columns(self, name: str) -> "Columns":
        """Table ``name``'s columns as numpy arrays (module docstring); the table must be held."""
        return Columns(name, self.__dict__[f"_{name}"])

    def select_prompts(self, prompt_ids) -> "Trace":
        """A trace restricted to some prompts (e.g. a train/test split)."""
        ids = set(int(i) for i in prompt_ids)

        def keep(df: pd.DataFrame | None) -> pd.DataFrame | None:
            if df is None:
                return None
            return df[df["prompt_id"].isin(ids)].reset_index(drop=True)

        return replace(
            self,
            prompts=keep(self.prompts),
            positions=keep(self.positions),
            rollouts=keep(self.rollouts),
            layers=keep(self.layers),
            topk=keep(self.topk),
            tree=keep(self.tree),
            past_end=keep(self.past_end),
        )


class Columns:
    """One table's columns as numpy arrays, read from a pyarrow Table or a DataFrame, each once;
    a column of :data:`~simlab.trace.schema.DEFAULTED_COLUMNS` the table lacks reads as its
    default (as :func:`~simlab.trace.schema.with_defaults` fills it). ``rows``: the rows, in order,
    that this view reads (all of them when None): a subset or a sorting of the table's."""

    @classmethod
    def of(cls, name: str, table) -> "Columns":
        """The columns of table ``name`` given as a DataFrame or a pyarrow Table (or as columns)."""
        return table if isinstance(table, Columns) else cls(name, table)

    def __init__(self, name: str, table, rows: np.ndarray | None = None):
        self.name, self._table, self._rows = name, table, rows
        self._read: dict[str, np.ndarray] = {}
        self._arrow = isinstance(table, pa.Table)

    @property
    def names(self) -> list[str]:
        have = self._table.column_names if self._arrow else [str(c) for c in self._table.columns]
        return [*have, *(c for c in DEFAULTED_COLUMNS.get(self.name, {}) if c not in have)]

    def __contains__(self, col: str) -> bool:
        return col in self.names

    def __len__(self) -> int:
        if self._rows is not None:
            return len(self._rows)
        return self._table.num_rows if self._arrow else len(self._table)

    def __getitem__(self, col: str) -> np.ndarray:
        values = self._read.get(col)
        if values is None:
            values = self._read[col] = self._column(col)
        return values

    def _column(self, col: str) -> np.ndarray:
        have = self._table.column_names if self._arrow else self._table.columns
        if col not in have and col in DEFAULTED_COLUMNS.get(self.name, {}):
            return np.full(len(self), DEFAULTED_COLUMNS[self.name][col])
        values = _numpy(self._table.column(col)) if self._arrow else self._table[col].to_numpy()
        return values if self._rows is None else values[self._rows]

    def subset(self, rows: np.ndarray) -> "Columns":
        """The view of rows ``rows`` (indices into this view, in order)."""
        return Columns(self.name, self._table, rows if self._rows is None else self._rows[rows])

    def sorted_by(self, keys: Sequence[str]) -> "Columns":
        """This view stably sorted by ``keys`` (as ``DataFrame.sort_values(keys, kind="stable")``);
        itself when already sorted, as traces are written: checking is cheaper than sorting."""
        later = np.zeros(max(len(self) - 1, 0), dtype=bool)  # row i+1 sorts after row i on an earlier key
        tie = np.ones_like(later)
        for key in keys:
            step = np.diff(self[key])
            later |= tie & (step > 0)
            tie &= step == 0
        if (later | tie).all():
            return self
        return self.subset(np.lexsort([self[key] for key in reversed(keys)]))


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A column of a pyarrow Table as numpy, as ``to_pandas`` reads it: numbers as their own type
    (an integer column with a missing value as floats, NaN for it), text, truth values with a
    missing value and lists as objects (None for a missing one, where pandas reads missing text as
    NaN; a list as an array).

    Not pyarrow's ``to_numpy``: its conversion is the one ``to_pandas`` runs, which imports pandas
    (module docstring). Fixed-width numbers come through DLPack (no copy), the rest through Python
    objects; of these a trace holds only short columns (the prompts' text, the latency samples')."""
    array = column.combine_chunks()
    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        if array.null_count:
            array = (array if pa.types.is_floating(kind) else array.cast(pa.float64())).fill_null(math.nan)
        return np.from_dlpack(array)
    if pa.types.is_boolean(kind) and not array.null_count:
        return np.array(array.to_pylist(), dtype=bool)
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and not array.null_count:
        values, offsets = _numpy(pa.chunked_array([array.flatten()])), np.from_dlpack(array.offsets)
        rows = [values[a:b] for a, b in zip((offsets[:-1] - offsets[0]).tolist(), (offsets[1:] - offsets[0]).tolist())]
    else:
        rows = array.to_pylist()
    out = np.empty(len(rows), dtype=object)
    for i, value in enumerate(rows):  # one by one: equal-length lists would make a 2-D array
        out[i] = value
    return out

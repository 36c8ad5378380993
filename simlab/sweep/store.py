"""Finished sweep results on disk, keyed by configuration, so sweeps resume.

A configuration is everything a simulated result depends on: the trace's content, the
latency model, the seed, the topology, the policy and its parameters (defaults filled in),
and the source code of the simulator and policies (a fixed policy must not be answered from
a cache filled by the buggy one). :func:`digest` turns such a description into a key.

Rows are appended to one JSON-lines file per (trace, latency, seed, topology, code) as they
finish, and flushed at once, so Ctrl-C or a killed process keeps every finished row; a line
torn by a kill mid-write is skipped on reading. Only the sweep's main process writes; two
sweeps sharing a cache append whole lines (one ``write`` each, in append mode), so they do not
corrupt each other. A file that is not JSON lines beyond a torn last line (a disk error, a
binary file put there by mistake) is moved aside once, with a warning naming both paths, and
the sweep starts that store afresh instead of failing on every run.

Each row carries the sha256 of its own JSON (``"sha256"``). A row that does not match it (a
number edited by hand, a damaged disk) or that has none (written by a simlab before rows had
one) is not served: the sweep says so in one line and simulates that configuration again, and
the row it appends takes the old one's place. Recomputing, rather than refusing the sweep, because
the cache holds nothing that cannot be computed again: the right row costs one simulation, and a
refusal would only make the user delete the file by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from simlab.common.atomic import check_output
from simlab.common.errors import SimlabError

ROW_DIGEST = "sha256"  # the field of a row that holds the digest of the rest
KEY_CHARS = 20  # hex digits of sha256 kept in keys: collisions are not a practical concern

# Parts of the package that cannot change a simulated result.
NOT_SIMULATION = ("cli", "sweep", "plots", "frontier.py", "bench.py", "record", "models")


def digest(obj: Any) -> str:
    """A stable key for a JSON-able description."""
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_CHARS]


def frame_digest(df: pd.DataFrame | None) -> str:
    """A key for a table's content (names, types, every value, list columns included): the
    hash of its Arrow IPC stream, the form trace tables have on disk anyway."""
    if df is None:
        return "none"
    table = pa.Table.from_pandas(df, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()[:KEY_CHARS]


def code_digest() -> str:
    """A key for the source of every simlab module that can change a simulated result."""
    root = Path(__file__).resolve().parents[1]  # the simlab package
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_SIMULATION:
            continue
        h.update(str(rel).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:KEY_CHARS]


class ResultStore:
    """An append-only JSON-lines file of finished rows, each with a ``key``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        check_output(self.path.parent, "sweep cache (--cache or $SIMLAB_CACHE)", directory=True, force=True)
        if self.path.exists() and not self.path.is_file():
            raise SimlabError(f"sweep cache {self.path} is not a file; remove it or choose another --cache")

    def load(self) -> dict[str, dict]:
        """key -> row of every complete line.

        A line torn by a kill is skipped, and ended with a newline so that the next row
        appended starts a line of its own.
        """
        rows: dict[str, dict] = {}
        if not self.path.exists():
            return rows
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        unverified = set()  # keys of rows that do not match their digest
        for i, line in enumerate(lines):
            try:
                row = json.loads(line.decode())
            except (UnicodeDecodeError, json.JSONDecodeError):
                row = None
            if isinstance(row, dict) and "key" in row:
                if row.pop(ROW_DIGEST, None) == row_digest(row):
                    rows[row["key"]] = row
                else:
                    unverified.add(row["key"])
            elif line and i < len(lines) - 1:  # a bad line that is not the torn last one
                return self._set_aside()
        if data and not data.endswith(b"\n"):
            self._write("\n")
        recompute = len(unverified - set(rows))
        if recompute:
            print(f"simlab: warning: sweep cache {self.path}: {recompute} row(s) failed their sha256 check (edited, "
                  "damaged, or written by an older simlab); simulating them again", file=sys.stderr)
        return rows

    def _set_aside(self) -> dict[str, dict]:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(self.path, aside)
        print(f"simlab: warning: sweep cache {self.path} is corrupt; moved it to {aside} and starting afresh",
              file=sys.stderr)
        return {}

    def append(self, row: dict) -> None:
        """Write ``row`` with its digest (of the row as JSON gives it back)."""
        plain = json.loads(json.dumps(row, default=_plain))
        self._write(json.dumps({**plain, ROW_DIGEST: row_digest(plain)}) + "\n")

    def _write(self, text: str) -> None:
        """One ``write`` in append mode, so that concurrent writers never interleave a line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def row_digest(row: dict) -> str:
    """The sha256 of a row as JSON (keys sorted)."""
    return hashlib.sha256(json.dumps(row, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _plain(obj: Any) -> Any:
    """numpy scalars -> Python numbers; anything else -> its string."""
    return obj.item() if hasattr(obj, "item") else str(obj)

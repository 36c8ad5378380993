"""Reading and writing trace directories, with errors that say exactly what is wrong.

Writing is crash-safe. :func:`write_trace` fills a fresh directory beside the target and
renames it into place (:mod:`simlab.common.atomic`), writing ``manifest.json`` last, so a directory
with tables but no manifest is an interrupted write and is refused as one. :func:`update_trace`
(a recorder adding a prompt) renames each table into place, ``prompts.parquet`` (the list of
finished prompts) last; a reader keeps only rows of prompts listed there, so a recorder
killed between two renames still leaves a trace that loads, holding every finished prompt.

Reading checks each table file against the sha256 the manifest lists for it
(:mod:`simlab.trace.checksums`), then every column (nulls, finiteness, range), and names the
table, column, prompt and position of the first bad value (:mod:`simlab.trace.checks`). The
tables it returns are the pyarrow Tables read, which the trace turns into DataFrames only when
one is asked for (:mod:`simlab.trace.tables`): reading and replaying a trace needs no pandas.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from simlab.common.atomic import check_output, replace_dir, replace_file
from simlab.common.errors import SimlabError
from simlab.common.jsonfile import read_json
from simlab.trace.checks import check_manifest_types, validate
from simlab.trace.checksums import CHECKSUMS, PENDING, Listing, manifest_text, sha256
from simlab.trace.schema import (
    DEFAULTED_COLUMNS,
    MANIFEST,
    OPTIONAL_TABLES,
    SCHEMA_VERSION,
    TABLES,
    Manifest,
    with_defaults,
)
from simlab.trace.tables import Columns, Trace

if TYPE_CHECKING:
    import pandas as pd

# Written in this order; prompts last, because it is the commit record.
WRITE_ORDER = ("latency", "positions", "rollouts", "layers", "topk", "tree", "past_end", "prompts")


def empty_table(name: str) -> pd.DataFrame:
    """A DataFrame with the table's columns and no rows."""
    schema = _arrow_schema(name)
    return schema.empty_table().to_pandas()


def _arrow_schema(name: str) -> pa.Schema:
    return pa.schema([(col, pa.type_for_alias(t)) for col, t in TABLES[name].items()])


def _to_arrow(name: str, df: pd.DataFrame) -> pa.Table:
    """Cast the required columns to their schema types; extra columns keep theirs."""
    df = with_defaults(name, df)
    missing = [c for c in TABLES[name] if c not in df.columns]
    if missing:
        raise SimlabError(f"cannot write table {name!r}: missing columns {missing}")
    table = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
    fields = []
    for f in table.schema:
        t = TABLES[name].get(f.name)
        fields.append(pa.field(f.name, pa.type_for_alias(t)) if t else f)
    try:
        return table.cast(pa.schema(fields))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise SimlabError(f"cannot write table {name!r}: {exc}") from exc


def _write_files(trace: Trace, out: Path, in_place: bool = False) -> None:
    """Every table (prompts last), then the manifest with the tables' digests, each renamed into
    place in ``out``. ``in_place``: ``out`` holds the trace already, and its manifest first gains
    the new tables' digests as pending ones, so that a reader takes each table old or new while
    they are renamed (:mod:`simlab.trace.checksums`)."""
    files = {f"{name}.parquet": _parquet_bytes(_to_arrow(name, trace.table(name)))
             for name in WRITE_ORDER if trace.table(name) is not None}
    sums = {file: sha256(data) for file, data in files.items()}
    if in_place:
        sums = {**_mark_pending(out, sums), **sums}
    for file, data in files.items():
        replace_file(out / file, lambda p, d=data: p.write_bytes(d))
    manifest = manifest_text(trace.manifest.to_dict(), sums)
    replace_file(out / MANIFEST, lambda p: p.write_text(manifest))


def _parquet_bytes(table: pa.Table) -> bytes:
    """The Parquet file of ``table``, as ``pq.write_table`` writes it to disk."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _mark_pending(out: Path, pending: dict[str, str]) -> dict[str, str]:
    """List ``pending`` in the manifest in ``out`` as the digests of the tables on their way;
    return the digests of the table files there now (an update that does not rewrite a table
    keeps its entry)."""
    try:
        data = json.loads((out / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    tables = [f.name for f in sorted(out.glob("*.parquet")) if f.stem in TABLES]
    listed = data.get(CHECKSUMS) if isinstance(data, dict) else None
    if not isinstance(listed, dict):  # a trace without digests: the files as they are
        return {f: sha256((out / f).read_bytes()) for f in tables}
    # an earlier update killed midway: a file that matches its pending digest was renamed in
    before = data.get(PENDING) if isinstance(data.get(PENDING), dict) else {}
    now = {f: before[f] if f in before and sha256((out / f).read_bytes()) == before[f] else listed.get(f)
           for f in tables}
    now = {f: d for f, d in now.items() if d}
    text = manifest_text({k: v for k, v in data.items() if k not in (CHECKSUMS, PENDING)}, now, pending)
    replace_file(out / MANIFEST, lambda p: p.write_text(text))
    return now


def write_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` as a new directory ``path``, replacing any there; a reader sees the old
    trace or the new one, never a mix. Callers check first (:func:`simlab.common.atomic.check_output`)
    that replacing is what the user asked for."""
    check_output(path, "trace", directory=True, force=True, owned=MANIFEST)
    return replace_dir(path, lambda tmp: _write_files(trace, tmp))


def update_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Rewrite the trace in directory ``path`` in place (it grows by whole prompts, as a
    recording does): a reader keeps only committed prompts, so no copy of the trace is needed."""
    out = Path(path)
    _write_files(trace, out, in_place=True)
    return out


def read_trace(path: str | os.PathLike, allow_empty: bool = False) -> Trace:
    """Load and validate a trace directory; raise :class:`SimlabError` on any problem.

    ``allow_empty``: accept a trace with no finished prompt yet (a recording to resume)."""
    root = Path(path)
    if not root.exists():
        raise SimlabError(f"trace not found: {root}")
    if not root.is_dir():
        raise SimlabError(f"trace {root} is not a directory (a trace is a directory with {MANIFEST})")
    if not (root / MANIFEST).exists() and any(root.glob("*.parquet")):
        raise SimlabError(f"incomplete trace (interrupted write?): {root} has tables but no {MANIFEST}")
    manifest, listing = _read_manifest(root)
    tables: dict[str, pa.Table | None] = {}
    for name in TABLES:
        file = root / f"{name}.parquet"
        if not file.exists():
            if name in OPTIONAL_TABLES:
                listing.check_absent(file.name)
                tables[name] = None
                continue
            raise SimlabError(f"incomplete trace (interrupted write?): {root}: {file.name} is missing")
        tables[name] = _read_table(root, name, file, listing)
    done = Columns("prompts", tables["prompts"])["prompt_id"]
    for name in ("positions", "rollouts", "layers", "topk", "tree", "past_end"):
        table = tables[name]
        kept = np.isin(Columns(name, table)["prompt_id"], done) if table is not None else None
        if kept is not None and not kept.all():
            # Rows of a prompt whose recording was interrupted before it was committed.
            tables[name] = table.filter(pa.array(kept))
    trace = Trace(manifest=manifest, path=root, **tables)
    if trace.n_prompts == 0 and allow_empty:
        return trace
    validate(trace)
    return trace


def _read_manifest(root: Path) -> tuple[Manifest, Listing]:
    """The manifest, and the digests it lists for the table files."""
    file = root / MANIFEST
    if not file.exists():
        raise SimlabError(f"trace {root}: {MANIFEST} is missing (is this a trace directory?)")
    data = read_json(file, f"trace {root}: {MANIFEST}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SimlabError(
            f"trace {root} has schema version {version!r}; this simlab reads version {SCHEMA_VERSION}"
        )
    listing = Listing(data, root)
    unknown = set(data) - Manifest.field_names()
    if unknown:
        raise SimlabError(f"trace {root}: {MANIFEST} has unknown fields {sorted(unknown)}")
    check_manifest_types(data, f"trace {root}")
    try:
        return Manifest(**data), listing
    except TypeError as exc:
        raise SimlabError(f"trace {root}: {MANIFEST} is incomplete ({exc})") from exc


def _read_table(root: Path, name: str, file: Path, listing: Listing) -> pa.Table:
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise SimlabError(f"trace {root}: cannot read {file.name} ({exc.strerror or exc})") from None
    listing.check(file.name, data)
    try:
        # ParquetFile rather than pq.read_table: the same table, without importing pyarrow.dataset
        table = pq.ParquetFile(pa.BufferReader(data)).read()
    except (pa.ArrowException, OSError) as exc:  # any damage Arrow reports, not only ArrowInvalid
        raise SimlabError(f"trace {root}: {file.name} is not a readable Parquet file ({exc})") from exc
    missing = [c for c in TABLES[name] if c not in table.column_names and c not in DEFAULTED_COLUMNS.get(name, {})]
    if missing:
        raise SimlabError(f"trace {root}: {file.name} lacks columns {missing}")
    for col, t in TABLES[name].items():
        if col not in table.column_names:
            continue
        have, want = table.schema.field(col).type, pa.type_for_alias(t)
        if _kind(have) != _kind(want):
            raise SimlabError(f"trace {root}: {file.name} column {col!r} has type {have}, expected {want}")
    return table


def _kind(t: pa.DataType) -> str:
    """The family of an Arrow type: int32 and int64 are both fine for an integer column."""
    for kind, test in (
        ("bool", pa.types.is_boolean),
        ("int", pa.types.is_integer),
        ("float", pa.types.is_floating),
        ("string", lambda x: pa.types.is_string(x) or pa.types.is_large_string(x)),
    ):
        if test(t):
            return kind
    return str(t)

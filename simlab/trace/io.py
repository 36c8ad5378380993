"""Reading and writing trace directories, with errors that say exactly what is wrong.

Writing is crash-safe: every table is written to a temporary file and renamed into place, and
``prompts.parquet`` (the list of finished prompts) is renamed last. A reader keeps only rows
of prompts listed there, so a recorder killed between two renames still leaves a trace that
loads, holding every prompt that was finished.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simlab.errors import SimlabError
from simlab.jsonfile import read_json
from simlab.trace.schema import (
    LATENCY_OPS,
    MANIFEST,
    OPTIONAL_TABLES,
    SCHEMA_VERSION,
    TABLES,
    Manifest,
)

# Written in this order; prompts last, because it is the commit record.
WRITE_ORDER = ("latency", "positions", "rollouts", "layers", "prompts")


@dataclass
class Trace:
    """A trace in memory: the manifest and one DataFrame per table.

    ``layers`` is None when the trace has no per-layer early-exit signals.
    """

    manifest: Manifest
    prompts: pd.DataFrame
    positions: pd.DataFrame
    rollouts: pd.DataFrame
    latency: pd.DataFrame
    layers: pd.DataFrame | None = None
    path: Path | None = None

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)

    @property
    def n_positions(self) -> int:
        return len(self.positions)

    def table(self, name: str) -> pd.DataFrame | None:
        return getattr(self, name)

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
        )


def empty_table(name: str) -> pd.DataFrame:
    """A DataFrame with the table's columns and no rows."""
    schema = _arrow_schema(name)
    return schema.empty_table().to_pandas()


def _arrow_schema(name: str) -> pa.Schema:
    return pa.schema([(col, pa.type_for_alias(t)) for col, t in TABLES[name].items()])


def _to_arrow(name: str, df: pd.DataFrame) -> pa.Table:
    """Cast the required columns to their schema types; extra columns keep theirs."""
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


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def write_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` to directory ``path`` (created if needed), crash-safely."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    manifest = trace.manifest.to_dict()
    _atomic_write(out / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=2) + "\n"))
    for name in WRITE_ORDER:
        df = trace.table(name)
        if df is None:
            continue
        table = _to_arrow(name, df)
        _atomic_write(out / f"{name}.parquet", lambda p, t=table: pq.write_table(t, p))
    return out


def read_trace(path: str | os.PathLike) -> Trace:
    """Load and validate a trace directory; raise :class:`SimlabError` on any problem."""
    root = Path(path)
    if not root.exists():
        raise SimlabError(f"trace not found: {root}")
    if not root.is_dir():
        raise SimlabError(f"trace {root} is not a directory (a trace is a directory with {MANIFEST})")
    manifest = _read_manifest(root)
    tables: dict[str, pd.DataFrame | None] = {}
    for name in TABLES:
        file = root / f"{name}.parquet"
        if not file.exists():
            if name in OPTIONAL_TABLES:
                tables[name] = None
                continue
            raise SimlabError(f"trace {root}: {file.name} is missing")
        tables[name] = _read_table(root, name, file)
    done = set(tables["prompts"]["prompt_id"].tolist())
    for name in ("positions", "rollouts", "layers"):
        df = tables[name]
        if df is not None and not df["prompt_id"].isin(done).all():
            # Rows of a prompt whose recording was interrupted before it was committed.
            tables[name] = df[df["prompt_id"].isin(done)].reset_index(drop=True)
    trace = Trace(manifest=manifest, path=root, **tables)
    validate(trace)
    return trace


def _read_manifest(root: Path) -> Manifest:
    file = root / MANIFEST
    if not file.exists():
        raise SimlabError(f"trace {root}: {MANIFEST} is missing (is this a trace directory?)")
    data = read_json(file, f"trace {root}: {MANIFEST}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SimlabError(
            f"trace {root} has schema version {version!r}; this simlab reads version {SCHEMA_VERSION}"
        )
    unknown = set(data) - Manifest.field_names()
    if unknown:
        raise SimlabError(f"trace {root}: {MANIFEST} has unknown fields {sorted(unknown)}")
    try:
        return Manifest(**data)
    except TypeError as exc:
        raise SimlabError(f"trace {root}: {MANIFEST} is incomplete ({exc})") from exc


def _read_table(root: Path, name: str, file: Path) -> pd.DataFrame:
    try:
        table = pq.read_table(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SimlabError(f"trace {root}: {file.name} is not a readable Parquet file ({exc})") from exc
    missing = [c for c in TABLES[name] if c not in table.column_names]
    if missing:
        raise SimlabError(f"trace {root}: {file.name} lacks columns {missing}")
    for col, t in TABLES[name].items():
        have, want = table.schema.field(col).type, pa.type_for_alias(t)
        if _kind(have) != _kind(want):
            raise SimlabError(f"trace {root}: {file.name} column {col!r} has type {have}, expected {want}")
    return table.to_pandas()


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


def validate(trace: Trace) -> None:
    """Check the invariants that the simulator relies on; raise :class:`SimlabError`."""
    where = f"trace {trace.path}" if trace.path else "trace"
    m = trace.manifest
    if not (m.temperature >= 0) or math.isinf(m.temperature):
        raise SimlabError(f"{where}: temperature must be >= 0, got {m.temperature}")
    prompts, pos = trace.prompts, trace.positions
    if prompts["prompt_id"].duplicated().any():
        raise SimlabError(f"{where}: prompts.parquet lists a prompt_id twice")
    counts = pos.groupby("prompt_id")["pos"].agg(["count", "min", "max"])
    # checked for every prompt at once; the loop below only words the first failure
    have = counts.reindex(prompts["prompt_id"].to_numpy())
    n_tokens = prompts["n_tokens"].to_numpy()
    fine = ((n_tokens >= 1) & (have["count"].to_numpy() == n_tokens) & (have["min"].to_numpy() == 0)
            & (have["max"].to_numpy() == n_tokens - 1))
    for row in prompts[~fine].itertuples(index=False):
        n = int(row.n_tokens)
        if n < 1:
            raise SimlabError(f"{where}: prompt {row.prompt_id} has n_tokens={n}; need at least 1")
        if row.prompt_id not in counts.index:
            raise SimlabError(f"{where}: prompt {row.prompt_id} has no rows in positions.parquet")
        c = counts.loc[row.prompt_id]
        if c["count"] != n or c["min"] != 0 or c["max"] != n - 1:
            raise SimlabError(
                f"{where}: prompt {row.prompt_id} should have positions 0..{n - 1} exactly once in "
                f"positions.parquet (found {int(c['count'])} rows, {int(c['min'])}..{int(c['max'])})"
            )
    if pos.duplicated(["prompt_id", "pos"]).any():
        raise SimlabError(f"{where}: positions.parquet has a (prompt_id, pos) pair twice")
    for col in ("draft_conf", "q_target", "p_target", "p_draft", "accept_prob"):
        v = pos[col].to_numpy()
        bad = ~((v >= 0) & (v <= 1 + 1e-5))  # NaN fails both comparisons
        if bad.any():
            raise SimlabError(f"{where}: positions.parquet column {col!r} has {int(bad.sum())} values outside [0, 1]")
    ent = pos["draft_entropy"].to_numpy()
    if (ent < -1e-6).any():
        raise SimlabError(f"{where}: positions.parquet column 'draft_entropy' has negative values")
    for name in ("rollouts", "layers"):
        df = trace.table(name)
        if df is None or df.empty:
            continue
        v = df["draft_conf"].to_numpy()
        if (~((v >= 0) & (v <= 1 + 1e-5))).any():
            raise SimlabError(f"{where}: {name}.parquet column 'draft_conf' has values outside [0, 1]")
    if trace.layers is not None and not trace.layers.empty:
        per = trace.layers.groupby(["prompt_id", "layer"])["pos"].count()
        n = prompts.set_index("prompt_id")["n_tokens"]
        short = [key for key, count in per.items() if count != n.get(key[0], -1)]
        if short:
            raise SimlabError(f"{where}: layers.parquet must cover every position of each prompt and layer; "
                              f"(prompt_id, layer) {short[0]} does not")
    if not trace.rollouts.empty and (trace.rollouts["step"] < 1).any():
        raise SimlabError(f"{where}: rollouts.parquet steps start at 1")
    validate_latency(trace.latency, where)


def validate_latency(lat: pd.DataFrame, where: str) -> None:
    """Latency samples must be finite, positive and of known operations."""
    if lat.empty:
        raise SimlabError(f"{where}: latency.parquet has no samples")
    s = lat["seconds"].to_numpy(dtype=float)
    bad = ~np.isfinite(s) | (s <= 0)
    if bad.any():
        raise SimlabError(f"{where}: latency.parquet has {int(bad.sum())} NaN, infinite, zero or negative latencies")
    ops = set(lat["op"].unique()) - set(LATENCY_OPS)
    if ops:
        raise SimlabError(f"{where}: latency.parquet has unknown ops {sorted(ops)}; expected {list(LATENCY_OPS)}")
    for op in LATENCY_OPS:
        if not (lat["op"] == op).any():
            raise SimlabError(f"{where}: latency.parquet has no {op!r} samples")
    if (lat["k"] < 1).any() or (lat["context_len"] < 0).any():
        raise SimlabError(f"{where}: latency.parquet needs k >= 1 and context_len >= 0")

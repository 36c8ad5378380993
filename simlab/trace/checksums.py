"""Checksums of a trace's tables: the sha256 of every table file, listed in ``manifest.json``.

``"checksums": {"positions.parquet": "<sha256 hex>", ...}`` names every table file of the trace
with the digest of its bytes as written (the figure ``sha256sum positions.parquet`` prints).
:func:`simlab.trace.io.read_trace` hashes each file as it reads it and refuses, in one line naming
the file, a trace whose files differ from their digests, a table file the list lacks, or one it
lists that is gone. So one flipped byte anywhere in a table file (a data page, a page header, the
footer) is caught before any number is computed from it.

Why a digest per file rather than Parquet's own page checksums: page CRCs cover the data pages
only (not the footer, which holds the schema, row counts and the statistics), they are checked
only by a reader that asks for it, and adding them means rewriting every table of every trace;
a digest per file covers every byte, costs about 2 ms per MB to check, and leaves the tables as
they are: a trace gains digests by a change to its manifest alone (:func:`rehash`).

Every trace is written by :mod:`simlab.trace.io`, which hashes the bytes it writes. An in-place
update (a recorder committing a prompt) renames its tables into place one by one, so for the
while it takes the manifest also lists the new tables' digests under ``"checksums_pending"``: a
file that matches either list is whole, and a recorder killed between two renames leaves a trace
that loads, as it did before digests. A trace written before simlab kept digests loads with a
one-line note, once per process; ``simlab trace rehash TRACE`` adds them (and is also what to run
after editing a table on purpose).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

from simlab.common.atomic import replace_file
from simlab.common.errors import SimlabError
from simlab.common.jsonfile import read_json
from simlab.trace.schema import MANIFEST, TABLES

CHECKSUMS = "checksums"  # manifest field: table file -> sha256 of its bytes
PENDING = "checksums_pending"  # manifest field while an in-place update renames tables into place
TABLE_FILES = tuple(f"{name}.parquet" for name in TABLES)
_HEX = re.compile(r"[0-9a-f]{64}")
_noted: set[str] = set()  # the traces without digests this process has said so of


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digests(root: Path) -> dict[str, str]:
    """The sha256 of every table file in ``root``."""
    return {f: sha256((root / f).read_bytes()) for f in TABLE_FILES if (root / f).is_file()}


def manifest_text(fields: dict, sums: dict[str, str], pending: dict[str, str] | None = None) -> str:
    """``manifest.json`` as written: the manifest's fields, then the digests."""
    data = {**fields, CHECKSUMS: dict(sorted(sums.items()))}
    if pending:
        data[PENDING] = dict(sorted(pending.items()))
    return json.dumps(data, indent=2) + "\n"


class Listing:
    """The digests a manifest lists (``None``: a trace written before simlab kept them), and
    the check of each table file against them."""

    def __init__(self, data: dict, root: Path):
        """Take the checksum fields out of ``data`` (a manifest as read) and check their form."""
        self.root = root
        self.sums = _field(data.pop(CHECKSUMS, None), CHECKSUMS, root)
        self.pending = _field(data.pop(PENDING, None), PENDING, root) or {}

    def check(self, file: str, data: bytes) -> None:
        """Raise unless ``data``, the bytes of table ``file``, are those the manifest lists."""
        if self.sums is None:
            _note(self.root)
            return
        if file not in self.sums and file not in self.pending:
            raise SimlabError(f"trace {self.root}: {file} is not listed in {MANIFEST}'s checksums (put there after the "
                              f"trace was written?); remove it, or if it belongs to the trace run `simlab trace rehash "
                              f"{self.root}`")
        if sha256(data) not in (self.sums.get(file), self.pending.get(file)):
            raise SimlabError(f"trace {self.root}: {file} does not match its sha256 in {MANIFEST}: the file was damaged "
                              f"or edited after the trace was written; copy it again from where the trace came from, or "
                              f"if the edit was deliberate run `simlab trace rehash {self.root}`")

    def check_absent(self, file: str) -> None:
        """Raise if the manifest lists ``file``, an optional table that is not there."""
        if self.sums is not None and file in self.sums:
            raise SimlabError(f"trace {self.root}: {file} is missing, but {MANIFEST} lists its checksum (deleted?); copy "
                              f"the trace again from where it came from")


def _field(value, name: str, root: Path) -> dict[str, str] | None:
    if value is None:
        return None
    if not (isinstance(value, dict) and all(isinstance(v, str) and _HEX.fullmatch(v) for v in value.values())):
        raise SimlabError(f"trace {root}: {MANIFEST} field {name!r} must map table files to sha256 digests (64 hex "
                          f"digits); run `simlab trace rehash {root}` to write it again")
    unknown = sorted(set(value) - set(TABLE_FILES))
    if unknown:
        raise SimlabError(f"trace {root}: {MANIFEST} field {name!r} names {unknown}, which are not trace tables; run "
                          f"`simlab trace rehash {root}` to write it again")
    return value


def _note(root: Path) -> None:
    if str(root) not in _noted:
        _noted.add(str(root))
        print(f"simlab: note: trace {root} has no checksums in {MANIFEST} (written by an older simlab), so a damaged "
              f"table would go unnoticed; `simlab trace rehash {root}` adds them", file=sys.stderr)


def rehash(path: str | os.PathLike) -> dict[str, str]:
    """Write the sha256 of every table file of trace ``path`` into its manifest, changing nothing
    else (no table is rewritten); return the digests. For a trace written before simlab kept
    digests, and after a deliberate edit of a table."""
    root = Path(path)
    data = read_json(root / MANIFEST, f"trace {root}: {MANIFEST}")
    data.pop(CHECKSUMS, None)
    data.pop(PENDING, None)
    sums = file_digests(root)
    if not sums:
        raise SimlabError(f"trace {root} holds no table files ({', '.join(TABLE_FILES[:2])}, ...)")
    text = manifest_text(data, sums)
    replace_file(root / MANIFEST, lambda p: p.write_text(text))
    return sums

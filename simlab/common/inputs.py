"""Input files the user names, checked the same way everywhere: a path that does not exist, a
directory where a file is wanted, a file that cannot be read or is not text each fail in one line
that names the file and what it was meant to be (``what``: "arrivals file", "latency profile")."""

from __future__ import annotations

import os
from pathlib import Path

from simlab.common.errors import SimlabError


def input_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path if it names an existing file; raise :class:`SimlabError` if not."""
    p = Path(path)
    if p.is_dir():
        raise SimlabError(f"{what} {p} is a directory; it must name a file")
    if not p.is_file():
        raise SimlabError(f"{what} not found: {p}")
    return p


def read_text(path: str | os.PathLike, what: str) -> str:
    """The text of the file ``path`` (UTF-8); a binary file or one that cannot be read says so."""
    p = input_file(path, what)
    try:
        return p.read_text()
    except UnicodeDecodeError:
        raise SimlabError(f"{what} {p} is not a text file (not UTF-8 at some byte); give a text file") from None
    except OSError as exc:
        raise SimlabError(f"cannot read {what} {p} ({exc.strerror})") from None

"""Reading simlab's JSON data files (latency profiles, predictors, shape tables) with one-line
errors: a missing file, bad JSON, another format or version each say so."""

from __future__ import annotations

import json
import os
from pathlib import Path

from simlab.common.atomic import replace_file
from simlab.common.errors import SimlabError
from simlab.common.inputs import read_text


def read_json(path: str | os.PathLike, what: str) -> dict:
    """The JSON object in ``path``; ``what`` names the file in messages ("latency profile")."""
    p = Path(path)
    text = read_text(p, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SimlabError(f"{what} {p} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise SimlabError(f"{what} {p} must hold a JSON object")
    return data


def read_versioned(path: str | os.PathLike, what: str, fmt: str, version: int) -> dict:
    """Like :func:`read_json`, for files that carry ``"format"`` and ``"version"`` fields."""
    data = read_json(path, what)
    if data.get("format") != fmt:
        raise SimlabError(f"{what} {path} is not a {fmt!r} file")
    if data.get("version") != version:
        raise SimlabError(f"{what} {path} has version {data.get('version')!r}; this simlab reads {version}")
    return data


def write_json(data: dict, path: str | os.PathLike) -> Path:
    """Write ``data`` indented in one rename, creating the folder; return the path."""
    text = json.dumps(data, indent=2) + "\n"
    return replace_file(path, lambda tmp: tmp.write_text(text))

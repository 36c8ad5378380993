"""Where an installed catalog model lives: its cached directory, valid only while its marker
names the sha256 the catalog expects.

Apart from :mod:`simlab.models.install` (which writes the cache) so that loading a model
(:mod:`simlab.models.load`) reads it without importing the installer, which in turn loads
models to convert them.
"""

from __future__ import annotations

import json
from pathlib import Path

from simlab.common.locations import cache_root
from simlab.models.catalog import CATALOG

MARKER = "simlab-model.json"


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def installed_path(name: str) -> Path | None:
    """The cached directory of catalog model ``name``, or None when it is not installed."""
    spec = CATALOG.get(name)
    marker = model_dir(name) / MARKER
    if spec is None or not marker.is_file():
        return None
    try:
        ok = json.loads(marker.read_text()).get("sha256") == spec.sha256
    except (json.JSONDecodeError, UnicodeDecodeError):
        ok = False
    return marker.parent if ok else None

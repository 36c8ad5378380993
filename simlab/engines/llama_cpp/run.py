"""Run the real ``llama-speculative-simple`` on one prompt and read the counters it prints.

``examples/speculative-simple/speculative-simple.cpp`` ends with::

    decoded  N tokens in  T seconds, speed:  S t/s
    n_draft   = draft_max
    n_predict = N
    n_drafted = sum of the drafts the target verified
    n_accept  = sum of the accepted drafts

``T`` is the decode loop's wall time: the prefill (all prompt tokens but the last, on both
models) is before it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from simlab.common.errors import SimlabError
from simlab.engines.llama_cpp.args import ModelPair, drafting_args, environment

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_COUNTERS = {name: re.compile(rf"\b{name}\s*=\s*(\d+)") for name in ("n_predict", "n_drafted", "n_accept")}


@dataclass(frozen=True)
class EngineRun:
    """What llama-speculative-simple printed for one prompt."""

    n_predict: int
    n_drafted: int
    n_accept: int
    decode_seconds: float
    tokens_per_s: float


def run(binary: Path, pair: ModelPair, prompt: str, n_predict: int, draft_max: int, draft_min: int,
        p_min: float) -> EngineRun:
    cmd = [str(binary), *pair.args(prompt, n_predict), *drafting_args(draft_max, draft_min, p_min)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=environment())
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SimlabError(f"{binary.name} exited {done.returncode}: {tail[0]}")
    return parse(done.stdout + "\n" + done.stderr)


def parse(log: str) -> EngineRun:
    """The counters of a llama-speculative-simple log; SimlabError when one is missing."""
    decoded = _DECODED.search(log)
    counters = {name: pattern.search(log) for name, pattern in _COUNTERS.items()}
    missing = [name for name, m in counters.items() if m is None] + ([] if decoded else ["decoded ... t/s"])
    if missing:
        raise SimlabError(f"llama-speculative-simple printed no {', '.join(missing)} (its output format changed?)")
    return EngineRun(
        n_predict=int(counters["n_predict"].group(1)),
        n_drafted=int(counters["n_drafted"].group(1)),
        n_accept=int(counters["n_accept"].group(1)),
        decode_seconds=float(decoded.group(2)),
        tokens_per_s=float(decoded.group(3)),
    )

"""A trace recorded with llama.cpp as the engine: its numerics, its latencies.

Each prompt runs the trace tool (``llama_trace.cpp``, built by :mod:`simlab.engines.llama_cpp`)
once; its rows become the same tables ``simlab record`` writes, through the same writer
(:mod:`simlab.trace.io`). What differs from a transformers recording, and why:

- the greedy path and every probability come from llama.cpp's own forwards of the GGUF
  weights (quantised kernels, not de-quantised float32), so the path can differ from the
  transformers trace of the same pair;
- ``draft_conf`` is the draft's top-1 probability as llama.cpp's draft sampler reports it, a
  softmax over the 10 largest logits (``common/speculative.cpp``), because that is what
  ``--draft-p-min`` is compared with; entropies and the other probabilities are over the
  whole vocabulary;
- position 0 is the prompt's last token and ``prompt_len`` one less than the prompt's tokens:
  ``llama-speculative-simple`` prefills all but the last prompt token and drafts from the last
  one, so its first generated token is already speculated (simlab's rounds start after
  position 0, which the prefill settles);
- latencies are the steps llama-speculative-simple takes, sampling included: a draft step,
  and a verification of k tokens (the target's forward with every position's logits, its
  sampler on each, and the draft's forward of the same batch), at the given context lengths.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from simlab.errors import SimlabError
from simlab.trace.io import Trace, write_trace
from simlab.trace.schema import NO_LAYER, TABLES, Manifest

from .llama_args import ModelPair, environment

# What the draft_conf column means in a llama.cpp trace (kept in the manifest).
DRAFT_CONF = "top-1 probability of llama.cpp's draft sampler: a softmax over the 10 largest logits"


@dataclass(frozen=True)
class EnginePrompt:
    prompt_id: int
    source: str
    text: str  # what llama.cpp is given with -p (chat template already applied)


@dataclass(frozen=True)
class Probe:
    """Forward latencies to time: target forwards of each k, draft steps, at each context."""

    ks: tuple[int, ...] = tuple(range(1, 10))
    contexts: tuple[int, ...] = (128, 512)
    repeats: int = 3


def record(tool: Path, pair: ModelPair, prompts: Sequence[EnginePrompt], manifest: Manifest, out: Path,
           probe: Probe = Probe(), progress: Callable[[int], None] = lambda _: None) -> Trace:
    """Record ``prompts`` with ``manifest.max_new_tokens`` positions each and write the trace to ``out``."""
    if manifest.max_new_tokens < 2:
        raise SimlabError("a llama.cpp trace needs at least 2 positions per prompt (--max-new-tokens 2)")
    rows: dict[str, list[pd.DataFrame]] = {name: [] for name in ("prompts", "positions", "rollouts", "latency")}
    for i, prompt in enumerate(prompts):
        # the latencies are measured once, after the first prompt's path
        tables = _one_prompt(tool, pair, prompt, manifest.max_new_tokens, manifest.rollout_len,
                             probe if i == 0 else Probe(ks=(), contexts=(), repeats=0))
        for name, df in tables.items():
            rows[name].append(df)
        progress(i + 1)
    trace = Trace(manifest=manifest, **{name: pd.concat(dfs, ignore_index=True) for name, dfs in rows.items()})
    write_trace(trace, out)
    return trace


def reprobe(tool: Path, pair: ModelPair, prompt: EnginePrompt, probe: Probe = Probe()) -> pd.DataFrame:
    """The step latencies timed again now (on ``prompt``, generating one token): a trace's own
    were timed when it was recorded, and a shared machine drifts between then and a run."""
    return _one_prompt(tool, pair, prompt, 2, 0, probe)["latency"]


def _one_prompt(tool: Path, pair: ModelPair, prompt: EnginePrompt, positions: int, rollout_len: int,
                probe: Probe) -> dict[str, pd.DataFrame]:
    with tempfile.TemporaryDirectory(prefix="simlab-llama-") as tmp:
        rows_file = Path(tmp) / "rows.tsv"
        cmd = [str(tool), str(rows_file), str(rollout_len), _ints(probe.ks), _ints(probe.contexts),
               str(probe.repeats), "--", *pair.args(prompt.text, positions - 1)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=environment())
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SimlabError(f"llama.cpp trace tool failed on prompt {prompt.source} (exit {done.returncode}): {tail[0]}")
        return parse_rows(rows_file.read_text(), prompt)


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def parse_rows(text: str, prompt: EnginePrompt) -> dict[str, pd.DataFrame]:
    """The trace tool's tab-separated rows -> the prompt's rows of each trace table."""
    by_kind: dict[str, list[list[str]]] = {"H": [], "P": [], "R": [], "L": []}
    for line in text.splitlines():
        fields = line.split("\t")
        if fields[0] not in by_kind:
            raise SimlabError(f"llama.cpp trace tool wrote an unknown row {line[:60]!r}")
        by_kind[fields[0]].append(fields[1:])
    if len(by_kind["H"]) != 1:
        raise SimlabError(f"llama.cpp trace tool wrote no prompt row for {prompt.source}")
    prompt_len, n_tokens, stop = by_kind["H"][0]
    pid = prompt.prompt_id
    return {
        "prompts": _frame("prompts", [[pid, prompt.source, prompt_len, n_tokens, stop, prompt.text]]),
        "positions": _frame("positions", [[pid, *row] for row in by_kind["P"]]),
        "rollouts": _frame("rollouts", [[pid, *row, NO_LAYER] for row in by_kind["R"]]),
        "latency": _frame("latency", [[op, k, ctx, NO_LAYER, False, rep, s, 1] for op, k, ctx, rep, s in by_kind["L"]]),
    }


_DTYPES = {"int32": "int32", "float32": "float32", "float64": "float64", "string": "object", "bool": "bool"}


def _frame(name: str, rows: list[list]) -> pd.DataFrame:
    columns = TABLES[name]
    df = pd.DataFrame(rows, columns=list(columns))
    return df.astype({c: _DTYPES[t] for c, t in columns.items()})

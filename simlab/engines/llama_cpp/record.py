"""A trace recorded with llama.cpp as the engine: its numerics, its latencies.

Each prompt runs the trace tool (``llama_trace.cpp``, built by :mod:`simlab.engines.llama_cpp.build`)
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
  sampler on each, and the draft's forward of the same batch), at the given context lengths;
- with a batch axis (``Probe.batches``), the same two steps for B sequences decoded together,
  as ``llama-server`` steps its B parallel slots: one draft decode of one token per sequence
  (each sampled with its own top-k 10 sampler), and one target decode of k tokens per sequence
  (all logits, all sampled) followed by the draft's decode of that batch. The tool runs once
  per B with ``-np B`` (its KV cache then per sequence, not unified, as llama-server's with an
  explicit ``-np``) and its rows get ``batch = B``: ``simlab serve`` prices batched steps from
  them (:mod:`simlab.latency.batch`) instead of extrapolating from one sequence.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from simlab.common.cpu_load import OtherLoad
from simlab.common.errors import SimlabError
from simlab.engines.llama_cpp.args import ModelPair, environment
from simlab.trace.io import Trace, write_trace
from simlab.trace.schema import NO_LAYER, TABLES, Manifest

# What the draft_conf column means in a llama.cpp trace (kept in the manifest).
DRAFT_CONF = "top-1 probability of llama.cpp's draft sampler: a softmax over the 10 largest logits"


@dataclass(frozen=True)
class EnginePrompt:
    prompt_id: int
    source: str
    text: str  # what llama.cpp is given with -p (chat template already applied)


@dataclass(frozen=True)
class Probe:
    """Forward latencies to time: target forwards of each k, draft steps, at each context.

    ``batches`` adds the batch axis: for every B > 1 in it, target forwards of B sequences x k
    tokens for each k in ``batch_ks`` (1-9 by default: verifications of up to 8 drafts) and
    batched draft steps, at the same contexts and repeats. Batch 1 (the single-sequence series
    of ``ks``) is always probed."""

    ks: tuple[int, ...] = tuple(range(1, 10))
    contexts: tuple[int, ...] = (128, 512)
    repeats: int = 3
    batches: tuple[int, ...] = (1,)
    batch_ks: tuple[int, ...] = tuple(range(1, 10))

    def __post_init__(self):
        if any(b < 1 for b in self.batches) or any(k < 1 for k in self.batch_ks):
            raise SimlabError(f"batch sizes and their ks must be >= 1, got batches {self.batches}, ks {self.batch_ks}")


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
        if i == 0:
            tables["latency"] = pd.concat([tables["latency"], *_batched(tool, pair, prompt, probe)], ignore_index=True)
        for name, df in tables.items():
            rows[name].append(df)
        progress(i + 1)
    trace = Trace(manifest=manifest, **{name: pd.concat(dfs, ignore_index=True) for name, dfs in rows.items()})
    write_trace(trace, out)
    return trace


def reprobe(tool: Path, pair: ModelPair, prompt: EnginePrompt, probe: Probe = Probe()) -> pd.DataFrame:
    """The step latencies timed again now (on ``prompt``, generating one token): a trace's own
    were timed when it was recorded, and a shared machine drifts between then and a run."""
    single = _one_prompt(tool, pair, prompt, 2, 0, probe)["latency"]
    return pd.concat([single, *_batched(tool, pair, prompt, probe)], ignore_index=True)


def reprobe_trace(tool: Path, pair: ModelPair, trace: Trace, probe: Probe, hardware: str, command: str) -> Trace:
    """``trace`` with its step latencies timed again on this machine (``hardware``), on its first
    prompt: its path, confidences and rollouts are kept, so only prices move. For a trace recorded
    elsewhere, or before the tool timed llama.cpp's plain decoding step (``target_step``,
    2026-11-28), without decoding its prompts again. The manifest keeps where the tokens were
    recorded (``tokens_recorded_on``), the command, and the probe with its time and the CPU share
    other processes took meanwhile (``reprobe``)."""
    first = trace.prompts.iloc[0]
    started, load = time.perf_counter(), OtherLoad()
    latency = reprobe(tool, pair, EnginePrompt(int(first.prompt_id), first.source, first.prompt_text), probe)
    old = trace.manifest
    extra = {**old.extra, "resumed": [*old.extra.get("resumed", []), command],
             "reprobe": {"finished": datetime.now(timezone.utc).isoformat(timespec="seconds"), "probe": asdict(probe),
                         "probe_seconds": round(time.perf_counter() - started, 1), "probe_other_cpu": load.share()}}
    if old.hardware != hardware:
        extra["tokens_recorded_on"] = extra.get("tokens_recorded_on", old.hardware)
    return replace(trace, manifest=replace(old, hardware=hardware, extra=extra), latency=latency)


def _one_prompt(tool: Path, pair: ModelPair, prompt: EnginePrompt, positions: int, rollout_len: int,
                probe: Probe) -> dict[str, pd.DataFrame]:
    text = _run_tool(tool, [str(rollout_len), _ints(probe.ks), _ints(probe.contexts), str(probe.repeats), "1", "--",
                            *pair.args(prompt.text, positions - 1)], prompt)
    return parse_rows(text, prompt)


def _batched(tool: Path, pair: ModelPair, prompt: EnginePrompt, probe: Probe) -> list[pd.DataFrame]:
    """The batch axis: the tool once per batch size B > 1, its latency rows (``batch = B``)."""
    frames = []
    for b in sorted(set(probe.batches) - {1}):
        text = _run_tool(tool, ["0", _ints(probe.batch_ks), _ints(probe.contexts), str(probe.repeats), str(b), "--",
                                *pair.args(prompt.text, 1), *batch_args(probe, b)], prompt)
        frames.append(parse_latency(text))
    return frames


def batch_args(probe: Probe, batch: int) -> list[str]:
    """llama.cpp arguments for ``batch`` sequences: ``-np`` slots, each with the KV cells the
    probe's longest context and k need (llama.cpp gives each of the -np sequences -c / -np
    cells, rounded up to 256, as llama-server's slots get)."""
    need = max(probe.contexts, default=0) + max(probe.batch_ks, default=1)
    per_sequence = -(-need // 256) * 256
    return ["-np", str(batch), "-c", str(batch * per_sequence)]


def _run_tool(tool: Path, args: list[str], prompt: EnginePrompt) -> str:
    """The trace tool's rows (OUT ROLLOUT_LEN KS CONTEXTS REPEATS BATCH -- llama args)."""
    with tempfile.TemporaryDirectory(prefix="simlab-llama-") as tmp:
        rows_file = Path(tmp) / "rows.tsv"
        done = subprocess.run([str(tool), str(rows_file), *args], capture_output=True, text=True, env=environment())
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SimlabError(f"llama.cpp trace tool failed on prompt {prompt.source} (exit {done.returncode}): {tail[0]}")
        return rows_file.read_text()


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def parse_rows(text: str, prompt: EnginePrompt) -> dict[str, pd.DataFrame]:
    """The trace tool's tab-separated rows -> the prompt's rows of each trace table."""
    by_kind = _by_kind(text)
    if len(by_kind["H"]) != 1:
        raise SimlabError(f"llama.cpp trace tool wrote no prompt row for {prompt.source}")
    prompt_len, n_tokens, stop = by_kind["H"][0]
    pid = prompt.prompt_id
    return {
        "prompts": _frame("prompts", [[pid, prompt.source, prompt_len, n_tokens, stop, prompt.text]]),
        "positions": _frame("positions", [[pid, *row] for row in by_kind["P"]]),
        "rollouts": _frame("rollouts", [[pid, *row, NO_LAYER] for row in by_kind["R"]]),
        "latency": _latency(by_kind["L"]),
    }


def parse_latency(text: str) -> pd.DataFrame:
    """A batch probe's rows (``L`` rows only) -> latency rows."""
    by_kind = _by_kind(text)
    if by_kind["H"] or by_kind["P"] or by_kind["R"]:
        raise SimlabError("llama.cpp trace tool wrote a path in a batch probe")
    return _latency(by_kind["L"])


def _by_kind(text: str) -> dict[str, list[list[str]]]:
    by_kind: dict[str, list[list[str]]] = {"H": [], "P": [], "R": [], "L": []}
    for line in text.splitlines():
        fields = line.split("\t")
        if fields[0] not in by_kind:
            raise SimlabError(f"llama.cpp trace tool wrote an unknown row {line[:60]!r}")
        by_kind[fields[0]].append(fields[1:])
    return by_kind


def _latency(rows: list[list[str]]) -> pd.DataFrame:
    """``L op k context_len repeat seconds batch`` rows -> the latency table's rows."""
    if any(len(row) != 6 for row in rows):
        raise SimlabError("llama.cpp trace tool wrote a latency row without its batch size (an old tool?)")
    return _frame("latency", [[op, k, ctx, NO_LAYER, False, rep, s, b] for op, k, ctx, rep, s, b in rows])


_DTYPES = {"int32": "int32", "float32": "float32", "float64": "float64", "string": "object", "bool": "bool"}


def _frame(name: str, rows: list[list]) -> pd.DataFrame:
    columns = TABLES[name]
    df = pd.DataFrame(rows, columns=list(columns))
    return df.astype({c: _DTYPES[t] for c, t in columns.items()})

"""Running vLLM from simlab: a job file out, the runner's lines back, as Python objects.

:func:`run` writes the job (:class:`Engine`, the requests, the batches to run them in) beside its
output, starts :mod:`simlab.engines.vllm.simlab_vllm_runner` with vLLM's Python (its own
environment: :mod:`simlab.engines.vllm.install`) and follows the output file for progress. The
output is appended batch by batch and read back by :func:`read`, so a run interrupted (Ctrl-C, a
crash, a killed machine) keeps every batch it finished and the same call resumes after them.
A model vLLM cannot load, or a runner that dies, is a one-line :class:`SimlabError` naming the log.

What one batch holds (:class:`Batch`): per request the tokens, vLLM's ``per_step_drafted`` and
``per_step_accepted`` and the engine core's timestamps (:class:`RequestResult`); the batch's
spec-decode counters; and every engine step the worker ran (:class:`Step`: who was scheduled how
many tokens, and the seconds of each forward).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simlab.common.errors import SimlabError

RUNNER = Path(__file__).with_name("simlab_vllm_runner.py")
KV_CACHE_GIB = 2  # VLLM_CPU_KVCACHE_SPACE: vLLM's CPU default takes most of the machine's memory


@dataclass(frozen=True)
class Engine:
    """``vllm.LLM(**engine_args())``: the target, its dtype and length, the speculation (None: plain
    decoding). Prefix caching is off by default: a cached prompt changes both the prefill's work
    and, when all but one token of it is cached, adds a step of placeholder drafts (docs/vllm.md)."""

    model: str
    dtype: str = "float32"
    max_model_len: int = 2048
    speculative_config: dict | None = None
    prefix_caching: bool = False
    kv_cache_gib: int = KV_CACHE_GIB
    env: dict[str, str] = field(default_factory=dict)  # e.g. VLLM_CPU_NUM_OF_RESERVED_CPU
    pythonpath: tuple[str, ...] = ()  # folders vLLM imports from besides its own (Arctic Inference's suffix tree)
    worker_extension: str | None = None  # `vllm serve --worker-extension-cls` (simlab_vllm_synthetic's kernel)

    def engine_args(self) -> dict:
        args = {"model": self.model, "dtype": self.dtype, "max_model_len": self.max_model_len,
                "enable_prefix_caching": self.prefix_caching}
        if self.speculative_config:
            args["speculative_config"] = dict(self.speculative_config)
        return args


@dataclass(frozen=True)
class Request:
    id: str
    prompt_token_ids: list[int]
    sampling: dict = field(default_factory=dict)  # vllm.SamplingParams keywords, over the job's defaults


@dataclass(frozen=True)
class RequestResult:
    id: str
    token_ids: list[int]
    finish_reason: str
    per_step_drafted: list[int]
    per_step_accepted: list[int]
    times: dict  # the engine core's timestamps (monotonic s): queued_ts, scheduled_ts, first_token_ts, last_token_ts
    engine_id: str = ""

    @property
    def decode_seconds(self) -> float:
        """From the first token to the last: the decode phase (the prefill excluded, as simlab's
        wall times are)."""
        return float(self.times["last_token_ts"] - self.times["first_token_ts"])


@dataclass(frozen=True)
class Step:
    """One engine step in the worker: ``reqs`` maps vLLM's request id to (tokens scheduled, draft
    tokens among them, tokens computed before); forwards are (tokens, seconds) lists."""

    t0: float
    t1: float
    execute: float  # the target's forward and its input preparation (execute_model)
    sample: float  # rejection sampling and the drafter's proposal (sample_tokens)
    reqs: dict[str, list[int]]
    target: list[list[float]]
    target_logits: list[list[float]]
    draft: list[list[float]]
    draft_logits: list[list[float]]
    propose: float = 0.0

    @classmethod
    def read(cls, raw: dict) -> Step:
        return cls(t0=raw["t0"], t1=raw.get("t1", raw["t0"] + raw["execute"]), execute=raw["execute"],
                   sample=raw.get("sample", 0.0), reqs=raw["reqs"], target=raw["target"],
                   target_logits=raw["target_logits"], draft=raw["draft"], draft_logits=raw["draft_logits"],
                   propose=raw.get("propose", 0.0))


@dataclass(frozen=True)
class Batch:
    index: int
    ids: list[str]
    wall: float
    counters: dict
    requests: dict[str, RequestResult]
    steps: list[Step]


@dataclass(frozen=True)
class Output:
    engine: dict | None  # the last engine start: load seconds, vLLM version, OpenMP threads
    batches: dict[int, Batch]


def read(path: Path) -> Output:
    """The runner's output so far (a line cut short by an interruption is skipped)."""
    engine, batches = None, {}
    if not path.exists():
        return Output(None, {})
    for line in path.read_text().splitlines():
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if raw.get("type") == "engine":
            engine = raw
        elif raw.get("type") == "batch":
            requests = {r["id"]: RequestResult(**r) for r in raw["requests"]}
            batches[raw["batch"]] = Batch(raw["batch"], raw["ids"], raw["wall"], raw["counters"], requests,
                                          [Step.read(s) for s in raw["steps"]])
    return Output(engine, batches)


def run(python: str, engine: Engine, requests: Sequence[Request], batches: Sequence[Sequence[str]], out: Path,
        sampling: dict | None = None, progress: Callable[[int], None] = lambda _: None) -> Output:
    """Run ``batches`` (lists of request ids) on ``engine`` with vLLM's ``python``; results go to
    ``out`` (JSON lines) and its log to ``out`` with ``.log``. Batches already in ``out`` are not
    run again, so calling it again after an interruption resumes."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    known = {r.id for r in requests}
    missing = sorted({rid for batch in batches for rid in batch} - known)
    if missing:
        raise ValueError(f"batches name requests that are not given: {missing}")
    job = {"engine": _home(engine.engine_args()), "env": {"VLLM_CPU_KVCACHE_SPACE": str(engine.kv_cache_gib),
                                                          **engine.env},
           "sampling": dict(sampling or {}), "requests": [asdict(r) for r in requests],
           "batches": [list(b) for b in batches], "out": out.name}
    if engine.pythonpath:  # only then: a job file of any other run stays as it was written
        job["pythonpath"] = [_home(p) for p in engine.pythonpath]
    job_file = out.with_suffix(".job.json")
    have = len(read(out).batches)
    if have and job_file.exists() and _home({**json.loads(job_file.read_text()), "out": job["out"]}) != job:
        raise SimlabError(f"{out} holds vLLM results of another job (other models, prompts or settings); remove it "
                          "or write elsewhere")
    job_file.write_text(json.dumps(job) + "\n")
    log = out.with_suffix(".log")
    if have < len(batches):
        _follow(python, job_file, out, log, len(batches), progress)
    result = read(out)
    if len(result.batches) < len(batches):
        raise SimlabError(f"vLLM stopped after {len(result.batches)} of {len(batches)} batches; see {log} "
                          "(run the same command again to resume)")
    return result


def _home(value):
    """``value`` with every path under the home directory written ``~/...`` (the runner expands them),
    so a job file committed with its results names no user's machine."""
    home = str(Path.home())
    if isinstance(value, dict):
        return {k: _home(v) for k, v in value.items()}
    if isinstance(value, str) and (value == home or value.startswith(home + os.sep)):
        return "~" + value[len(home):]
    return value


def _follow(python: str, job_file: Path, out: Path, log: Path, total: int, progress: Callable[[int], None]) -> None:
    """Run the runner in a session of its own (vLLM's engine core and worker are its children)
    and report finished batches until it exits; Ctrl-C stops the whole session."""
    with open(log, "a") as sink:
        proc = subprocess.Popen([python, str(RUNNER), str(job_file)], stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                time.sleep(1.0)
                progress(len(read(out).batches))
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
    progress(len(read(out).batches))
    if proc.returncode:
        errors = [json.loads(line) for line in out.read_text().splitlines() if '"type": "error"' in line] \
            if out.exists() else []
        if errors:  # vLLM's own message, often several lines (a pydantic error): one line, shortened
            message = " ".join(line.strip() for line in errors[-1]["message"].splitlines() if line.strip())
            if len(message) > 400:
                message = message[:400] + "..."
            raise SimlabError(f"vLLM could not start: {message} (log: {log})")
        tail = (log.read_text().strip().splitlines() or ["(no output)"])[-1]
        raise SimlabError(f"vLLM's runner failed (exit {proc.returncode}): {tail[:300]} (log: {log})")


__all__ = ["Engine", "Request", "RequestResult", "Step", "Batch", "Output", "read", "run", "RUNNER"]

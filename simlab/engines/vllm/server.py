"""``vllm serve`` on the loopback interface, loaded with requests on a schedule.

:func:`running` starts vLLM's OpenAI-compatible server (``vllm.entrypoints.openai.api_server``,
vLLM's own Python: :mod:`simlab.engines.vllm.install`) on 127.0.0.1 with the engine of a
:class:`~simlab.engines.vllm.jobs.Engine` (model, dtype, length, speculation, prefix caching off)
and the scheduler's two limits users set, ``--max-num-seqs`` and ``--max-num-batched-tokens``;
it waits for ``/health`` and stops the server's whole process group on exit. A server that exits
while starting, or a port already taken, is one line.

:func:`send` is the load generator: one thread per request, each posting ``/v1/completions``
with the prompt as token ids (a trace's own ids, so no tokenizer stands between the trace and the
server), greedy, ``max_tokens``, ``stream: true`` and ``return_token_ids: true``; request i is
posted ``at[i]`` seconds after the start (a Poisson schedule's times, or all 0: a burst). Each
answer keeps the client's times of its post, of its first streamed token (TTFT) and of its last
(end to end), and the token ids. vLLM streams a request's tokens as its engine steps emit them
(a speculative step's accepted drafts and bonus token together), so the chunk times are steps of
that request, unless the client fell behind and vLLM merged two steps' outputs into one chunk.

Every step is logged (``--enable-logging-iteration-details``) and :func:`iterations` reads that
step log back: what each step scheduled and how long it took in the engine core.

The counters are the server's ``/metrics`` (Prometheus text): :func:`metrics` reads every
``vllm:*_total`` counter, summed over its labels, and the per-position accepted counter as a
list; :func:`counters` turns two readings into the run's spec-decode counters under the names
``simlab vllm run`` uses.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from simlab.common.errors import SimlabError
from simlab.engines.local_server import free_port, wait_healthy
from simlab.engines.vllm.jobs import Engine

STARTUP_S = 900.0  # loading the models on a slow shared CPU (the Qwen pair: minutes)
REQUEST_S = 1800.0  # one request's longest wait for its last token
MODEL_NAME = "simlab"  # --served-model-name: what requests name, so no machine path is sent or logged
SPEC = "vllm:spec_decode_"


@dataclass(frozen=True)
class Limits:
    """vLLM's scheduler limits (``SchedulerConfig``): requests decoding at once, and tokens one
    step computes (prompt chunks, decodes and draft tokens together)."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise SimlabError(f"--max-num-seqs and --max-num-batched-tokens must be >= 1, got {self}")


@dataclass(frozen=True)
class Server:
    url: str
    pid: int  # the server's process group: its CPU time is the run's, not the machine's other load
    log: Path


def check_port(port: int) -> None:
    """A port the server cannot bind is one line before a model loads. Bound as the server binds
    it (uvicorn sets SO_REUSEADDR): a port whose last server is gone but whose connections linger
    in TIME_WAIT, as after the previous kind's server of the same run, is free."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise SimlabError(f"port {port} on 127.0.0.1 is in use ({exc.strerror}): pass another --port, or none "
                              "to take a free one") from None


def command(python: str, engine: Engine, limits: Limits, port: int) -> list[str]:
    """The server's command line: ``engine``'s arguments as ``vllm serve`` flags."""
    args = engine.engine_args()
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", os.path.expanduser(args["model"]),
           "--served-model-name", MODEL_NAME, "--dtype", args["dtype"], "--max-model-len", str(args["max_model_len"]),
           "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(limits.max_num_seqs),
           "--max-num-batched-tokens", str(limits.max_num_batched_tokens), "--enforce-eager", "--seed", "0",
           "--enable-prefix-caching" if args["enable_prefix_caching"] else "--no-enable-prefix-caching",
           "--disable-uvicorn-access-log", "--enable-logging-iteration-details"]
    if engine.worker_extension:
        cmd += ["--worker-extension-cls", engine.worker_extension]
    spec = args.get("speculative_config")
    if spec:
        spec = {**spec, "model": os.path.expanduser(spec["model"])} if isinstance(spec.get("model"), str) else spec
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


@contextmanager
def running(python: str, engine: Engine, limits: Limits, log: Path, port: int | None = None) -> Iterator[Server]:
    """A ``vllm serve`` of ``engine`` under ``limits`` on ``port`` (default: a free one), its output
    in ``log``; stopped (its whole session: the API server, the engine core, the worker) on exit."""
    if port is None:
        port = free_port()
    else:
        check_port(port)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(engine.kv_cache_gib), **engine.env}
    if engine.pythonpath:  # the server's processes (API server, engine core, worker) import from these too
        env["PYTHONPATH"] = os.pathsep.join([*engine.pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as sink:
        proc = subprocess.Popen(command(python, engine, limits, port), stdout=sink, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        try:
            wait_healthy(url, proc, "vllm serve", STARTUP_S, lambda: _tail(log), f" (log: {log})", poll_s=0.5)
            yield Server(url, proc.pid, log)
        finally:
            stop(proc)


def stop(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Stop the server's whole session and wait until none of it is left: the engine core and the
    worker outlive the API server by a moment, holding their memory (the next server of a run needs
    it: the Qwen pair's two servers do not fit side by side) and their sockets, so the session is
    gone only when its last process is."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for signum in (None, signal.SIGKILL):  # a bounded wait, then the rest killed and a last bounded wait
        deadline = time.monotonic() + (timeout_s if signum is None else 5.0)
        if signum is not None and _session_alive(proc.pid):
            os.killpg(proc.pid, signum)
        while _session_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)


def _session_alive(pgid: int) -> bool:
    """Whether a process of session ``pgid`` still runs (zombies aside: an orphan's is reaped by init)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # after the name: state, ppid, pgrp
            return True
    return False


# vLLM's step log (``--enable-logging-iteration-details``: ``vllm/v1/metrics/loggers.py``,
# ``_log_iteration_details``), one line a step: requests and tokens by phase, the step's time in the
# engine core, the KV cache's use
ITERATION = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation "
                       r"requests, (\d+) generation tokens, iteration elapsed time: ([\d.]+) ms.*?KV cache usage: "
                       r"([\d.]+)%")
ITERATION_KEYS = ("iteration", "context_requests", "context_tokens", "generation_requests", "generation_tokens",
                  "elapsed_ms", "kv_cache_usage_pct")


def iterations(log: Path) -> list[dict]:
    """vLLM's step log in a server's output (:data:`ITERATION`), one dict a step, in order."""
    if not log.exists():
        return []
    out = []
    for m in ITERATION.finditer(log.read_text(errors="replace")):
        values = m.groups()
        out.append({key: (float(v) if "." in v else int(v)) for key, v in zip(ITERATION_KEYS, values)})
    return out


def _tail(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return ((errors or lines or ["no output"])[-1])[:300]


def parse_metrics(text: str) -> dict:
    """Prometheus text to {counter name: value summed over its labels}; the per-position accepted
    counter as a list by position."""
    out: dict = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:") or " " not in line:
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        if not name.endswith("_total"):
            continue
        name = name[len("vllm:"):-len("_total")]
        if name == "spec_decode_num_accepted_tokens_per_pos":
            pos = labels.split('position="', 1)[1].split('"', 1)[0]
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + float(value)
        else:
            out[name] = out.get(name, 0.0) + float(value)
    if per_pos:
        out["spec_decode_num_accepted_tokens_per_pos"] = [per_pos[i] for i in range(max(per_pos) + 1)]
    return out


def metrics(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        return parse_metrics(r.read().decode())


def change(after, before):
    """What a counter (a number, or a list by position) rose by between two readings; a counter
    absent from the first reading (a server's spec-decode lines appear after its first step) is 0."""
    if isinstance(after, list):
        before = before or [0] * len(after)
        return [a - b for a, b in zip(after, before)]
    return (after or 0) - (before or 0)


def counters(before: dict, after: dict) -> dict:
    """The spec-decode counters of what ran between two readings, under ``vllm run``'s names."""
    keys = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
    out = {}
    for k in keys:
        delta = change(after.get("spec_decode_" + k), before.get("spec_decode_" + k))
        out[k] = [int(round(x)) for x in delta] if isinstance(delta, list) else int(round(delta))
    return out


@dataclass(frozen=True)
class Answer:
    """One request's answer; times are the client's ``time.perf_counter`` seconds from the start."""

    index: int
    sent: float
    first: float  # the first streamed token
    last: float  # the last streamed token
    token_ids: list[int]
    chunks: list[int]  # tokens per streamed chunk
    finish_reason: str

    def row(self) -> dict:
        return {"index": self.index, "sent": self.sent, "first": self.first, "last": self.last,
                "token_ids": self.token_ids, "chunks": self.chunks, "finish_reason": self.finish_reason}


def _stream(url: str, prompt: list[int], max_tokens: int,
            ignore_eos: bool = False) -> tuple[float | None, float, list[int], list[int], str]:
    payload = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
               "stream": True, "return_token_ids": True}
    if ignore_eos:  # vLLM's extra sampling parameter: exactly max_tokens tokens
        payload["ignore_eos"] = True
    body = json.dumps(payload).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    first, last, tokens, chunks, finish = None, 0.0, [], [], ""
    with urllib.request.urlopen(request, timeout=REQUEST_S) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"][0]
            ids = choice.get("token_ids") or []
            if ids:
                now = time.perf_counter()
                first = now if first is None else first
                last = now
                tokens += ids
                chunks.append(len(ids))
            finish = choice.get("finish_reason") or finish
    return first, last, tokens, chunks, finish


def send(url: str, prompts: Sequence[list[int]], max_tokens: int, at: Sequence[float] | None = None,
         ignore_eos: bool = False) -> list[Answer]:
    """Post request i (``prompts[i]``) ``at[i]`` seconds after the start (default: all at once);
    return the answers in request order (``ignore_eos``: each runs to ``max_tokens``). A refused
    request is one line naming the server's answer."""
    at = [0.0] * len(prompts) if at is None else list(at)
    if len(at) != len(prompts):
        raise SimlabError(f"{len(at)} arrival times for {len(prompts)} requests")
    start = [0.0]
    ready = threading.Barrier(len(prompts) + 1, action=lambda: start.__setitem__(0, time.perf_counter()))

    def one(i: int) -> Answer:
        ready.wait()
        time.sleep(max(start[0] + at[i] - time.perf_counter(), 0.0))
        sent = time.perf_counter()
        try:
            first, last, tokens, chunks, finish = _stream(url, prompts[i], max_tokens, ignore_eos)
        except urllib.error.HTTPError as exc:
            raise SimlabError(f"vllm serve refused request {i}: HTTP {exc.code} {exc.read()[:200]!r}") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            raise SimlabError(f"vllm serve stopped answering during request {i} ({exc})") from None
        if first is None:
            raise SimlabError(f"vllm serve streamed no token ids for request {i} (its API changed?)")
        t0 = start[0]
        return Answer(i, sent - t0, first - t0, last - t0, tokens, chunks, finish)

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(one, i) for i in range(len(prompts))]
        ready.wait()
        return [f.result() for f in futures]




def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (the server's API process, engine core and worker, which
    :func:`running` starts in a session of their own): their CPU time is the run's, not others'."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:  # field 6 of /proc/PID/stat: the session id
            pids.append(int(entry.name))
    return pids


__all__ = ["Limits", "Server", "Answer", "running", "send", "metrics", "parse_metrics", "counters", "check_port",
           "command", "session_pids", "change", "iterations", "MODEL_NAME"]

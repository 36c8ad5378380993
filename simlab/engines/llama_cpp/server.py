"""Run llama.cpp's ``llama-server`` with B parallel slots and load it with requests on loopback.

``llama-server`` (``tools/server`` of the vendored tree, built by
:func:`simlab.engines.llama_cpp.build.build_server`) serves several requests at once: with ``-np B`` it has B slots, and one server step decodes every generating
slot together. With a draft model (``-md``) a step is, in ``update_slots`` of
``server-context.cpp`` and ``draft()`` of ``common/speculative.cpp``'s simple draft:

1. batched drafting: one draft forward over every drafting slot's last token, then one per
   drafted token over the slots still drafting (each slot stops at ``--spec-draft-n-max``, at a
   top-1 probability below ``--spec-draft-p-min``, or at its budget ``n_remaining - 1``);
2. one target forward over every slot's ``[last token, drafts...]``, all positions' logits;
3. the draft's forward of that same batch (``common_speculative_process``), which keeps its
   cache in step, then each slot keeps its accepted prefix.

That is :mod:`simlab.serve.engine`'s step, so ``simlab serve`` on a llama.cpp trace predicts it
(:mod:`simlab.live.llama_server`). New prompts are prefilled in a step of their own when every
request arrives before the server starts decoding, as :func:`send` arranges for a burst; a
request that arrives while others decode has its prompt put in their step's batch, after their
tokens and drafts, and prefilled by the same target forward (``update_slots``: ``llama_decode``
runs once over the whole batch, chunked by ``n_batch``), which ``simlab serve``'s mixed scheduler
prices (:mod:`simlab.serve.scheduler`).

The load generator sends bursts or an arrival schedule: a thread per request, each posting
``/completion`` (greedy, ``cache_prompt: false``, ``return_tokens: true``) at once or at its
arrival time; each answer carries the token ids
generated and the slot's own counters and timings (``timings``: ``predicted_n``,
``predicted_ms`` from the first token to the last, ``draft_n`` verified drafts,
``draft_n_accepted``).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
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
from simlab.common.locations import portable_path
from simlab.engines.llama_cpp.args import ModelPair, drafting_args, environment
from simlab.engines.llama_cpp.build import SERVER
from simlab.engines.local_server import free_port, wait_healthy

STARTUP_S = 300.0  # loading both models and the server's warm-up decode, on a slow shared CPU
REQUEST_S = 1800.0  # one request's longest wait for its answer
GATE_LEAD_S = 0.05  # a gate request's lead: enough to be queued, well under its prefill on a CPU


@dataclass(frozen=True)
class Drafting:
    """The drafting rules, under the llama-cpp policy's names."""

    draft_max: int
    draft_min: int = 0
    p_min: float = 0.0


@dataclass(frozen=True)
class Answer:
    """One request's answer: client times (``time.perf_counter``) and the slot's counters."""

    index: int
    sent: float
    received: float
    predicted_n: int  # tokens generated, the one from the prefill included
    predicted_ms: float  # the slot's time from its first token to its last
    prompt_n: int
    prompt_ms: float
    draft_n: int  # drafts the target verified
    draft_n_accepted: int
    stop_type: str
    tokens: tuple[int, ...]  # the token ids generated

    @property
    def first_token(self) -> float:
        """When the slot had its first token, on the client's clock (the answer's arrival less
        the slot's generation time: the answer's transfer, well under a millisecond on
        loopback, is the difference)."""
        return self.received - self.predicted_ms / 1e3


@dataclass(frozen=True)
class Server:
    url: str
    pid: int  # the server's process (its CPU time is ours, not the machine's other load)


@contextmanager
def running(binary: Path, pair: ModelPair, slots: int, ctx_per_slot: int,
            drafting: Drafting | None, log_file: Path | None = None) -> Iterator[Server]:
    """A ``llama-server`` with ``slots`` slots of ``ctx_per_slot`` tokens each, greedy, on a free
    loopback port; yields its URL and process id and stops it on exit. ``drafting`` None: the
    target alone, no draft model (plain decoding). Its log (timestamped: a slot logs
    every verification, "accepted n/m draft tokens") goes to ``log_file``, or to a temporary
    file kept for errors.

    ``--cache-ram 0``: no prompt cache in host memory, so a new request never saves or restores a
    slot's state (work the trace does not price); each request also asks ``cache_prompt: false``."""
    port = free_port()
    models = pair.target_only() if drafting is None else [
        *pair.models(), *drafting_args(drafting.draft_max, drafting.draft_min, drafting.p_min)]
    cmd = [str(binary), *models, "-np", str(slots), "-c", str(slots * ctx_per_slot), "--cache-ram", "0",
           "--host", "127.0.0.1", "--port", str(port), "--no-webui", "--temp", "0", "--seed", "0", "--log-timestamps"]
    url = f"http://127.0.0.1:{port}"
    with open(log_file, "w+") if log_file is not None else tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment())
        try:
            wait_healthy(url, proc, SERVER, STARTUP_S, lambda: _last_line(log))
            yield Server(url, proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if log_file is not None:  # a kept log names no user's machine (it prints the models' paths)
        text = log_file.read_text()
        for path in (pair.target, pair.draft, binary):
            text = text.replace(str(path), portable_path(path))
        log_file.write_text(text)


def _last_line(log) -> str:
    log.seek(0)
    return (log.read().strip().splitlines()[-1:] or ["no output"])[0]


def send(url: str, prompts: Sequence[str], n_predict: int, gate: str | None = None,
         at: Sequence[float] | None = None) -> list[Answer]:
    """Post every request (``prompts[i]``, ``n_predict`` tokens), one thread each; return the
    answers in request order.

    ``at``: request i is posted ``at[i]`` seconds after the start (an arrival schedule, e.g. a
    Poisson process's); by default all at once, a burst.

    ``gate``: a prompt posted for one token :data:`GATE_LEAD_S` before the start. The server's
    loop starts a step as soon as a request is queued, so requests sent together can straddle
    two steps; while the gate's prefill runs, the others queue, and the step after it admits
    them all at once (the gate's slot is free again by then: one token ends it)."""
    if at is not None and len(at) != len(prompts):
        raise SimlabError(f"{len(at)} arrival times for {len(prompts)} requests")
    start = [0.0]
    ready = threading.Barrier(len(prompts) + 1, action=lambda: start.__setitem__(0, time.perf_counter()))

    def one(i: int, prompt: str, tokens: int, wait: bool = True) -> Answer:
        body = json.dumps({"prompt": prompt, "n_predict": tokens, "temperature": 0.0, "seed": 0,
                           "cache_prompt": False, "return_tokens": True}).encode()
        request = urllib.request.Request(f"{url}/completion", data=body, headers={"Content-Type": "application/json"})
        if wait:
            ready.wait()
            if at is not None:
                time.sleep(max(start[0] + at[i] - time.perf_counter(), 0.0))
        sent = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_S) as r:
                data = json.load(r)
        except urllib.error.HTTPError as exc:
            raise SimlabError(f"{SERVER} refused request {i}: HTTP {exc.code} {exc.read()[:200]!r}") from exc
        return _answer(i, sent, time.perf_counter(), data)

    with ThreadPoolExecutor(max_workers=len(prompts) + 1) as pool:
        futures = [pool.submit(one, i, p, n_predict) for i, p in enumerate(prompts)]
        if gate is not None:
            opened = pool.submit(one, -1, gate, 1, False)
            time.sleep(GATE_LEAD_S)
        ready.wait()
        if gate is not None:
            opened.result()
        return [f.result() for f in futures]


def _answer(index: int, sent: float, received: float, data: dict) -> Answer:
    t = data.get("timings")
    if not isinstance(t, dict) or "predicted_n" not in t:
        raise SimlabError(f"{SERVER}'s answer to request {index} has no timings (its API changed?)")
    return Answer(index, sent, received, int(t["predicted_n"]), float(t["predicted_ms"]), int(t["prompt_n"]),
                  float(t["prompt_ms"]), int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)),
                  str(data.get("stop_type", "")), tuple(int(token) for token in data.get("tokens", ())))

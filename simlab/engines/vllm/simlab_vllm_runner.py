"""simlab's runner inside vLLM's own Python: a job file in, one JSON line per measured batch out.

Run as ``VLLM_PYTHON simlab_vllm_runner.py JOB.json`` (:mod:`simlab.engines.vllm.jobs` writes the job and
reads the lines). It imports only the standard library and vLLM, because vLLM lives in an
environment of its own (docs/vllm.md, "Install"): simlab is not installed there, and simlab's own
environment never imports vLLM.

The job names one engine (``LLM(**engine)``, any ``speculative_config``: ``draft_model``, ``ngram``,
``suffix``, with the folders its proposer imports from in ``pythonpath``), the requests (prompt
token ids, sampling parameters) and the batches to run them in: each batch is one
``LLM.generate`` call, its requests submitted together. For every batch the output file gets one
line, appended and flushed when the batch ends, holding per request the tokens, vLLM's
``per_step_drafted``/``per_step_accepted`` (``per_request_spec_decode_metrics="detailed"``) and the
engine core's timestamps, the batch's change of vLLM's spec-decode counters (``LLM.get_metrics``),
and every engine step the worker ran: its schedule (per request: tokens scheduled, draft tokens
among them, tokens already computed) and the seconds of each forward in it. A job run again skips
the batches its output already holds, so an interrupted run resumes where it stopped.

The forwards are timed inside the worker process by :class:`StepTimer`, mixed into vLLM's worker
with ``LLM(worker_extension_cls=...)`` (``vllm/v1/worker/worker_base.py``) and installed through
``LLM.collective_rpc``: it wraps the model runner's ``execute_model`` (the target's forward of
every scheduled token) and ``sample_tokens`` (rejection sampling, then the drafter's proposal for
the next step), the target's and the draft's ``forward`` and ``compute_logits``, and the drafter's
``propose``, with ``time.perf_counter``. On a CPU every one of them runs synchronously, so each
interval is that operation's own time.
"""

import json
import os
import sys
import time
import traceback

EXTENSION = "simlab_vllm_runner.StepTimer"  # imported by this name in vLLM's worker (its folder on PYTHONPATH)


class StepTimer:
    """Methods added to vLLM's worker: time the model runner's forwards, hand the steps back."""

    def simlab_install_timer(self):
        runner = self.model_runner
        steps = []
        self._simlab_steps = steps
        clock = time.perf_counter

        def wrap(obj, name, record):
            inner = getattr(obj, name)

            def timed(*args, **kwargs):
                t0 = clock()
                out = inner(*args, **kwargs)
                record(args, kwargs, t0, clock())
                return out

            setattr(obj, name, timed)

        def scheduled(args, kwargs, t0, t1):
            so = args[0] if args else kwargs["scheduler_output"]
            spec = so.scheduled_spec_decode_tokens
            computed = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
            cached = so.scheduled_cached_reqs
            computed.update(zip(cached.req_ids, cached.num_computed_tokens))
            steps[-1].update(t0=t0, execute=t1 - t0, reqs={
                rid: [int(n), len(spec.get(rid, ())), int(computed.get(rid, -1))]
                for rid, n in so.num_scheduled_tokens.items()})

        def forward(role):
            def record(args, kwargs, t0, t1):
                ids = kwargs.get("input_ids", args[0] if args else None)
                if ids is None:
                    ids = kwargs.get("inputs_embeds")
                if steps:  # not a forward of vLLM's own warm-up
                    steps[-1][role].append([int(ids.shape[0]) if ids is not None else -1, t1 - t0])
            return record

        def logits(role):
            def record(args, kwargs, t0, t1):
                rows = args[0] if args else kwargs.get("hidden_states")
                if steps:
                    steps[-1][role].append([int(rows.shape[0]), t1 - t0])
            return record

        def sample(args, kwargs, t0, t1):
            steps[-1].update(sample=t1 - t0, t1=t1)

        def propose(args, kwargs, t0, t1):
            steps[-1]["propose"] = t1 - t0

        inner_execute = runner.execute_model

        def execute_model(*args, **kwargs):  # a step starts: its forwards are recorded into a new entry
            steps.append({"target": [], "target_logits": [], "draft": [], "draft_logits": []})
            t0 = clock()
            out = inner_execute(*args, **kwargs)
            scheduled(args, kwargs, t0, clock())
            return out

        runner.execute_model = execute_model
        wrap(runner, "sample_tokens", sample)
        wrap(runner.model, "forward", forward("target"))
        wrap(runner.model, "compute_logits", logits("target_logits"))
        drafter = getattr(runner, "drafter", None)
        if drafter is not None:
            wrap(drafter, "propose", propose)
            if hasattr(drafter, "model"):
                wrap(drafter.model, "forward", forward("draft"))
                wrap(drafter.model, "compute_logits", logits("draft_logits"))
        return os.environ.get("OMP_NUM_THREADS")

    def simlab_take_steps(self):
        steps = [s for s in self._simlab_steps if "t0" in s]
        del self._simlab_steps[:]
        return steps


def _counters(llm):
    """vLLM's spec-decode counters now (cumulative since the engine started)."""
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            key = metric.name.split(":", 1)[1]
            out[key] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def _delta(after, before):
    out = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, list):
            old = old or [0] * len(value)
            out[key] = [a - b for a, b in zip(value, old)]
        else:
            out[key] = value - (old or 0)
    return out


def _done_batches(path):
    """Batches already in the output file (a line cut short by an interruption is ignored)."""
    done = set()
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("type") == "batch":
                    done.add(record["batch"])
    return done


def _append(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _request(rid, output):
    c = output.outputs[0]
    sdm = c.spec_decode_metrics
    m = output.metrics
    times = {k: getattr(m, k, None) for k in ("arrival_time", "queued_ts", "scheduled_ts", "first_token_ts",
                                              "last_token_ts")} if m is not None else {}
    return {"id": rid, "engine_id": output.request_id, "token_ids": list(c.token_ids),
            "finish_reason": c.finish_reason, "times": times,
            "per_step_drafted": list(sdm.per_step_drafted) if sdm is not None else [],
            "per_step_accepted": list(sdm.per_step_accepted) if sdm is not None else []}


def run(job, job_dir):
    out = os.path.join(job_dir, job["out"])  # beside the job file
    os.environ.update({k: str(v) for k, v in job.get("env", {}).items()})
    here = os.path.dirname(os.path.abspath(__file__))
    extra = [os.path.expanduser(p) for p in job.get("pythonpath", [])]  # e.g. Arctic Inference's suffix tree
    sys.path[:0] = extra  # this process validates the engine's config; the engine core and worker inherit the env
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *extra, os.environ.get("PYTHONPATH", "")])
    done = _done_batches(out)
    if len(done) == len(job["batches"]):
        return 0
    t0 = time.perf_counter()
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        engine = dict(job["engine"])
        engine["model"] = os.path.expanduser(engine["model"])  # paths under the home directory come as ~/...
        spec = engine.get("speculative_config")
        if spec and isinstance(spec.get("model"), str):
            engine["speculative_config"] = {**spec, "model": os.path.expanduser(spec["model"])}
        if engine.get("speculative_config"):
            engine.setdefault("per_request_spec_decode_metrics", "detailed")
        else:
            engine.pop("speculative_config", None)
        llm = LLM(enforce_eager=True, disable_log_stats=False, worker_extension_cls=EXTENSION, **engine)
        threads = llm.collective_rpc("simlab_install_timer")[0]
    except Exception as exc:  # the one line simlab shows; the traceback stays in the log
        traceback.print_exc()
        _append(out, {"type": "error", "stage": "load", "message": f"{type(exc).__name__}: {exc}"})
        return 3
    _append(out, {"type": "engine", "load_seconds": time.perf_counter() - t0, "vllm": vllm.__version__,
                  "omp_threads": threads, "pid": os.getpid()})
    requests = {r["id"]: r for r in job["requests"]}
    for b, ids in enumerate(job["batches"]):
        if b in done:
            continue
        params = [SamplingParams(**{**job.get("sampling", {}), **requests[rid].get("sampling", {})}) for rid in ids]
        prompts = [TokensPrompt(prompt_token_ids=requests[rid]["prompt_token_ids"]) for rid in ids]
        before = _counters(llm)
        llm.collective_rpc("simlab_take_steps")
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        steps = llm.collective_rpc("simlab_take_steps")[0]
        _append(out, {"type": "batch", "batch": b, "ids": ids, "wall": wall,
                      "counters": _delta(_counters(llm), before),
                      "requests": [_request(rid, o) for rid, o in zip(ids, outputs)], "steps": steps})
        print(f"simlab-runner: batch {b + 1}/{len(job['batches'])} done in {wall:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.exit(run(json.load(f), os.path.dirname(os.path.abspath(sys.argv[1]))))

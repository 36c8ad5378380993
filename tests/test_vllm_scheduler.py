"""vLLM's scheduler as ``simlab serve --scheduler vllm`` models it (simlab/serve/vllm_scheduler.py),
checked at its boundaries by hand, and the engine's steps on the SmolLM2 trace recorded from vLLM.

The scheduler's cases use a stand-in for a served request (what ``schedule`` reads of one: its
prompt's length, tokens committed, whether it started); the engine's use the committed trace.
"""

from collections import deque
from dataclasses import dataclass

import pytest

from simlab.common.errors import SimlabError
from simlab.common.locations import ROOT
from simlab.latency.batch import BatchLatency
from simlab.latency.vllm_step import VllmStepPrice
from simlab.serve.batch_policy import BatchSpec
from simlab.serve.run import ServeConfig, serve_once
from simlab.serve.vllm_scheduler import KvBlocks, Seq, VllmScheduler, schedule
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace

K = 4
TRACE = ROOT / "results" / "vllm" / "traces" / "smollm2-humaneval-vllm"


@dataclass(eq=False)
class Req:
    prompt_len: int
    committed: int = 1
    started: bool = False


def decoding(prompt_len: int, committed: int) -> Seq:
    """A request that decodes: its last sampled token not yet computed, K drafts proposed."""
    r = Req(prompt_len, committed, True)
    return Seq(r, computed=prompt_len + committed - 1, drafts=K)


def waiting(prompt_len: int) -> Seq:
    return Seq(Req(prompt_len))


def plan_of(limits, running, queue, kv=None, k=K):
    queue = deque(queue)
    plan = schedule(limits, k, running, queue, kv or KvBlocks(None))
    return [(s.request, n) for s, n in plan.scheduled], plan, queue


def test_a_prompt_chunk_takes_what_the_decodes_and_their_draft_slots_leave_of_the_budget():
    a, b, c = decoding(50, 10), decoding(60, 20), waiting(200)
    running = [a, b]
    got, plan, queue = plan_of(VllmScheduler(8, 100), running, [c])
    # each decode: its last token and K = 4 drafts (5), and one draft slot from max_num_batched_tokens:
    # 100 - 2 x 6 = 88 left, of which the chunk gets 88 - 1 = 87 of its 200 prompt tokens
    assert got == [(a.request, 5), (b.request, 5), (c.request, 87)]
    assert plan.tokens == 97 and running == [a, b, c] and not queue
    # the next step: the chunk is a running request now, after the decodes, and wants its rest
    c.computed += 87
    got, _, _ = plan_of(VllmScheduler(8, 100), running, [])
    assert got == [(a.request, 5), (b.request, 5), (c.request, 87)]
    got, _, _ = plan_of(VllmScheduler(8, 200), running, [])
    assert got == [(a.request, 5), (b.request, 5), (c.request, 113)]


def test_max_num_seqs_keeps_a_request_waiting_however_much_budget_is_left():
    running = [decoding(50, 3), decoding(50, 3)]
    got, _, queue = plan_of(VllmScheduler(2, 2048), running, [waiting(10)])
    assert len(got) == 2 and len(queue) == 1 and len(running) == 2
    got, _, queue = plan_of(VllmScheduler(3, 2048), running, queue)
    assert len(got) == 3 and not queue


def test_a_request_waits_once_the_budget_is_spent_on_the_decodes_and_drafts_are_cut_to_fit():
    a, b = decoding(50, 3), decoding(50, 3)
    # 12: a takes 5 (+1 slot), b min(5, 7, 6 - 1) = 5 (+1): the input budget is 0, the waiting
    # request is not looked at though 2 of the token budget remain
    got, _, queue = plan_of(VllmScheduler(8, 12), [a, b], [waiting(3)])
    assert got == [(a.request, 5), (b.request, 5)] and len(queue) == 1
    # 13 leaves 1, no more than the draft slot: still nobody; 14 leaves 2: the prompt gets 1 token of its 3
    got, _, queue = plan_of(VllmScheduler(8, 13), [a, b], [waiting(3)])
    assert len(got) == 2 and len(queue) == 1
    got, _, queue = plan_of(VllmScheduler(8, 14), [a, b], [waiting(3)])
    assert [n for _, n in got] == [5, 5, 1] and not queue
    # 10: b gets min(5, 5, 4 - 1) = 3 tokens: its last and its first 2 drafts
    got, _, _ = plan_of(VllmScheduler(8, 10), [a, b], [])
    assert got == [(a.request, 5), (b.request, 3)]


def test_without_speculation_there_are_no_draft_slots():
    a = decoding(50, 3)
    a.drafts = 0
    got, _, queue = plan_of(VllmScheduler(8, 12), [a], [waiting(11), waiting(5)], k=0)
    assert [n for _, n in got] == [1, 11] and len(queue) == 1


def test_a_decode_whose_blocks_run_out_preempts_the_last_running_request_and_admits_nobody():
    limits = VllmScheduler(8, 2048, kv_blocks=4, block_size=16)
    kv = KvBlocks(4)
    a, b = decoding(20, 8), decoding(20, 8)  # computed 27 each: 27 + 5 + 4 lookahead = 36 slots, 3 blocks
    a.blocks = b.blocks = 2
    kv.free = 0
    running = [a, b]
    got, plan, queue = plan_of(limits, running, [waiting(5)], kv)
    assert got == [(a.request, 5)] and plan.preempted == [b]
    assert running == [a] and list(queue)[0] is b and len(queue) == 2  # b first, ahead of the new one
    assert (b.computed, b.blocks, b.drafts, b.preemptions) == (0, 0, 0, 1)
    assert a.blocks == 3 and kv.free == 1
    # b recomputes its prompt and its output (20 + 8 tokens), no drafts: 28 + 4 lookahead = 2 blocks
    # it cannot have while a holds 3; the next step, once a decodes on, b waits
    got, plan, queue = plan_of(limits, running, queue, kv)
    assert got == [(a.request, 5)] and not plan.preempted and len(queue) == 2


def test_a_request_alone_whose_blocks_run_out_preempts_itself_and_nothing_runs():
    kv = KvBlocks(2)
    a = decoding(20, 8)
    a.blocks, kv.free = 2, 0
    running = [a]
    got, plan, queue = plan_of(VllmScheduler(8, 2048, kv_blocks=2, block_size=16), running, [], kv)
    assert got == [] and plan.preempted == [a] and running == [] and list(queue) == [a] and kv.free == 2


def test_what_vllm_refuses_is_refused_in_its_words():
    with pytest.raises(SimlabError, match="does not have enough slots"):
        VllmScheduler(4, 1).check(10, k=4)
    with pytest.raises(SimlabError, match="--kv-blocks 1 is too few"):
        VllmScheduler(4, 2048, kv_blocks=1).check(179, k=4)


@pytest.fixture(scope="module")
def sim():
    return Simulator(read_trace(TRACE))


def test_a_step_is_priced_by_its_tokens_and_one_request_alone_is_the_simulators_round(sim):
    grid = sim.latency
    price = VllmStepPrice(BatchLatency(grid), K)
    # one decode: the target's K + 1 tokens and K draft steps, the single-request simulator's round
    assert price.step(5, 1, 192, K) == pytest.approx(grid.target_forward(5, 192) + K * grid.draft_step(192))
    # one prompt alone (179 tokens, the timed prefill): its prefill, the draft's pass, K - 1 draft steps
    model = grid.model
    alone = model.prefill(179, 0) + model.prefill(179, 0, draft=True)
    assert price.step(179, 1, 0, K) == pytest.approx(alone + 3 * grid.draft_step(0))
    # past the prefill, the slope from 4 decodes (20 tokens, at that context) to the prefill
    four = BatchLatency(grid).grids[4]
    g20 = four.target_forward(5, 0) + four.draft_step(0)
    assert price.forward(480, 0) == pytest.approx(alone + (480 - 179) * (alone - g20) / (179 - 20))
    assert price.bits(480) and not price.bits(179)


def _served(sim, arrivals, limits, policy="vllm", params=None):
    params = {"num_speculative_tokens": K, "max_tokens": 128} if params is None else params
    return serve_once(sim, arrivals, ServeConfig(policy, params, limits), policy, params, record=True)


def test_a_burst_prefills_the_first_prompt_alone_then_the_others_beside_its_first_verification(sim):
    run = _served(sim, [0.0, 1e-6, 1e-6, 1e-6], VllmScheduler(4, 2048))
    steps = run.slices
    lens = [p.prompt_len for p in sim.replay.prompts[:4]]
    assert [s.args["tokens"] for s in steps[:3]] == [lens[0], 5 + sum(lens[1:]), 20]
    ttft = run.frame.sort_values("request_id")["ttft_s"].tolist()
    assert ttft[0] == pytest.approx(steps[0].end) and ttft[1:] == pytest.approx([steps[1].end] * 3)


def test_every_request_finishes_once_with_the_counts_of_the_offline_prediction(sim):
    from simlab.live import vllm as offline
    from simlab.policies.vllm import Method

    run = _served(sim, [0.0, 0.5, 0.6, 3.0, 3.1, 3.2, 9.0, 9.5], VllmScheduler(3, 2048))
    counts = offline.predict(sim.trace, Method.of("draft_model", K), 128, [])["prompts"]
    for r in run.requests:
        steps = counts[str(r.replay.prompt_id)]["steps"]
        assert r.finished_steps == 1
        assert (r.counts.drafted, r.counts.accepted) == (sum(d for d, _ in steps), sum(a for _, a in steps))
    frame = run.frame.sort_values("request_id")
    assert frame["tokens"].tolist() == [sim.replay.prompts[i % 4].n_tokens for i in range(8)]


def test_a_tight_budget_chunks_prompts_and_every_scheduled_token_is_accounted_for(sim):
    run = _served(sim, [0.0, 0.5, 0.6, 3.0, 3.1, 3.2], VllmScheduler(3, 64))
    assert all(s.args["tokens"] <= 64 - s.args["batch"] and s.args["batch"] <= 3 for s in run.slices)
    # the steps' tokens: every prompt once (in chunks) and every verification's last token and drafts
    assert sum(s.args["tokens"] for s in run.slices) == sum(
        r.prompt_len + r.counts.target_calls + r.counts.verified for r in run.requests)
    assert all(r.finished_steps == 1 for r in run.requests)
    # prompts of 134-179 tokens go in chunks: steps that spend the whole budget
    assert sum(s.args["tokens"] == 64 - s.args["batch"] for s in run.slices) >= 6


def test_preempted_requests_recompute_and_still_finish_with_every_token(sim):
    # 4 blocks of 128: two requests of ~170-token prompts and 128 new tokens cannot both keep theirs
    run = _served(sim, [0.0, 1e-6, 1e-6], VllmScheduler(4, 2048, kv_blocks=4))
    frame = run.frame.sort_values("request_id")
    assert all(r.finished_steps == 1 for r in run.requests)
    assert frame["tokens"].tolist() == [sim.replay.prompts[i].n_tokens for i in range(3)]
    # a recompute is a prefill of the prompt and the output so far: a step far above the decodes' tokens
    assert any(s.args["tokens"] > 200 for s in run.slices[2:])


def _dynamic(sim, arrivals, table, limits=None):
    params = {"num_speculative_tokens": K, "max_tokens": 128}
    config = ServeConfig("vllm", params, limits or VllmScheduler(4, 2048), BatchSpec(gamma_by_batch=table))
    return serve_once(sim, arrivals, config, "vllm", params, record=True)


def test_a_table_of_one_k_is_the_fixed_k_server(sim):
    arrivals = [0.0, 0.5, 0.6, 3.0]
    fixed, table = _served(sim, arrivals, VllmScheduler(4, 2048)), _dynamic(sim, arrivals, f"1:{K},3:{K + 2}")
    assert [(s.start, s.end, s.args["tokens"]) for s in table.slices] == [
        (s.start, s.end, s.args["tokens"]) for s in fixed.slices]


def test_dynamic_speculation_drafts_the_k_of_the_step_before_and_a_k_of_0_still_pays_the_drafts_first_pass(sim):
    burst = [0.0, 1e-6, 1e-6, 1e-6]
    run = _dynamic(sim, burst, f"1:{K},2:0")
    lens = [p.prompt_len for p in sim.replay.prompts[:4]]
    steps = run.slices
    # step 0: the first prompt alone (a batch of 1: K drafts for it); step 1: its verification of
    # those K beside the three prompts (a batch of 4: K = 0 for the next step); step 2: four tokens
    assert [s.args["tokens"] for s in steps[:3]] == [lens[0], 1 + K + sum(lens[1:]), 4]
    price = VllmStepPrice(BatchLatency(sim.latency), K)
    ctx = round(sum(lens) / 4) + 1  # every request has its prompt and its first token computed
    assert steps[2].end - steps[2].start == pytest.approx(price.step(4, 4, ctx, 0), rel=1e-3)
    plain = VllmStepPrice(BatchLatency(sim.latency), 0)
    assert price.step(4, 4, ctx, 0) > plain.step(4, 4, ctx, 0)  # the draft's first pass, with no draft to show
    # the draft's forwards: K where one request ran alone (the first prefill, then the last to finish),
    # the first pass only in every other step
    assert run.stats.draft_forwards == sum(K if s.args["batch"] == 1 else 1 for s in steps)
    assert sum(r.counts.drafted for r in run.requests) > 0
    assert all(s.args["tokens"] in (1, 1 + K) for s in steps if s.args["batch"] == 1 and s is not steps[0])


def test_a_table_vllm_would_refuse_is_refused_in_its_words(sim):
    with pytest.raises(SimlabError, match="The first batch-size range must start at 1"):
        _dynamic(sim, [0.0], "2:4")


def test_only_vllms_speculation_is_served_by_its_scheduler(sim):
    with pytest.raises(SimlabError, match="--scheduler vllm serves"):
        _served(sim, [0.0], VllmScheduler(), policy="sd", params={"gamma": 4})


def test_simlab_serve_takes_vllms_scheduler_and_refuses_what_it_does_not_model_in_one_line():
    import json
    import subprocess

    from tests.helpers import simlab_cmd

    base = ["serve", "--trace", TRACE, "--policy", "vllm", "--requests", "4", "--rate", "2", "--max-batch", "4",
            "--scheduler", "vllm"]
    proc = subprocess.run(simlab_cmd(*base, "--json"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["scheduler"] == "vllm" and out["latency_rule"].startswith("vLLM steps priced by their scheduled tokens")
    assert out["requests"] == 4 and out["baseline"]["requests"] == 4
    proc = subprocess.run(simlab_cmd(*base, "--gamma-by-batch", "1:4,2:2", "--json"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["batch_policy"] == "table"
    for extra, words in ((["--mixed-prefill"], "does not take --mixed-prefill"),
                         (["--sd-off-above", "2"], "does not take --sd-off-above"),
                         (["--kv-blocks", "0"], "--kv-blocks must be >= 1"),
                         (["--policy", "sd"], "--scheduler vllm serves")):
        proc = subprocess.run(simlab_cmd(*base, *extra), capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_on_a_trace_of_simlabs_recorder_a_step_of_k_tokens_is_its_timed_forward_of_k():
    from simlab.cli.simulate import load_inputs

    trace, latency = load_inputs(None, None)  # the shipped trace: target forwards timed at k = 1..128, batch 1
    grid = Simulator(trace, latency).latency
    price = VllmStepPrice(BatchLatency(grid), K)
    assert price.forward(8, 200) == pytest.approx(grid.target_forward(8, 200) + grid.draft_step(200))
    assert price.forward(100, 200) > price.forward(24, 200) > price.forward(5, 200)
    plain = VllmStepPrice(BatchLatency(grid), 0)
    assert plain.forward(1, 200) == pytest.approx(grid.target_step(200))
    assert plain.forward(64, 200) == pytest.approx(grid.target_forward(64, 200))


def _two_k_price(ks_at_4):
    """A trace timed at batch 1 (K = 1 and K = 4: 2- and 5-token verifications) and at batch 4 with
    the verifications of ``ks_at_4`` (tokens a request -> seconds), a draft step of 0.05 s."""
    import pandas as pd

    from simlab.latency.grid import LatencyGrid
    from simlab.latency.model import TableLatency
    from simlab.trace.schema import NO_LAYER
    from tests.helpers import latency_table

    single = latency_table(draft=0.05, verify={2: 0.12, 5: 0.2}, ctx=(0, 1000)).assign(batch=1)
    rows = [("draft_step", 1, c, NO_LAYER, False, 0, 0.06, 4) for c in (0, 1000)]
    rows += [("target_forward", n, c, NO_LAYER, False, 0, s, 4) for n, s in ks_at_4.items() for c in (0, 1000)]
    samples = pd.concat([single, pd.DataFrame(rows, columns=single.columns)], ignore_index=True)
    return VllmStepPrice(BatchLatency(LatencyGrid(TableLatency.from_samples(samples), 2000)), K)


def test_a_batch_size_timed_at_several_k_prices_its_steps_from_its_own_verifications():
    price = _two_k_price({2: 0.30, 5: 0.45})
    # 4 requests verifying 1 draft each: their own timed step (forward and first pass), not the
    # 8-token point the other batch sizes' verifications would interpolate
    assert price.forward(8, 500, requests=4) == pytest.approx(0.30 + 0.06)
    assert price.forward(20, 500, requests=4) == pytest.approx(0.45 + 0.06)
    assert price.forward(8, 500, requests=4) != pytest.approx(price.forward(8, 500))
    # timed at one K only (every trace recorded with one --k), the token rule as before
    one = _two_k_price({5: 0.45})
    assert one.forward(8, 500, requests=4) == one.forward(8, 500)

"""The autoregressive baseline's own step: where an engine's one-token target forward is not its
plain decoding step (llama.cpp's verification also runs the draft over the same tokens), the
trace times the plain step on its own (``target_step``) and AD, the speedup's denominator and
the ``ad`` policy, are priced from it; everywhere else it is the one-token forward, as before."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from simlab.latency.batch import BatchLatency
from simlab.latency.fitted import fit_latency
from simlab.latency.grid import LatencyGrid
from simlab.latency.model import TableLatency
from simlab.serve.run import ServeConfig, serve
from simlab.serve.scheduler import Scheduler
from simlab.sim.run import Simulator
from simlab.trace.schema import NO_LAYER
from tests.helpers import hand_trace, latency_table, noisy_latency

# a verification of k tokens 1 + 0.5 (k - 1) s; the plain step 0.6 s (a llama.cpp one-token
# verification pays the draft's forward beside the target's, the plain step does not)
VERIFY = {1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}


def llama_trace(plain: float | None = 0.6, pattern: str = "1" * 10):
    trace = hand_trace([pattern], latency=latency_table(draft=0.25, verify=VERIFY, plain=plain))
    return replace(trace, manifest=replace(trace.manifest, extra={**trace.manifest.extra, "engine": "llama.cpp"}))


def test_the_table_prices_the_plain_step_from_its_samples_or_as_a_one_token_forward():
    timed = TableLatency.from_samples(latency_table(verify=VERIFY, plain=0.6, slope=1e-3))
    assert timed.target_step(200) == pytest.approx(0.6 + 0.2)
    assert timed.target_forward(1, 200) == pytest.approx(1.0 + 0.2)  # the verification is untouched
    untimed = TableLatency.from_samples(latency_table(verify=VERIFY, slope=1e-3))
    assert untimed.target_step(200) == untimed.target_forward(1, 200)


def test_a_profile_keeps_the_plain_step_and_a_batch_table_never_borrows_the_single_sequences():
    single = latency_table(verify=VERIFY, plain=0.6).assign(batch=1)
    two = latency_table(verify={k: 2 * s for k, s in VERIFY.items()}).assign(batch=2)  # no plain step at B = 2
    model = TableLatency.from_samples(pd.concat([single, two], ignore_index=True))
    again = TableLatency.from_profile(model.to_profile())
    assert again.target_step(50) == pytest.approx(0.6)
    assert again.batches[2].plain_step is None and again.batches[2].target_step(50) == pytest.approx(2.0)
    # a profile without a plain step reads as before
    assert "target_step" not in TableLatency.from_samples(latency_table(verify=VERIFY)).to_profile()


def test_a_fit_gives_the_plain_step_its_own_surface_not_the_draft_steps():
    ctx = (64, 128, 256, 512)
    samples = pd.concat([
        noisy_latency(lambda k, c: 0.25 + 1e-4 * c, [1], ctx, op="draft_step", noise=0.0),
        noisy_latency(lambda k, c: 1.0 + 0.5 * (k - 1) + 1e-4 * c, [1, 2, 4, 8], ctx, noise=0.0),
        noisy_latency(lambda k, c: 0.6 + 1e-4 * c, [1], ctx, op="target_step", noise=0.0, seed=1),
    ], ignore_index=True)
    fitted = fit_latency(samples)
    assert fitted.draft_step(300, NO_LAYER) == pytest.approx(0.25 + 0.03, rel=1e-6)
    assert fitted.target_step(300) == pytest.approx(0.6 + 0.03, rel=1e-6)
    without = fit_latency(samples[samples["op"] != "target_step"])
    assert without.target_step(300) == without.target_forward(1, 300)


def test_ad_on_a_llama_cpp_trace_is_priced_from_plain_steps_and_speculation_is_not():
    # 10 positions, all accepted: AD runs 9 plain steps (positions 1..9)
    plain = Simulator(llama_trace()).run("ad", {}, with_cost=False).summary
    assert plain.wall_time_s == pytest.approx(9 * 0.6)
    assert plain.ad_wall_time_s == plain.wall_time_s  # AD is its own baseline: speedup 1
    # sd γ = 3 from 1, 5, 9 (llama.cpp: no catch-up): its rounds are verifications, as before;
    # only its baseline moved, from nine one-token verifications to nine plain steps
    before = Simulator(llama_trace(plain=None)).run("sd", {"gamma": 3}, with_cost=False).summary
    after = Simulator(llama_trace()).run("sd", {"gamma": 3}, with_cost=False).summary
    assert after.wall_time_s == before.wall_time_s == 0.75 + 2.5 + 0.75 + 2.5 + 1.0
    assert before.ad_wall_time_s == pytest.approx(9 * 1.0)
    assert after.ad_wall_time_s == pytest.approx(9 * 0.6)
    assert after.speedup == pytest.approx(5.4 / 7.5)


def test_the_closed_form_sd_replay_prices_its_baseline_alike():
    # `sd` without a timeline takes the vectorised replay (simlab.sim.vanilla): the same baseline
    fast = Simulator(llama_trace(pattern="1101111011")).run("sd", {"gamma": 2}, with_cost=False).summary
    rounds = Simulator(llama_trace(pattern="1101111011")).run("sd", {"gamma": 2}, with_cost=False,
                                                               timeline_prompt=0).summary
    assert fast.ad_wall_time_s == rounds.ad_wall_time_s == pytest.approx(9 * 0.6)
    assert fast.wall_time_s == rounds.wall_time_s


def test_a_batch_of_plain_steps_is_priced_from_each_batch_sizes_own_plain_step():
    rows = [latency_table(draft=0.05, verify={1: 0.2, 2: 0.3}, plain=0.1, ctx=(0, 1000)).assign(batch=1)]
    rows += [latency_table(draft=0.05 * b, verify={1: 0.2 * b, 2: 0.3 * b}, plain=0.1 * b ** 0.5,
                           ctx=(0, 1000)).assign(batch=b) for b in (2, 4)]
    lat = BatchLatency(LatencyGrid(TableLatency.from_samples(pd.concat(rows, ignore_index=True)), 2000))
    assert lat.step([100]) == pytest.approx(0.1)
    assert lat.step([100, 500]) == pytest.approx(0.1 * 2 ** 0.5)
    assert lat.step([1] * 3) == pytest.approx((0.1 * 2 ** 0.5 + 0.2) / 2)  # linear in B between 2 and 4
    assert lat.target([1, 1], [100, 500]) == pytest.approx(0.4)  # a verification is still a verification
    # without batch tables, the token-count rule scaled by the plain step's share of a one-token forward
    single = BatchLatency(LatencyGrid(TableLatency.from_samples(rows[0]), 2000))
    assert single.step([10, 10]) == pytest.approx(0.3 * 0.1 / 0.2)


def test_serve_runs_ad_as_plain_steps_and_speculation_as_verifications():
    config = ServeConfig("ad", {}, scheduler=Scheduler(2, 10_000))
    res = serve(Simulator(llama_trace()), [0.0], config, record=True)
    steps = [s for s in res.run.slices if s.name == "verify"]
    assert len(steps) == 9 and all(s.end - s.start == pytest.approx(0.6) for s in steps)
    sd = serve(Simulator(llama_trace()), [0.0], replace(config, policy="sd", params={"gamma": 3}), record=True)
    assert [round(s.end - s.start, 9) for s in sd.run.slices if s.name == "verify"] == [2.5, 2.5, 1.0]


def test_a_llama_cpp_trace_without_plain_steps_says_how_its_ad_is_priced(capsys, monkeypatch):
    monkeypatch.setattr("simlab.sim.executor._warned", set())  # as in a fresh process
    Simulator(llama_trace(plain=None))
    assert "no plain decoding steps" in capsys.readouterr().err
    Simulator(llama_trace(plain=None))  # once per process and trace
    Simulator(llama_trace())  # a trace with them says nothing
    assert capsys.readouterr().err == ""

"""DEL's shadow tokens are target work: after the prefill and after every verification, an exit
head (final norm and LM head) per exit layer over the positions just settled. The simulator
prices them where the trace's latency probe timed exit heads (docs/policies/early-exit.md, Time):
which layers get a head (one rule for live and simulated decoding), what each latency model
charges, what the executor and the serving engine book, and what a trace probed before the
exit-head axis keeps."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest

from simlab.common.signals import shadow_layers
from simlab.latency import TableLatency
from simlab.latency.fitted import FittedLatency, fit_latency
from simlab.latency.roofline import DTYPE_BYTES, RooflineLatency, gpu_spec, model_shape
from simlab.serve.run import ServeConfig, serve_once
from simlab.sim import executor as sim_executor
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace
from simlab.trace.schema import NO_LAYER
from tests.helpers import hand_trace, latency_table

SELFSPEC = Path(__file__).resolve().parents[1] / "traces" / "smollm2-selfspec"
PER_ROW = 1e-3  # seconds of an exit head per row of hidden state, in the priced copies below
HEAD_ROWS = (*range(1, 10), 17, 32)  # the probe's default exit-head axis
def with_heads(samples: pd.DataFrame, per_row: float = PER_ROW) -> pd.DataFrame:
    """``samples`` (less any exit-head axis they have) and the exit-head axis of a head costing
    ``per_row`` s a row."""
    heads = pd.DataFrame({"op": "exit_head", "k": list(HEAD_ROWS), "context_len": 0, "layer": NO_LAYER,
                          "corun": False, "repeat": 0, "seconds": [per_row * n for n in HEAD_ROWS], "batch": 1})
    return pd.concat([without_heads(samples), heads], ignore_index=True)


def without_heads(samples: pd.DataFrame) -> pd.DataFrame:
    """``samples`` as a probe before the exit-head axis took them."""
    return samples[samples["op"] != "exit_head"]


@pytest.fixture(scope="module")
def selfspec():
    return read_trace(SELFSPEC)


@pytest.fixture(scope="module")
def unprobed(selfspec):
    """The shipped self-speculative trace as it was before its probe timed exit heads."""
    trace = copy.copy(selfspec)
    trace.latency = without_heads(selfspec.latency)
    return trace


def test_shadow_reads_cover_the_recorded_exit_layers_or_every_layer_below_the_last():
    assert shadow_layers([24, 2], 30) == [24, 2]
    assert shadow_layers([], 4) == [1, 2, 3] == shadow_layers(None, 4)


def test_a_shadow_read_is_one_exit_head_per_layer_over_its_rows():
    table = TableLatency.from_samples(latency_table(heads={1: 0.01, 2: 0.012, 4: 0.02}))
    assert table.exit_head(3) == pytest.approx(0.016)  # linear between probed row counts
    assert table.exit_head(6) == pytest.approx(0.028)  # past the last: its slope
    assert TableLatency.from_profile(table.to_profile()).exit_heads == table.exit_heads
    grid = Simulator(hand_trace(["1111"], latency=latency_table(heads={1: 0.01, 2: 0.012, 4: 0.02}))).latency
    assert grid.prices_shadows and grid.shadow_seconds(3, 5) == pytest.approx(5 * 0.016)
    unprobed = Simulator(hand_trace(["1111"])).latency
    assert not unprobed.prices_shadows and unprobed.shadow_seconds(3, 5) == 0.0


def test_calibrate_fits_the_exit_head_and_a_roofline_reads_the_lm_head_once():
    samples = latency_table(verify={k: 1.0 + 0.1 * k for k in range(1, 6)},
                            heads={n: 0.01 + 0.002 * n for n in (1, 2, 3, 4, 8, 16)})
    fitted = fit_latency(samples)
    assert fitted.exit_head(6) == pytest.approx(0.022, rel=1e-3)
    assert FittedLatency.from_profile(fitted.to_profile()).exit_head(6) == fitted.exit_head(6)
    assert fit_latency(latency_table()).exit_head(6) is None
    shape, gpu = model_shape("qwen2.5-coder-1.5b"), gpu_spec("h100")
    roofline = RooflineLatency("r", shape, gpu, dtype="bfloat16")
    head = shape.vocab * shape.hidden
    assert roofline.exit_head(1) == DTYPE_BYTES["bfloat16"] * head / (gpu.memory_bandwidth_gb_s * 1e9)  # memory-bound
    assert roofline.exit_head(4096) == 2.0 * 4096 * head / (gpu.matmul_tflops * 1e12)  # compute-bound


def test_the_simulator_books_every_shadow_read_on_the_target_after_its_forward(selfspec, unprobed):
    """Every prompt settles its n_tokens positions once each (position 0 after the prefill, the
    rest after the verifications), so its shadow reads cost 29 heads x PER_ROW x n_tokens; each
    read starts when the forward that settled its rows ends, and the next round waits for it."""
    pid = int(selfspec.prompts["prompt_id"].min())
    plain = Simulator(unprobed).run("del", with_cost=False)
    priced = Simulator(selfspec, TableLatency.from_samples(with_heads(selfspec.latency), draft_layer=24))
    res = priced.run("del", with_cost=False, timeline_prompt=pid)
    s, p = res.summary, plain.summary
    assert (s.tokens, s.target_calls, s.drafted, s.accepted) == (p.tokens, p.target_calls, p.drafted, p.accepted)
    heads = len(shadow_layers(selfspec.manifest.exit_layers, selfspec.manifest.n_layers))
    assert heads == 29
    settled = s.tokens + len(selfspec.prompts)  # n_tokens summed: tokens after position 0, plus position 0
    assert s.wall_time_s - p.wall_time_s == pytest.approx(heads * PER_ROW * settled, rel=1e-9)

    line = sorted(res.timeline, key=lambda x: (x.start, x.end))
    assert line[0].name == "shadow x1" and line[0].start == 0.0  # the prefill's position 0
    for before, after in zip(line, line[1:]):
        assert after.start >= before.end - 1e-12  # one after another: nothing overlaps a shadow read
    verifies = [x for x in line if x.name.startswith("verify")]
    for v in verifies:
        shadow = next(x for x in line if x.start == v.end and x.name.startswith("shadow"))
        assert shadow.args["tokens"] == v.args["accepted"] + 1 and shadow.device == "target"
        assert shadow.end - shadow.start == pytest.approx(heads * PER_ROW * (v.args["accepted"] + 1))


def test_a_trace_probed_without_exit_heads_keeps_its_figures_and_says_so_once(selfspec, unprobed, capsys,
                                                                            monkeypatch):
    monkeypatch.setattr(sim_executor, "_warned", set())
    assert Simulator(selfspec).latency.prices_shadows  # the shipped trace's probe timed them
    sim = Simulator(unprobed)
    assert not sim.latency.prices_shadows
    first = sim.run("del", with_cost=False, timeline_prompt=int(selfspec.prompts["prompt_id"].min()))
    sim.run("del", with_cost=False)
    Simulator(unprobed).run("del", with_cost=False)
    sim.run("sd", with_cost=False)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "del's shadow tokens are unpriced" in err[0]
    assert err[0].endswith(f"{selfspec.manifest.command} --resume --reprobe")
    assert not any(x.name.startswith("shadow") for x in first.timeline)
    # the figures DEL had before shadow reads were priced: every slice is a draft or a verification
    assert {x.name.split(" ")[0] for x in first.timeline} == {"draft", "verify"}


def test_a_del_request_served_alone_pays_its_shadow_reads_as_simulate_does():
    trace = hand_trace(["1111111111", "1101111011"], layers={2: ["1110111011", "1111011111"]},
                       latency=latency_table(draft=0.1, verify={k: 1 + 0.1 * k for k in range(1, 12)},
                                             layers={2: 0.02}, heads={n: 0.05 * n for n in range(1, 12)}))
    sim = Simulator(trace)
    want = sim.run("del", {}, with_cost=False).per_prompt.iloc[0]
    run = serve_once(sim, [0.0], ServeConfig("del", {}), "del", {}, record=True)
    r = run.requests[0]
    assert r.finish - r.first_token == pytest.approx(want.wall_time_s, rel=1e-12)
    shadows = [x for x in run.slices if x.name == "shadow"]
    assert sum(x.args["tokens"] for x in shadows) == 10  # every position settled once
    assert all(x.end - x.start == pytest.approx(0.05 * x.args["tokens"]) for x in shadows)  # one exit layer
    both = serve_once(sim, [0.0, 0.0], ServeConfig("del", {}), "del", {}, record=True)  # one prefill, then batches
    shadows = [x for x in both.slices if x.name == "shadow"]
    assert sum(x.args["tokens"] for x in shadows) == 20 and shadows[0].args == {"step": 1, "batch": 2, "tokens": 2}


def test_a_live_del_run_is_reported_with_its_measured_and_priced_shadow_time():
    """``simlab live`` puts the time its shadow reads took (the decode log's ``shadow`` entries)
    beside what the simulator priced for them, prompt by prompt."""
    from types import SimpleNamespace

    from simlab.common.metrics import Counts
    from simlab.live.prediction import Prediction
    from simlab.sim.devices import Topology

    trace = hand_trace(["1111111111"], layers={2: ["1110111011"]},
                       latency=latency_table(layers={2: 0.02}, heads={n: 0.05 * n for n in range(1, 12)}))
    setup = SimpleNamespace(cfg=SimpleNamespace(policy="del", params={}, seed=0, max_new_tokens=10), ids={0: [1] * 10},
                            topology=Topology.TWO_DEVICES, tree_data=lambda: None)
    reads = [SimpleNamespace(what="shadow", start=0.0, end=0.25), SimpleNamespace(what="verify", start=0.25, end=1.0),
             SimpleNamespace(what="shadow", start=1.0, end=1.5)]
    run = SimpleNamespace(counts=Counts(tokens=9, target_calls=3, wall_time_s=2.0, ad_wall_time_s=3.0), forwards=reads)
    outcome = SimpleNamespace(prompt_id=0, source="hand/0", policy=run, lossless=True, ad_spread=0.0, speedups=[1.5],
                              speedup_spread=0.0, other_cpu_max=0.0, disturbed=False)
    row = Prediction(setup, trace, None).compare([outcome]).table.iloc[0]
    assert row["measured_shadow_s"] == 0.75
    assert row["predicted_shadow_s"] == pytest.approx(0.05 * 10)  # one exit layer, each of the 10 positions once


@pytest.mark.slow
def test_live_del_reads_the_same_layers_and_logs_each_read_after_its_forward():
    """The live decoder computes shadow tokens at the layers of the rule the simulator prices
    (:func:`shadow_layers`: a trace's exit layers, or without a trace every layer below the last,
    as ``simlab live`` loads the pair), over the positions each forward settled, and logs each
    read as a ``shadow`` forward of the target right after that forward."""
    pytest.importorskip("torch", reason="live decoding needs the models extra (torch)")
    from simlab.live.executor import LiveExecutor
    from simlab.models import install
    from simlab.models.early_exit import early_exit_draft
    from simlab.models.load import load_model, resolve
    from simlab.policies import PolicyContext, make_policy

    install("smollm2")
    target = load_model(resolve("smollm2"), "cpu", "float32")
    n_layers = target.config.num_hidden_layers
    prompt = list(range(1000, 1040))
    for recorded in ([22, 24], []):
        layers = shadow_layers(recorded, n_layers)
        ex = LiveExecutor(early_exit_draft(target, 24), target, [2], exit_layers=layers)
        policy = make_policy("del", PolicyContext(latency=None, exit_layers=layers, n_layers=n_layers))
        seen, observe = [], policy.observe_shadows
        policy.observe_shadows = lambda shadows: seen.append(shadows) or observe(shadows)
        try:
            run = ex.run(policy, 0, prompt, 12)
        finally:
            ex.close()
        assert seen and all(list(s.layers) == layers for s in seen)
        reads = [f for f in run.forwards if f.what == "shadow"]
        assert [(f.position, f.tokens) for f in reads] == [(0, 1)] + [(r["start"], r["accepted"] + 1) for r in run.rounds]
        assert [s.table.shape for s in seen] == [(f.tokens, 1 + 3 * len(layers)) for f in reads]  # every layer's columns
        verifies = [f for f in run.forwards if f.what == "verify"]
        assert all(v.end <= f.start for v, f in zip(verifies, reads[1:]))  # each read after its verification
        assert all(f.device == "target" for f in reads)

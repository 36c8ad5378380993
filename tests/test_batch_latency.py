"""Batch-aware latency: a batch of one is the single-request model's own figure; larger batches
follow the roofline (weights once, KV per sequence) or the documented token-count rule."""

import pytest

from simlab.latency import roofline as rf
from simlab.latency.batch import BatchLatency
from simlab.latency.grid import LatencyGrid
from simlab.latency.model import TableLatency, load_profile
from simlab.paths import CALIBRATE
from tests.helpers import latency_table

H100_PROFILE = CALIBRATE / "roofline" / "qwen2.5-coder-0.5b-1.5b-h100.json"


def table_batch(verify=None, draft=0.1) -> BatchLatency:
    model = TableLatency.from_samples(latency_table(draft=draft, verify=verify, ctx=(0, 1000)))
    return BatchLatency(LatencyGrid(model, 600))


def roofline_batch() -> BatchLatency:
    return BatchLatency(LatencyGrid(load_profile(H100_PROFILE), 600))


@pytest.mark.parametrize("make", [table_batch, roofline_batch])
def test_a_batch_of_one_prices_exactly_like_the_single_request_grid(make):
    lat = make()
    grid = lat.grid
    for k, c in [(1, 0), (5, 137), (3, 400)]:
        assert lat.target([k], [c]) == grid.target_forward(k, c)
        assert lat.draft([1], [c]) == grid.draft_step(c)
        assert lat.draft_phase([k], [c]) == (grid.draft_seconds(c, k), k)


def test_roofline_batch_of_one_matches_the_single_sequence_roofline():
    model = load_profile(H100_PROFILE)
    for k, c in [(1, 10), (6, 300), (512, 0)]:
        assert model.batch_forward([k], [c], draft=False) == pytest.approx(model.target_forward(k, c), rel=1e-12)
        assert model.batch_forward([1], [c], draft=True) == pytest.approx(model.draft_step(c), rel=1e-12)


def test_roofline_reads_the_weights_once_per_batch():
    model = load_profile(H100_PROFILE)
    shape, gpu = model.target, model.gpu
    one = rf.ideal_seconds(shape, gpu, 1, 100, 2)
    eight = rf.batch_ideal_seconds(shape, gpu, [1] * 8, [100] * 8, 2)
    # memory-bound at batch 8: the weights dominate, only 7 more KV caches are read
    kv_one = shape.layers * 2 * shape.kv * shape.hd * 101 * 2 / (gpu.memory_bandwidth_gb_s * 1e9)
    assert eight == pytest.approx(one + 7 * kv_one, rel=1e-9)
    assert eight < 1.1 * one


def test_roofline_turns_compute_bound_when_the_batch_has_enough_tokens():
    model = load_profile(H100_PROFILE)
    shape, gpu = model.target, model.gpu
    big = rf.batch_ideal_seconds(shape, gpu, [8] * 128, [0] * 128, 2)
    flops = 2.0 * 1024 * shape.params() + shape.layers * 4.0 * 128 * 8 * 8 * shape.heads * shape.hd
    assert big == pytest.approx(flops / (gpu.matmul_tflops * 1e12), rel=1e-9)


def test_roofline_pays_the_framework_overhead_once_per_forward():
    model = load_profile(H100_PROFILE)
    fixed = model.target.layers * model.overhead.per_layer_s + model.overhead.per_forward_s
    ideal = rf.batch_ideal_seconds(model.target, model.gpu, [2, 3], [50, 70], 2)
    assert model.batch_forward([2, 3], [50, 70], draft=False) == pytest.approx(ideal + fixed, rel=1e-12)


def test_token_count_rule_prices_a_batch_as_one_sequence_of_all_its_tokens_at_the_mean_context():
    verify = {k: 0.1 * k for k in range(1, 40)}  # 0.1 s per token
    lat = table_batch(verify=verify)
    assert lat.extrapolated and "extrapolated" in lat.rule
    assert lat.target([2, 3, 4], [10, 20, 30]) == pytest.approx(0.9)
    # a draft step of 3 sequences: the draft step times the target's growth from 1 to 3 tokens
    assert lat.draft([1, 1, 1], [10, 20, 30]) == pytest.approx(0.1 * 3)


def test_roofline_batches_are_not_flagged_as_extrapolated():
    assert not roofline_batch().extrapolated


def test_ragged_drafts_run_a_draft_step_while_any_request_still_drafts():
    lat = table_batch(verify={k: 0.1 * k for k in range(1, 40)}, draft=0.05)
    seconds, steps = lat.draft_phase([3, 1, 0], [10, 20, 30])
    # step 1: two sequences (0.05 * 2); steps 2 and 3: the first alone (0.05 each)
    assert steps == 3
    assert seconds == pytest.approx(0.05 * 2 + 0.05 + 0.05)
    assert lat.draft_phase([0, 0], [1, 2]) == (0.0, 0)

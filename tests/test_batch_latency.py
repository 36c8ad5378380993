"""Batch-aware latency: a batch of one is the single-request model's own figure; larger batches
follow the roofline (weights once, KV per sequence), measured batches (the probe's batch axis)
or the documented token-count rule."""

import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.common.locations import CALIBRATE
from simlab.latency import roofline as rf
from simlab.latency.batch import BatchLatency
from simlab.latency.grid import LatencyGrid
from simlab.latency.model import TableLatency, load_profile, save_profile
from simlab.trace.schema import NO_LAYER
from tests.helpers import latency_table, put_table

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
    # the first step feeds the first sequence two tokens: the padded step (0.05 x 2) grows as one
    # sequence's step grows to two tokens, verify(2) / verify(1) = 2, so 0.2 s; the second step,
    # the first sequence alone, 0.05 s
    assert lat.draft_phase([2, 1], [10, 20], feeds=[2, 1]) == (pytest.approx(0.2 + 0.05), 2)


# -- measured batches (the probe's batch axis) ------------------------------------------------

def measured_samples() -> pd.DataFrame:
    """Batch 1 as ``latency_table``; batch b: verify k at context c costs (0.1 + 0.02 k) * b**0.5
    + 1e-4 c, a draft step 0.05 * b**0.5 (numbers chosen so that no two rules agree)."""
    single = latency_table(draft=0.05, verify={k: 0.1 + 0.02 * k for k in range(1, 10)}, ctx=(0, 1000))
    rows = []
    for b in (2, 4, 8):
        for c in (0, 1000):
            rows.append(("draft_step", 1, c, NO_LAYER, False, 0, 0.05 * b ** 0.5, b))
            rows += [("target_forward", k, c, NO_LAYER, False, 0, (0.1 + 0.02 * k) * b ** 0.5 + 1e-4 * c, b)
                     for k in range(1, 10)]
    batched = pd.DataFrame(rows, columns=[*single.columns, "batch"])
    return pd.concat([single.assign(batch=1), batched], ignore_index=True)


def measured_batch() -> BatchLatency:
    return BatchLatency(LatencyGrid(TableLatency.from_samples(measured_samples()), 2000))


def test_measured_batches_price_a_padded_forward_at_the_longest_k_and_context():
    lat = measured_batch()
    assert lat.measured and lat.extrapolated is False and "measured batches B=1,2,4,8" in lat.rule
    assert lat.target([3, 5], [100, 600]) == pytest.approx((0.1 + 0.02 * 5) * 2 ** 0.5 + 1e-4 * 600)
    assert lat.target([1] * 8, [500] * 8) == pytest.approx(0.12 * 8 ** 0.5 + 0.05)
    assert lat.draft([1] * 4, [0, 900, 10, 10]) == pytest.approx(0.05 * 4 ** 0.5)
    # a batch of one is still the single-request grid's own cell
    assert lat.target([4], [300]) == lat.grid.target_forward(4, 300)


def test_a_batched_first_draft_step_that_feeds_two_tokens_grows_as_the_batched_target_does():
    # the CPU's shape: one sequence's second token costs 2x (single verify(2) / verify(1) = 2),
    # two sequences' second token nothing (batch-2 target: k = 1 and 2 both 0.3 s); a batch-2
    # draft step costs 0.12 s. The first step of a round where one sequence lacks two tokens is
    # then the batch-2 step grown as the batch-2 target grows: 0.12 x 1, not 0.12 x 2
    single = latency_table(draft=0.05, verify={1: 0.1, 2: 0.2, 3: 0.3}, ctx=(0, 1000))
    rows = [("draft_step", 1, c, NO_LAYER, False, 0, 0.12, 2) for c in (0, 1000)]
    rows += [("target_forward", k, c, NO_LAYER, False, 0, t, 2) for c in (0, 1000) for k, t in ((1, 0.3), (2, 0.3), (3, 0.45))]
    samples = pd.concat([single.assign(batch=1), pd.DataFrame(rows, columns=[*single.columns, "batch"])], ignore_index=True)
    lat = BatchLatency(LatencyGrid(TableLatency.from_samples(samples), 2000))
    assert lat.draft_phase([2, 2], [10, 20], feeds=[2, 1]) == (pytest.approx(0.12 + 0.12), 2)
    assert lat.draft_phase([2, 2], [10, 20], feeds=[3, 1]) == (pytest.approx(0.12 * 1.5 + 0.12), 2)
    # alone, the sequence's own catch-up (its single growth, 2x) as the simulator prices it
    assert lat.draft_phase([2], [10], feeds=[2]) == (pytest.approx(0.05 * 2 + 0.05), 2)


def test_samples_of_batches_above_one_only_are_refused_for_want_of_single_request_figures():
    # batch 1 is the table itself: with no batch-1 sample it has no draft step, and does not
    # borrow a batch's (the first sample here is a batch-2 draft step)
    batched = measured_samples().query("batch > 1")
    assert (batched.iloc[0]["op"], batched.iloc[0]["batch"]) == ("draft_step", 2)
    with pytest.raises(SimlabError, match="has no draft-step curve"):
        TableLatency.from_samples(batched)


def test_a_batch_size_timed_in_plain_steps_only_is_priced_between_its_neighbours():
    # vLLM's plain steps of a batch of 4 whose first request finished: batch 3, no speculative step
    samples = measured_samples()
    plain3 = pd.DataFrame([("target_step", 1, 0, NO_LAYER, False, 0, 0.3, 3)], columns=samples.columns)
    lat = BatchLatency(LatencyGrid(TableLatency.from_samples(pd.concat([samples, plain3], ignore_index=True)), 2000))
    assert lat.sizes == (1, 2, 4, 8)
    assert lat.draft([1] * 3, [0] * 3) == pytest.approx(0.05 * (2 ** 0.5 + 4 ** 0.5) / 2)


def test_between_measured_batch_sizes_the_price_is_linear_in_b_and_beyond_it_is_flagged():
    lat = measured_batch()
    two, four = lat.target([2, 2], [0, 0]), lat.target([2] * 4, [0] * 4)
    assert lat.target([2] * 3, [0] * 3) == pytest.approx((two + four) / 2)
    eight = lat.target([2] * 8, [0] * 8)
    assert lat.target([2] * 12, [0] * 12) == pytest.approx(eight + 4 * (eight - four) / 4)
    assert lat.extrapolated is False  # 12 is within twice the largest measured batch
    lat.target([2] * 17, [0] * 17)
    assert lat.extrapolated and "extrapolated linearly" in lat.rule


def test_an_old_trace_without_a_batch_column_reads_as_batch_one(tmp_path):
    import pyarrow.parquet as pq

    from simlab.trace import read_trace, write_trace
    from simlab.trace.synth import SynthSpec, synth_trace

    path = write_trace(synth_trace(SynthSpec(prompts=2, tokens=20, seed=1)), tmp_path / "t")
    table = pq.read_table(path / "latency.parquet")
    put_table(path, "latency", table.drop_columns(["batch"]))
    lat = read_trace(path).latency
    assert (lat["batch"] == 1).all()
    assert not TableLatency.from_samples(lat).batches


@pytest.mark.parametrize("kind", ["table", "fitted"])
def test_profiles_keep_their_measured_batches(kind, tmp_path):
    from simlab.latency.fitted import fit_latency

    samples = measured_samples()
    model = TableLatency.from_samples(samples) if kind == "table" else fit_latency(samples, form="per-x")
    back = load_profile(save_profile(model, tmp_path / "p.json"))
    assert set(back.batches) == {2, 4, 8}
    for b in (2, 8):
        assert back.batches[b].target_forward(5, 1000) == pytest.approx((0.2) * b ** 0.5 + 0.1, rel=1e-6)
        assert back.batches[b].draft_step(500) == pytest.approx(0.05 * b ** 0.5, rel=1e-6)


def test_probe_plan_reads_the_batch_axis():
    from simlab.common.errors import SimlabError
    from simlab.record.latency import ProbePlan

    plan = ProbePlan.parse("batch=1,2,4,8;batch_k=1-3")
    assert (plan.batches, plan.batch_ks, plan.single) == ((1, 2, 4, 8), (1, 2, 3), True)
    assert not ProbePlan.parse("batch=2,4").single
    with pytest.raises(SimlabError, match="at least 1"):
        ProbePlan.parse("batch=0,2")


def test_a_trace_is_measured_again_at_the_points_its_manifest_says_it_was_probed_at():
    """recorded_probe turns a manifest's plans back into a spec: parsed, it is the plan recorded,
    with a later batch-axis re-probe's sizes added; fields an older manifest lacks stay at their
    defaults, and the empty axes (no trees, no exit heads) stay empty."""
    from simlab.record.latency import ProbePlan, recorded_probe

    plan = ProbePlan.parse("k=1-4,9;ctx=64;repeats=2;corun=no;batch=1,2;batch_k=1-3;tree=none;exit_head=2,5")
    assert ProbePlan.parse(recorded_probe({"latency_probe": plan.to_dict()})) == plan
    later = ProbePlan.parse("batch=4,16;batch_k=2,7")
    both = ProbePlan.parse(recorded_probe({"latency_probe": plan.to_dict(), "batch_probe": {**later.to_dict(),
                                                                                            "probe_seconds": 9.0}}))
    assert (both.batches, both.batch_ks) == ((1, 2, 4, 16), (1, 2, 3, 7)) and both.ks == plan.ks
    old = ProbePlan.parse(recorded_probe({"latency_probe": {"ks": [1, 2], "contexts": [128], "repeats": 3,
                                                            "corun": True}}), trees=True)
    assert (old.ks, old.contexts, old.repeats, old.batches) == ((1, 2), (128,), 3, ProbePlan.parse("").batches)
    assert old.trees == ProbePlan.parse("", trees=True).trees != ()
    assert ProbePlan.parse(recorded_probe({})) == ProbePlan.parse("")


def test_serve_prices_its_verifications_from_the_measured_batches():
    from simlab.serve.run import ServeConfig, serve
    from simlab.serve.scheduler import Scheduler
    from simlab.sim.run import Simulator
    from tests.helpers import hand_trace

    trace = hand_trace(["1" * 30] * 4, latency=measured_samples())
    res = serve(Simulator(trace), [0.0] * 4, ServeConfig("sd", {"gamma": 3}, scheduler=Scheduler(4, 10_000)),
                record=True)
    assert not res.extrapolated and "measured batches" in res.latency_rule
    verify = [s for s in res.run.slices if s.name == "verify"]
    lat = measured_batch()
    assert len(verify) > 2
    for s in verify:  # contexts stay below 50 tokens: within 0.005 s of context 0
        b, k = s.args["batch"], s.args["tokens"] // s.args["batch"]
        assert s.end - s.start == pytest.approx(lat.target([k] * b, [0] * b), abs=0.005)


def _prefill_model(prefill=None, fitted=False):
    # a k-token forward 0.1 s per token (all logits, and the draft beside it, as llama.cpp's
    # verification is timed); prefills timed as a server runs them cheaper: the target's 0.05 s
    # and the draft's 0.01 s per token
    samples = latency_table(draft=0.1, verify={k: 0.1 * k for k in range(1, 40)}, ctx=(0, 1000), prefill=prefill)
    if fitted:
        from simlab.latency.fitted import fit_latency
        return fit_latency(samples, form="affine")
    return TableLatency.from_samples(samples)


PREFILLS = {k: (0.05 * k, 0.01 * k) for k in (1, 2, 4, 8, 16, 32, 64)}


@pytest.mark.parametrize("fitted", [False, True])
def test_timed_prefills_price_a_prompt_where_the_probe_has_them(fitted):
    lat = BatchLatency(LatencyGrid(_prefill_model(PREFILLS, fitted), 600))
    # 40 + 8 prompt tokens: the target's timed prefill, between k = 32 and 64, and the draft's
    close = {"rel": 1e-5}  # a least-squares fit of exact lines is exact to rounding
    assert lat.prefill([40, 8]) == pytest.approx(0.05 * 48 + 0.01 * 48, **close)
    assert lat.prefill([40, 8], drafts=False) == pytest.approx(0.05 * 48, **close)
    # untimed, a prefill is the 48-token forward and the draft's step scaled by its growth
    plain = BatchLatency(LatencyGrid(_prefill_model(None, fitted), 600))
    assert plain.prefill([40, 8]) == pytest.approx(0.1 * 48 * (1 + 0.1 / 0.1), **close)


def test_timed_prefills_survive_a_profile_round_trip(tmp_path):
    model = _prefill_model(PREFILLS)
    again = load_profile(save_profile(model, tmp_path / "p.json"))
    assert again.prefill(48, 0) == model.prefill(48, 0) == pytest.approx(2.4)
    assert again.prefill(48, 0, draft=True) == pytest.approx(0.48)
    assert _prefill_model().prefill(48, 0) is None


def test_prompts_beside_a_verification_add_what_they_add_to_its_forward():
    # mixed scheduling: 20 prompt tokens beside 4 verified ones cost prefill(24) - prefill(4)
    lat = BatchLatency(LatencyGrid(_prefill_model(PREFILLS), 600))
    assert lat.beside([12, 8], 4) == pytest.approx(lat.prefill([24]) - lat.prefill([4]))
    assert lat.beside([12, 8], 4, drafts=False) == pytest.approx(0.05 * 20)


# -- draft trees in a batch (tree policies under simlab serve) --------------------------------

def tree_batch() -> BatchLatency:
    # chain verify 0.1 s per token; tree verifications measured 1.5x the chain at k = 2 and 5
    # (held at the nearest probed size outside: docs/policies/trees.md); the draft's expansion of
    # 3 nodes measured at 0.2 s, its chain proxy verify(3) / verify(1) = 3 steps of 0.05 s
    samples = latency_table(draft=0.05, verify={k: 0.1 * k for k in range(1, 40)}, ctx=(0, 1000),
                            tree={2: 0.3, 5: 0.75}, expand={3: 0.2})
    return BatchLatency(LatencyGrid(TableLatency.from_samples(samples), 600))


def test_a_tree_alone_is_priced_as_the_simulator_prices_it():
    lat = tree_batch()
    grid = lat.grid
    assert lat.target([5], [10], [True]) == grid.target_tree(5, 10) == pytest.approx(0.75)
    assert lat.draft_phase([2], [10], widths=[(1, 3)]) == (grid.tree_draft_seconds(10, (1, 3)), 2)
    # level 1 one node (a step, 0.05 s), level 2 three nodes: the measured 0.2 s
    assert lat.draft_phase([2], [10], widths=[(1, 3)])[0] == pytest.approx(0.05 + 0.2)


def test_a_batch_with_trees_verifies_as_the_chain_batch_times_its_largest_trees_ratio():
    lat = tree_batch()  # no batch axis: the token-count rule, 0.1 s per token of the batch
    # a chain of 3 tokens beside a tree of 5 (ratio 0.75 / 0.5 = 1.5) and one of 2 (ratio 1.5):
    # 10 tokens, 1.0 s, times the 5-token tree's ratio
    assert lat.target([3, 5, 2], [10, 20, 30], [False, True, True]) == pytest.approx(1.0 * 1.5)
    # without a tree the same forward is the chain batch's
    assert lat.target([3, 5, 2], [10, 20, 30], [False, False, False]) == pytest.approx(1.0)


def test_a_batched_tree_level_costs_the_batched_step_times_its_widest_rows_factor():
    lat = tree_batch()
    # two trees of widths (1, 3) and a chain of one token, at contexts 10, 20, 30: step 1 runs all
    # three (0.05 x 3 = 0.15 s, every row one node); step 2 the two trees (0.05 x 2 = 0.1 s) over
    # 3 nodes each, the expansion's factor 0.2 / 0.05 = 4 steps: 0.4 s
    seconds, steps = lat.draft_phase([2, 2, 1], [10, 20, 30], widths=[(1, 3), (1, 3), None])
    assert steps == 2
    assert seconds == pytest.approx(0.15 + 0.4)
    # a chain still drafting beside a tree's wide level: the padded forward is the tree's width
    seconds, _ = lat.draft_phase([2, 2], [10, 20], widths=[(1, 3), None])
    assert seconds == pytest.approx(0.1 + 0.1 * 4)

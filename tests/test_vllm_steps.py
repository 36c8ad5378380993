"""vLLM's timed steps as latency samples (simlab.engines.vllm.steps), on steps written by hand."""

import pytest

from simlab.engines.vllm.jobs import Batch, Step
from simlab.engines.vllm.steps import latency_rows, scatter
from simlab.latency.model import TableLatency


def step(t0, reqs, target, draft, propose, execute=0.2, sample=None):
    """A worker step: ``reqs`` {id: (scheduled, drafts, computed)}, forwards as (tokens, seconds)."""
    return Step(t0=t0, t1=t0 + execute + (sample or propose), execute=execute, sample=sample or propose,
                reqs={r: list(v) for r, v in reqs.items()}, target=[list(f) for f in target],
                target_logits=[[1, 0.01]], draft=[list(f) for f in draft],
                draft_logits=[[1, 0.01]] * len(draft), propose=propose)


def batch(steps):
    return Batch(0, ["a"], 10.0, {}, {}, steps)


K = 4


def decode(t0, ctx, period_draft=0.09, first=0.05, b=1):
    """A verification step of b requests: the first draft forward ``first`` s and K - 1 more of
    ``period_draft`` s each (their logits 0.01 s apiece, in the proposal)."""
    propose = first + 0.01 + (K - 1) * (period_draft + 0.01)
    reqs = {f"r{i}": (1 + K, K, ctx) for i in range(b)}
    return step(t0, reqs, [(b * (K + 1), 0.15)], [(b * (K + 2), first)] + [(b, period_draft)] * (K - 1), propose)


def test_a_verification_is_the_step_less_k_draft_iterations():
    steps = [decode(0.0, 130), decode(1.0, 135), decode(2.1, 140)]
    table = latency_rows({K: [batch(steps)]}).table
    draft = table[table["op"] == "draft_step"]["seconds"].tolist()
    verify = table[table["op"] == "target_forward"]
    assert draft == pytest.approx([0.1, 0.1])  # the last step has no next start: left out
    assert verify["k"].unique().tolist() == [K + 1]
    assert verify["seconds"].tolist() == pytest.approx([1.0 - K * 0.1, 1.1 - K * 0.1])
    assert verify["context_len"].tolist() == [128, 128]  # 130 and 135 binned to 32s


def test_a_round_priced_from_the_samples_is_the_step():
    """K draft steps and one K+1 verification, as the simulator prices a round, give back the period."""
    steps = [decode(0.0, 128), decode(0.8, 128), decode(1.6, 128)]
    model = TableLatency.from_samples(latency_rows({K: [batch(steps)]}, plain=[batch([
        step(0.0, {"p": (1, 0, 128)}, [(1, 0.1)], [], 0.0), step(0.3, {"p": (1, 0, 128)}, [(1, 0.1)], [], 0.0),
        step(0.6, {"p": (1, 0, 128)}, [(1, 0.1)], [], 0.0)])]).table)
    assert K * model.draft_step(128) + model.target_forward(K + 1, 128) == pytest.approx(0.8)
    assert model.target_step(128) == pytest.approx(0.3)


def test_batches_prefills_mixed_steps_and_disturbed_ones():
    prefill = step(0.0, {"a": (129, 0, 0)}, [(129, 1.2)], [(130, 0.5)] + [(1, 0.09)] * (K - 1),
                   0.5 + 0.01 + (K - 1) * 0.1)
    mixed = step(2.0, {"a": (1 + K, K, 129), "b": (160, 0, 0)}, [(165, 1.5)], [(166, 0.6)] + [(2, 0.1)] * (K - 1), 1.0)
    pair = [decode(4.0, 300, b=2), decode(5.0, 305, b=2)]
    disturbed = [decode(7.0, 400, period_draft=0.3), decode(7.5, 400)]  # 0.5 s to the next start < 4 x 0.31
    samples = latency_rows({K: [batch([prefill, mixed, *pair]), batch(disturbed)]})
    table = samples.table
    assert samples.disturbed == 1
    pre = table[table["op"].isin(["target_prefill", "draft_prefill"])].set_index("op")
    assert pre.loc["target_prefill", "k"] == 129
    assert pre.loc["target_prefill", "seconds"] == pytest.approx(2.0 - prefill.propose)
    assert pre.loc["draft_prefill", "seconds"] == pytest.approx(prefill.propose - (K - 1) * 0.1)
    assert not (table["context_len"] == 129).any()  # the mixed step gave no sample
    two = table[(table["batch"] == 2) & (table["op"] == "target_forward")]
    assert two["seconds"].tolist() == pytest.approx([1.0 - K * 0.1])
    assert (table["seconds"] > 0).all()


def test_k1_engines_borrow_the_draft_step_of_others():
    """With K = 1 vLLM runs no one-token draft forward; the same batch and context's from K = 4 stand in."""
    one = [step(0.0, {"a": (2, 1, 128)}, [(2, 0.1)], [(3, 0.05)], 0.06),
           step(0.5, {"a": (2, 1, 128)}, [(2, 0.1)], [(3, 0.05)], 0.06)]
    table = latency_rows({1: [batch(one)], K: [batch([decode(0.0, 128), decode(1.0, 128)])]}).table
    verify = table[(table["op"] == "target_forward") & (table["k"] == 2)]
    assert verify["seconds"].tolist() == pytest.approx([0.5 - 0.1])


def test_scatter_reports_points_with_several_samples():
    steps = [decode(0.0, 128), decode(1.0, 128), decode(2.2, 128), decode(3.1, 128)]
    spread = scatter(latency_rows({K: [batch(steps)]}).table).set_index("op")
    assert spread.loc["target_forward", "samples"] == 3
    assert spread.loc["target_forward", "range_share"] == pytest.approx((0.8 - 0.5) / 0.6)

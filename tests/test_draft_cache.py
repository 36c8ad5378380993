"""A round's first draft forward feeds what the draft's KV cache lacks, as the live decoder
feeds it (simlab/sim/draft_cache.py), and the simulator prices that forward. The live decoder's
own forwards are checked against the simulator's in tests/test_live.py; here the account and
the prices by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simlab.latency.model import TableLatency
from simlab.sim.draft_cache import DraftCache
from simlab.sim.run import Simulator, latency_of
from simlab.trace.schema import NO_LAYER
from tests.helpers import hand_trace, latency_table

PL = 10  # the hand traces' prompt length


def test_the_account_of_a_draft_cache_by_hand():
    cache = DraftCache(PL)  # the session's draft holds the prompt
    assert cache.draft(NO_LAYER, PL + 1, 3) == 1  # the first round feeds the prefill's token, then 2 drafts
    cache.crop(PL + 1 + 1)  # 1 of 3 drafts accepted: the prefix less the correction token
    assert cache.draft(NO_LAYER, PL + 3, 2) == 1  # the correction
    cache.crop(PL + 3 + 2)  # both accepted: the cache never held the last draft
    assert cache.draft(NO_LAYER, PL + 6, 1) == 2  # ... so it feeds it with the bonus token
    cache.crop(PL + 6 + 1)  # its draft accepted: two tokens to feed again
    cache.crop(PL + 8 + 0)  # a round that drafted nothing: the target's token is one more
    assert cache.draft(NO_LAYER, PL + 9, 1) == 3
    assert cache.draft(24, PL + 9, 1) == PL + 9  # an exit layer's own cache starts empty
    cache.crop(PL + 9, NO_LAYER)  # a parallel round crops the session's draft only
    assert cache.held == {NO_LAYER: PL + 9, 24: PL + 9}
    cache.crop(PL + 5)
    assert cache.held == {NO_LAYER: PL + 5, 24: PL + 5}



def test_most_bounds_every_cache_so_a_crop_to_it_may_be_skipped():
    cache = DraftCache(PL)
    cache.draft(NO_LAYER, PL + 1, 3)
    assert cache.most == PL + 3
    cache.draft(24, PL + 1, 1)  # a cache holding less leaves the bound as it was
    assert cache.most == PL + 3
    cache.crop(PL + 2, NO_LAYER)  # one cache cropped: the bound still holds, if loosely
    assert cache.most >= max(cache.held.values())
    cache.crop(PL + 1)  # every cache cropped: the bound is the length
    assert cache.most == PL + 1 == max(cache.held.values())

# draft step 0.25 s; a k-token target forward 1 + 0.5 (k - 1) s, so the draft's forward over two
# tokens costs 0.25 * 1.5 = 0.375 s (the target's growth from 1 to 2 tokens)
SLOPED = latency_table(draft=0.25, verify={1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5})


def test_a_round_after_a_fully_accepted_one_pays_for_its_two_token_catch_up():
    # all 10 positions accepted, sd γ = 3: rounds from 1 (3 drafts, 2.5 s verify), from 5 (its first
    # draft step feeds 2 tokens: 0.125 s more) and from 9 (drafts nothing: a 1.0 s target step)
    run = Simulator(hand_trace(["1" * 10], latency=SLOPED)).run("sd", {"gamma": 3}, with_cost=False, timeline_prompt=0)
    assert run.summary.wall_time_s == 0.75 + 2.5 + 0.75 + 0.125 + 2.5 + 1.0
    assert [s.args.get("fed", 1) for s in run.timeline if s.device == "draft"] == [1, 2]
    # the closed-form replay of fixed-γ SD prices it alike
    assert run.summary.wall_time_s == Simulator(hand_trace(["1" * 10], latency=SLOPED)).run(
        "sd", {"gamma": 3}, with_cost=False).summary.wall_time_s


def test_a_llama_cpp_trace_pays_no_catch_up_its_verifications_fed_the_draft():
    # llama.cpp's verification also runs the draft over the verified tokens (its measured
    # target_forward includes that forward), so the round after a fully accepted one feeds one
    # token: the same rounds as above without the 0.125 s, under `sd` and under llama-cpp's policy
    trace = hand_trace(["1" * 10], latency=SLOPED)
    llama = replace(trace, manifest=replace(trace.manifest, extra={**trace.manifest.extra, "engine": "llama.cpp"}))
    for policy, params in (("sd", {"gamma": 3}), ("llama-cpp", {"draft_max": 3})):
        assert Simulator(llama).run(policy, params, with_cost=False).summary.wall_time_s == 0.75 + 2.5 + 0.75 + 2.5 + 1.0
        assert Simulator(trace).run(policy, params, with_cost=False).summary.wall_time_s == 0.75 + 2.5 + 0.875 + 2.5 + 1.0
    # ... and a latency profile written from it keeps the rule
    model = latency_of(llama)
    assert TableLatency.from_profile(model.to_profile()).verify_feeds_draft
    assert not TableLatency.from_profile(latency_of(trace).to_profile()).verify_feeds_draft


def test_a_round_after_a_rejection_feeds_one_token_and_a_flat_forward_costs_nothing_more():
    # position 3 rejected: the second round starts after a correction, so no round pays more
    rejected = Simulator(hand_trace(["1101111"], latency=SLOPED)).run("sd", {"gamma": 2}, with_cost=False)
    assert rejected.summary.wall_time_s == (0.5 + 2.0) + (0.5 + 2.0) + 1.0 + 0.0  # rounds from 1, 3, 5 (k = 1 capped)
    # a draft whose two-token forward costs what one does (a flat target, as on a GPU) pays nothing more
    flat = latency_table(draft=0.25, verify={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0})
    run = Simulator(hand_trace(["1" * 10], latency=flat)).run("sd", {"gamma": 3}, with_cost=False)
    assert run.summary.wall_time_s == 0.75 + 1.0 + 0.75 + 1.0 + 1.0


def test_an_exit_layers_first_draft_feeds_it_the_whole_context():
    # LayerSkip drafting at exit layer 2 (0.02 s a step): its first forward feeds the prompt and the
    # prefill's token (11 tokens) into the layer's own cache, 0.02 s x the target's growth to 11
    verify = {k: 1 + 0.1 * k for k in range(1, 12)}
    trace = hand_trace(["1" * 10], layers={2: ["1" * 10]},
                       latency=latency_table(draft=0.1, verify=verify, layers={2: 0.02}))
    run = Simulator(trace).run("layerskip", {"exit_layer": 2, "gamma": 3}, with_cost=False, timeline_prompt=0)
    first = next(s for s in run.timeline if s.device == "draft")
    assert first.args["fed"] == PL + 1
    assert first.end - first.start == pytest.approx(3 * 0.02 + 0.02 * (verify[11] / verify[1] - 1))

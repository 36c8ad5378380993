"""`simlab live`'s decoder on a real model, SmolLM2-135M drafting for itself with its first 24
layers (tests/live_fixtures.py): it must emit exactly the target's greedy tokens under every
policy, draft trees included, and the simulator, replaying a trace of the same prompts, must
predict exactly the live target calls and MAT. (The command's probes, reports and faults:
tests/test_live.py; the two files run side by side on the suite's two workers.)
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="live decoding needs the models extra (torch)")
pytest.importorskip("transformers", reason="live decoding needs the models extra (transformers)")

from simlab.live.executor import LiveExecutor  # noqa: E402
from simlab.models.early_exit import early_exit_draft  # noqa: E402
from simlab.policies import REGISTRY  # noqa: E402
from tests.helpers import EveryRoundParallel, SerialThenParallel  # noqa: E402
from tests.live_fixtures import TOKENS  # noqa: E402

pytestmark = pytest.mark.slow

# the oracle sees the future; vllm is checked on vLLM itself (tests/test_vllm_real.py); rest needs a
# datastore (its proposals are checked in tests/test_lookup.py)
LIVE_POLICIES = sorted(name for name, cls in REGISTRY.items()
                       if not cls.needs_future and not cls.checked_by and name != "rest")


@pytest.mark.parametrize("policy", [EveryRoundParallel, SerialThenParallel])
def test_parallel_rounds_are_lossless_live(live_session, live_greedy, policy):
    for pid, ids in live_session.ids.items():
        run = live_session.executor.run(policy(None), pid, ids, TOKENS)
        assert run.tokens == live_greedy[pid]
        assert run.counts.parallel_rounds > 0
        draft = [f for f in run.forwards if f.what == "draft (parallel)"]
        verify = [f for f in run.forwards if f.what == "verify (parallel)"]
        # in a parallel round the draft's first step starts before the target's verify ends
        assert any(d.start < v.end and v.start < d.end for d in draft for v in verify)


@pytest.mark.parametrize("policy", LIVE_POLICIES)
def test_every_policy_is_lossless_live_and_predicted_exactly(live_session, live_greedy, policy):
    """Every policy decoded for real emits the target's greedy tokens, and the simulator predicts
    its target calls and MAT exactly. Decisions never depend on timing (a parallel round's window
    is fixed when it starts), so serial and parallel policies alike make the same rounds live as
    in the replay. One decode per policy and prompt answers both (the suite's slowest part)."""
    from simlab.sim.run import Simulator

    simulator = Simulator(live_session.trace, topology=live_session.topology)
    sim = simulator.run(policy, {}, with_cost=False).per_prompt.set_index("prompt_id")
    pol = live_session.make_policy(policy, {})
    for pid, ids in live_session.ids.items():
        run = live_session.executor.run(pol, pid, ids, TOKENS)
        assert run.tokens == live_greedy[pid]
        assert run.counts.accepted <= run.counts.drafted
        assert run.counts.target_calls == sim.loc[pid, "target_calls"]
        assert run.counts.accepted / run.counts.target_calls == pytest.approx(sim.loc[pid, "mat"])
        assert run.counts.num_drafts == sim.loc[pid, "num_drafts"]  # vLLM's counter, tallied alike
        assert sum(run.positions.accepted) == run.counts.accepted
        # a round's first draft forward feeds what the draft's KV cache lacks, and the simulator
        # prices the same forwards (simlab/sim/draft_cache.py)
        timeline = simulator.run(policy, {}, with_cost=False, timeline_prompt=pid).timeline
        priced = sorted((s.args["position"], s.args["fed"]) for s in timeline if "fed" in s.args)
        assert catch_ups(run) == priced


def catch_ups(run) -> list[tuple[int, int]]:
    """(position, tokens) of every round's first draft forward that fed more than one token: a
    draft forward right after a target forward (later draft steps feed one token, a tree's
    expansions follow its root's forward; a parallel round's verification, logged when it ends,
    may fall between its one-token draft steps; a lookup is no forward of the draft model)."""
    out, after_target = [], True
    for f in run.forwards:
        if f.what in ("prefill", "lookup"):
            continue
        if f.device == "draft" and after_target and f.tokens > 1:
            out.append((f.position, f.tokens))
        after_target = f.device == "target"
    return sorted(out)


def test_a_live_session_hands_policies_the_simulators_context(live_session):
    """Policies that size windows from the context (spide, pearl) decide live as in the
    prediction only if both build them with the same context (simlab/sim/context.py)."""
    from simlab.policies.spide import Spide
    from simlab.sim.run import Simulator

    live = live_session.make_policy("spide", {}).context
    sim = Simulator(live_session.trace, topology=live_session.topology).context()
    assert (live.context_len, live.corun, live.exit_layers, live.n_layers) == \
        (sim.context_len, sim.corun, sim.exit_layers, sim.n_layers)
    assert type(live.latency) is type(sim.latency)
    assert [live.latency.target_forward(k, live.context_len, live.corun) for k in range(1, 9)] == \
        [sim.latency.target_forward(k, sim.context_len, sim.corun) for k in range(1, 9)]
    assert live.best_gamma() == sim.best_gamma()
    assert Spide(live).window == Spide(sim).window


def test_speculative_sampling_runs_to_the_budget(live_session):
    """Chains, parallel rounds and trees (sampled for a fixed shape, top-k for a grown one) at
    temperature > 0 on the real model: every round's caches stay consistent to the budget."""
    ex = LiveExecutor(live_session.executor.draft_model, live_session.executor.target_model, live_session.eos,
                      temperature=1.0, seed=5)
    for policy in (live_session.make_policy("sd", {"gamma": 3}), EveryRoundParallel(None),
                   live_session.make_policy("tree-static", {"shape": "3x2x1"}), live_session.make_policy("eagle2", {"nodes": 8})):
        run = ex.run(policy, 0, live_session.ids[0], TOKENS)
        assert len(run.tokens) == TOKENS or run.tokens[-1] in live_session.eos
        assert 0 <= run.counts.accepted <= run.counts.drafted
    ex.close()


def test_early_exit_draft_shares_weights_but_not_hooks(live_session):
    target = live_session.executor.target_model
    draft = early_exit_draft(target, 5)
    assert draft.lm_head is target.lm_head and draft.model.layers[0] is target.model.layers[0]
    assert len(draft.model.layers) == 5 and len(target.model.layers) == 30
    calls = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append(1))
    with torch.inference_mode():
        draft(input_ids=torch.tensor([[1, 2, 3]]))
    handle.remove()
    assert calls == []


def test_hf_assisted_generation_runs_the_same_fixed_gamma(live_session, live_greedy):
    """--against-hf's baseline: HF assisted generation with a constant γ emits the target's
    greedy tokens in as many target forwards as simlab's sd with that γ (both verify γ drafts a
    round), and leaves the draft's generation config as it found it."""
    from simlab.live.hf import assisted_generate

    ex = live_session.executor
    before = ex.draft_model.generation_config.to_dict()
    pol = live_session.make_policy("sd", {"gamma": 3})
    for pid, ids in live_session.ids.items():
        hf = assisted_generate(ex.target_model, ex.draft_model, ids, TOKENS, 3, live_session.eos)
        run = ex.run(pol, pid, ids, TOKENS)
        assert hf.tokens == live_greedy[pid] == run.tokens
        assert hf.target_calls == run.counts.target_calls
    assert ex.draft_model.generation_config.to_dict() == before


def test_pld_live_emits_and_counts_what_hugging_faces_prompt_lookup_does(live_session):
    """simlab's pld decoding for real against generate(prompt_lookup_num_tokens=N): the same tokens
    and the same number of target forwards (the same lookups, verified alike), on the same models."""
    from simlab.live.hf import lookup_generate

    policy = live_session.make_policy("pld", {"num_tokens": 4})
    looked_up = 0
    for pid, ids in live_session.ids.items():
        run = live_session.executor.run(policy, pid, ids, TOKENS)
        hf = lookup_generate(live_session.executor.target_model, ids, TOKENS, 4, policy.ngram_max, live_session.eos)
        assert run.tokens == hf.tokens
        assert run.counts.target_calls == hf.target_calls
        looked_up += run.counts.drafted
        lookups = [f.what for f in run.forwards].count("lookup")  # every round but one at the budget's last position
        assert run.counts.target_calls - 1 <= lookups <= run.counts.target_calls
    assert looked_up > 0  # some lookups found a match: the comparison is not of plain steps

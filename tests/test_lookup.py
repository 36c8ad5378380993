"""Drafting by lookup (pld, ngram, pld-sd): the rule against Hugging Face's generator, what a
lookup may read (never a future token), the compiled replay against the round protocol."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from simlab.policies import make_policy
from simlab.policies.base import PolicyContext, RoundState
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.io import Trace, empty_table, read_trace
from simlab.trace.schema import Manifest
from tests.helpers import assert_same_run, latency_table

EOS = 7


def token_trace(prompts: list[tuple[list[int], list[int]]], budget: int = 0, draft_match: float = 0.0,
                seed: int = 0) -> Trace:
    """One prompt per (prompt tokens, target tokens); the draft model matches the target with
    probability ``draft_match`` at each position. Verify cost grows with k, lookups are priced."""
    rng = random.Random(seed)
    rows, positions = [], []
    for pid, (prompt, target) in enumerate(prompts):
        n = len(target)
        match = np.array([rng.random() < draft_match for _ in range(n)])
        target = np.asarray(target)
        positions.append(pd.DataFrame({
            "prompt_id": pid, "pos": np.arange(n), "target_token": target,
            "draft_token": np.where(match, target, 90_000), "draft_conf": 0.9, "draft_entropy": 0.1,
            "q_target": 1.0, "p_target": 1.0, "p_draft": 1.0, "accept_prob": 1.0}))
        stop = "eos" if target[-1] == EOS else "length"
        rows.append({"prompt_id": pid, "source": f"tokens/{pid}", "prompt_len": len(prompt), "n_tokens": n,
                     "stop": stop, "prompt_text": "", "prompt_token_ids": list(prompt)})
    manifest = Manifest(kind="synthetic", draft_model="t", target_model="t", dataset="t", hardware="none",
                        max_new_tokens=budget or max(len(t) for _, t in prompts), eos_token_ids=[EOS])
    latency = latency_table(draft=0.02, verify={k: 0.3 + 0.04 * k for k in range(1, 40)}, slope=0.0001)
    return Trace(manifest=manifest, prompts=pd.DataFrame(rows), positions=pd.concat(positions, ignore_index=True),
                 rollouts=empty_table("rollouts"), latency=latency)


def random_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Tokens of a small vocabulary, copied in stretches (as an answer copies its prompt)."""
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.5:
            a = rng.randrange(len(out))
            out += out[a:a + rng.randint(1, 8)]
        else:
            out.append(rng.randrange(vocab))
    return out[:n]


def random_token_trace(seed: int) -> Trace:
    rng = random.Random(seed)
    prompts = []
    for _ in range(rng.randint(1, 4)):
        whole = random_tokens(rng, rng.randint(2, 60), rng.choice([3, 8, 30]))
        cut = rng.randint(1, len(whole) - 1)
        target = whole[cut:]
        if rng.random() < 0.3:
            target = [*target, EOS]
        prompts.append((whole[:cut], target))
    return token_trace(prompts, budget=max(len(t) for _, t in prompts) + rng.choice([0, 0, 3]),
                       draft_match=rng.random(), seed=seed)


def context(eos=(EOS,)) -> PolicyContext:
    return PolicyContext(latency=None, eos_token_ids=list(eos))


def test_pld_proposes_what_hugging_faces_generator_proposes():
    """PromptLookupCandidateGenerator (transformers) on random contexts: the same tokens, end-token
    cut included, for several n-gram sizes and lengths."""
    torch = pytest.importorskip("torch")
    candidate_generator = pytest.importorskip("transformers.generation.candidate_generator")
    rng = random.Random(3)
    compared = matched = 0
    for _ in range(400):
        tokens = random_tokens(rng, rng.randint(2, 80), rng.choice([2, 5, 12]))
        if rng.random() < 0.5:
            tokens[rng.randrange(len(tokens))] = EOS
        num, ngram = rng.randint(1, 12), rng.randint(1, 4)
        hf = candidate_generator.PromptLookupCandidateGenerator(
            eos_token_id=torch.tensor([EOS]), num_output_tokens=num, max_matching_ngram_size=ngram, max_length=10_000)
        ids = torch.tensor([tokens])
        theirs = hf.get_candidates(ids)[0][0, len(tokens):].tolist()
        ours = make_policy("pld", context(), num_tokens=num, ngram_max=ngram).propose(tokens, 10_000)
        assert list(ours) == theirs, (tokens, num, ngram)
        compared += 1
        matched += bool(theirs)
    assert matched > compared / 3  # most contexts found a match: the comparison is not of empty proposals


@pytest.mark.parametrize("tokens, kwargs, proposal", [
    # the longest n-gram ending the context wins over a shorter one that occurs earlier
    ([1, 2, 9, 3, 1, 2, 5, 6, 3, 1, 2], {"ngram_max": 3, "num_tokens": 3}, [5, 6, 3]),
    # among equally long ones, the earliest occurrence; its continuation may run into the suffix
    ([4, 4, 4], {"ngram_max": 2}, [4]),
    ([1, 5, 1, 6, 1], {"ngram_max": 2}, [5, 1, 6, 1]),
    # vLLM's rule: no n-gram shorter than prompt_lookup_min, end tokens kept
    ([1, 5, 1, 6, 1], {"prompt_lookup_min": 2}, []),
    ([3, 1, EOS, 8, 3, 1], {"prompt_lookup_min": 2, "cut_at_eos": False, "num_tokens": 2}, [EOS, 8]),
    # Hugging Face's: the proposal stops short of an end token
    ([3, 1, EOS, 8, 3, 1], {}, []),
    ([3, 1, 4, EOS, 3, 1], {}, [4]),
])
def test_the_lookup_rule_on_hand_contexts(tokens, kwargs, proposal):
    assert list(make_policy("pld", context(), **kwargs).propose(tokens, 10)) == proposal


def test_ngram_takes_vllms_defaults_and_names():
    pol = make_policy("ngram", context(), prompt_lookup_max=4, prompt_lookup_min=2, num_speculative_tokens=3)
    assert (pol.ngram_min, pol.ngram_max, pol.num_tokens, pol.cut_at_eos) == (2, 4, 3, False)
    default = make_policy("ngram", context())
    assert (default.ngram_min, default.ngram_max) == (5, 5)


class Recording:
    """Wraps a lookup policy's plan and propose to keep every context it was handed, beside the
    tokens committed when the round was planned (``committed``)."""

    def __init__(self, policy):
        self.contexts, self.committed = [], []
        plan, propose = policy.plan, policy.propose

        def planned(state):
            self.committed.append(state.committed)
            return plan(state)

        def proposed(context, cap):
            self.contexts.append(list(np.asarray(context)))
            return propose(context, cap)

        policy.plan, policy.propose = planned, proposed


def test_a_lookup_never_reads_a_future_token():
    """The target's next token (7) would complete a match in the prompt (7 8 9 ...): a lookup that
    read it would propose 8 9 30 at position 1, which the target accepts. The lookup sees the prompt
    and the committed tokens only, finds nothing there, and the round is a plain target step."""
    prompt, target = [7, 8, 9, 30, 31], [40, 7, 8, 9, 30, 50]
    trace = token_trace([(prompt, target)])
    leaky = make_policy("pld", context())
    assert list(leaky.propose([*prompt, 40, 7], 9)) == [8, 9, 30, 31, 40]  # the planted token is in reach
    sim = Simulator(trace)
    policy = make_policy("pld", sim.context())
    seen = Recording(policy)
    run = SimExecutor(sim.latency, sim.topology, timeline_prompt=0).run(sim.replay, policy)
    committed = [len(c) - len(prompt) for c in seen.contexts]
    assert seen.contexts == [[*prompt, *target[:c]] for c in committed]
    assert committed[:2] == [1, 2]  # position 1 found nothing: one token, then the lookup from position 2
    lookups = [s for s in run.prompts[0].slices if s.name.startswith("lookup")]
    assert lookups[0].args == {"position": 1, "tokens": 0}
    assert_same_run(run, sim._lookup_rounds().simulate(policy))  # the compiled replay reads no further


def test_a_round_with_no_proposal_is_a_plain_target_step():
    """No token repeats: every round proposes nothing, and costs the plain step plus the lookup."""
    prompt, target = list(range(100, 140)), list(range(200, 230))
    sim = Simulator(token_trace([(prompt, target)]))
    res = sim.run("pld")
    s = res.summary
    assert (s.target_calls, s.drafted, s.draft_calls, s.num_drafts) == (len(target) - 1, 0, 0, 0)
    policy = make_policy("pld", sim.context())
    lookups = sum(policy.lookup_seconds(len(prompt) + c) for c in range(1, len(target) - 1))  # the last: cap 0
    assert lookups > 0
    assert s.wall_time_s == pytest.approx(s.ad_wall_time_s + lookups, rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_compiled_replay_is_the_protocols_on_random_traces(seed):
    trace = random_token_trace(seed)
    sim = Simulator(trace)
    rng = random.Random(seed)
    for name, params in (("pld", {}), ("ngram", {"prompt_lookup_min": rng.randint(1, 3)}),
                         ("pld", {"num_tokens": rng.randint(1, 6), "ngram_max": rng.randint(1, 4)})):
        policy = make_policy(name, sim.context(), **params)
        assert_same_run(SimExecutor(sim.latency, sim.topology).run(sim.replay, policy),
                        sim._lookup_rounds().simulate(policy))


@pytest.mark.parametrize("name", ["qwen-coder-humaneval", "qwen-coder-mtbench"])
def test_compiled_replay_is_the_protocols_on_shipped_traces(name):
    sim = Simulator(read_trace(f"traces/{name}"))
    for policy_name in ("pld", "ngram"):
        policy = make_policy(policy_name, sim.context())
        assert_same_run(SimExecutor(sim.latency, sim.topology).run(sim.replay, policy),
                        sim._lookup_rounds().simulate(policy))


def test_pld_sd_drafts_with_the_draft_model_where_the_lookup_finds_nothing():
    """No token repeats: every round falls back to γ draft tokens, so pld-sd's counts are sd's;
    where the answer copies the prompt, lookups replace draft rounds."""
    plain = Simulator(token_trace([(list(range(100, 140)), list(range(200, 240)))], draft_match=0.7))
    both, sd = plain.run("pld-sd", {"gamma": 3}).summary, plain.run("sd", {"gamma": 3}).summary
    assert (both.target_calls, both.accepted, both.drafted, both.draft_calls) == \
        (sd.target_calls, sd.accepted, sd.drafted, sd.draft_calls)
    assert both.wall_time_s > sd.wall_time_s  # the lookups that found nothing were paid
    prompt = list(range(100, 140))
    copying = Simulator(token_trace([(prompt, [*prompt[5:25], *range(300, 320)])], draft_match=0.7))
    both, sd = copying.run("pld-sd", {"gamma": 3}).summary, copying.run("sd", {"gamma": 3}).summary
    assert both.draft_calls < sd.draft_calls and both.target_calls < sd.target_calls


def test_lookup_policies_refuse_a_trace_without_prompt_tokens():
    from simlab.common.errors import SimlabError

    sim = Simulator(read_trace("traces/synthetic-iid"))
    with pytest.raises(SimlabError, match="prompt token ids"):
        sim.run("pld")


def test_ngram_min_above_max_is_refused():
    from simlab.common.errors import SimlabError

    with pytest.raises(SimlabError, match="ngram_min"):
        make_policy("pld", context(), ngram_min=3, ngram_max=2)


def test_plan_is_a_lookup_of_num_tokens():
    pol = make_policy("pld-sd", context(), num_tokens=4, gamma=2)
    plan = pol.plan(RoundState(1, 10, 0, 20))
    assert plan.max_draft == 4 and plan.fallback.max_draft == 2


def test_suffix_tree_counts_every_substring_up_to_its_depth():
    from simlab.policies.suffix_tree import SuffixTree

    rng = random.Random(5)
    for _ in range(30):
        depth = rng.randint(1, 6)
        seqs = [random_tokens(rng, rng.randint(1, 40), rng.choice([2, 4, 9])) for _ in range(rng.randint(1, 3))]
        tree = SuffixTree(depth)
        for i, s in enumerate(seqs):
            cut = rng.randint(0, len(s))
            tree.extend(i, s[:cut])  # in two pieces: appending is token by token
            tree.extend(i, s[cut:])
        counts = {}
        for s in seqs:
            for a in range(len(s)):
                for b in range(a + 1, min(len(s), a + depth) + 1):
                    counts[tuple(s[a:b])] = counts.get(tuple(s[a:b]), 0) + 1

        def walk(node, prefix):
            for token, child in node[1].items():
                yield (*prefix, token), child
                yield from walk(child, (*prefix, token))

        nodes = dict(walk(tree.root, ()))
        assert {k: v[0] for k, v in nodes.items()} == counts
        for node in nodes.values():  # the order of a node's children is by decreasing count
            assert [node[1][t][0] for t in node[2]] == sorted((node[1][t][0] for t in node[2]), reverse=True)
            assert sorted(node[2]) == sorted(node[1])


def test_suffix_speculates_the_most_frequent_continuation():
    """Context ...1 2: the trees saw '1 2 3 4' twice and '1 2 5' once. Matching '2' and '1 2', the
    path 3 4 (probabilities 2/3, 2/3) scores 4/3; a spec factor of 1 lets a one-token match propose
    one token, so the two-token match wins."""
    from simlab.policies.suffix_tree import SuffixTree

    tree = SuffixTree(8)
    tree.extend(0, [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 5, 7])
    draft, score = tree.speculate([6, 1, 2], 5, 1.0, 0.1)
    assert draft == [3, 4] and score == pytest.approx(4 / 3, rel=1e-6)
    assert tree.speculate([6, 1, 2], 5, 1.0, 0.7) == ([], 0.0)  # 2/3 < 0.7 stops it at once
    assert tree.speculate([6, 1, 2], 1, 1.0, 0.1)[0] == [3]


def test_suffix_cache_carries_responses_across_prompts():
    """The second prompt's answer repeats the first's: only the global cache can propose it."""
    answer = list(range(300, 330))
    trace = token_trace([(list(range(100, 110)), answer), (list(range(400, 410)), answer)])
    sim = Simulator(trace)
    with_cache = sim.run("suffix").per_prompt.set_index("prompt_id")
    without = sim.run("suffix", {"global_cache": False}).per_prompt.set_index("prompt_id")
    assert with_cache.loc[0, "target_calls"] == without.loc[0, "target_calls"] == len(answer) - 1
    assert with_cache.loc[1, "target_calls"] < len(answer) / 3


@pytest.mark.parametrize("name", ["pld", "ngram", "pld-sd", "suffix", "rest"])
def test_every_lookup_sees_the_prompt_and_the_committed_tokens_only(name, tmp_path):
    from simlab.common.datastore import Datastore, fingerprint

    trace = random_token_trace(11)
    sim = Simulator(trace)
    params = {}
    if name == "rest":
        store = tmp_path / "d.npz"
        rng = random.Random(1)  # other answers, of the same small vocabulary
        Datastore.build([random_tokens(rng, 60, 8) for _ in range(3)], [fingerprint([9_999])] * 3).save(store)
        params = {"datastore": str(store)}
    policy = make_policy(name, sim.context(), **params)
    seen = Recording(policy)
    prompt_of = {}  # a prompt's rounds, told apart by the reset before them
    reset = policy.reset

    def resetting(prompt):
        prompt_of[len(seen.committed)] = prompt.prompt_id
        reset(prompt)

    policy.reset = resetting
    SimExecutor(sim.latency, sim.topology).run(sim.replay, policy)
    rounds = sorted(prompt_of)
    replays = {rp.prompt_id: rp for rp in sim.replay.prompts}
    lookups = 0
    for i, committed in enumerate(seen.committed):
        rp = replays[prompt_of[max(r for r in rounds if r <= i)]]
        whole = [*list(rp.prompt_tokens), *rp.target_tokens]
        if committed < rp.budget - 1:  # a lookup ran (a cap of 0 runs none)
            assert seen.contexts[lookups] == whole[:rp.prompt_len + committed]
            lookups += 1
    assert lookups == len(seen.contexts) > 0


def test_rest_retrieves_from_other_prompts_answers_never_its_own(tmp_path):
    from simlab.common.datastore import Datastore, fingerprint

    shared = list(range(300, 320))
    prompts = [(list(range(100, 110)), [*shared, 50]), (list(range(200, 210)), [*shared, 60])]
    trace = token_trace(prompts)
    sim = Simulator(trace)
    own = tmp_path / "own.npz"  # each prompt's own answer only
    Datastore.build([prompts[0][1]], [fingerprint(prompts[0][0])]).save(own)
    other = tmp_path / "other.npz"  # the first prompt's answer, keyed to it: the second prompt may use it
    Datastore.build([prompts[0][1]], [fingerprint(prompts[0][0])]).save(other)
    first, second = sim.run("rest", {"datastore": str(own)}).per_prompt["target_calls"].tolist()
    assert first == len(prompts[0][1]) - 1  # its own answer is never retrieved
    assert second < len(prompts[1][1]) / 3  # the other prompt's answer is
    assert sim.run("rest", {"datastore": str(other), "min_suffix": 1}).summary.accepted >= len(shared) - 4


def test_datastore_finds_every_occurrence():
    from simlab.common.datastore import Datastore

    rng = random.Random(2)
    seqs = [random_tokens(rng, rng.randint(1, 50), 4) for _ in range(5)]
    store = Datastore.build(seqs, ["k"] * len(seqs))
    flat = store.tokens.tolist()
    for _ in range(200):
        m = rng.randint(1, 5)
        pattern = [rng.randrange(4) for _ in range(m)]
        expected = sorted(i for i in range(len(flat) - m + 1) if flat[i:i + m] == pattern)
        assert sorted(store.occurrences(pattern).tolist()) == expected


def test_rest_searches_by_default_the_longest_suffix_the_datastore_indexes():
    """rest.MAX_SUFFIX stands for datastore.KEY so that declaring the policy imports no numpy."""
    from simlab.common.datastore import KEY
    from simlab.policies.rest import MAX_SUFFIX, Rest

    assert MAX_SUFFIX == KEY
    assert {p.name: p.default for p in Rest.params}["max_suffix"] == KEY


def test_rest_without_a_datastore_says_how_to_build_one():
    from simlab.common.errors import SimlabError

    with pytest.raises(SimlabError, match="simlab datastore build"):
        make_policy("rest", context())

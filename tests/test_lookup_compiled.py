"""The compiled replay of pld-sd, suffix and rest (simlab/sim/lookup_rounds.py, suffix_rounds.py,
rest_rounds.py) against the round protocol, bit for bit; and what its lookups may read (never a
future token)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from simlab.common.datastore import Datastore, fingerprint
from simlab.policies import make_policy
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace
from tests.helpers import assert_same_run
from tests.test_lookup import random_token_trace, random_tokens, token_trace


def datastore(path, sim: Simulator, rng: random.Random | None = None) -> str:
    """REST's datastore of the trace's own answers, each keyed by its prompt (never retrieved
    there) or, with ``rng``, by some other prompt (retrieved: long matches), and, with ``rng``, a
    few other answers of the same small vocabularies."""
    prompts = sim.replay.prompts
    seqs = [rp.target_tokens for rp in prompts]
    keys = [fingerprint(rp.prompt_tokens if rng is None or rng.random() < 0.5 else [2 * 10 ** 6 + j])
            for j, rp in enumerate(prompts)]
    if rng is not None:
        extra = [random_tokens(rng, rng.randint(1, 60), rng.choice([3, 8, 30])) for _ in range(rng.randint(0, 3))]
        seqs, keys = [*seqs, *extra], [*keys, *[fingerprint([10 ** 6 + i]) for i in range(len(extra))]]
    Datastore.build(seqs, keys).save(path)
    return str(path)


def random_params(name: str, rng: random.Random, path) -> dict:
    if name == "pld-sd":
        return {"gamma": rng.randint(1, 5), "num_tokens": rng.randint(1, 8), "ngram_max": rng.randint(1, 3)}
    if name == "suffix":
        return {"num_tokens": rng.randint(1, 12), "max_tree_depth": rng.randint(1, 8),
                "max_spec_factor": rng.choice([0.5, 1.0, 2.0, 3.5]), "min_token_prob": rng.choice([0.0, 0.1, 0.3, 0.7]),
                "global_cache": rng.random() < 0.7}
    low = rng.randint(1, 3)
    return {"datastore": path, "num_tokens": rng.randint(1, 12), "min_suffix": low, "max_suffix": rng.randint(low, 16),
            "max_matches": rng.choice([1, 2, 5000])}


def same_as_the_protocol(sim: Simulator, name: str, params: dict) -> None:
    protocol = SimExecutor(sim.latency, sim.topology).run(sim.replay, make_policy(name, sim.context(), **params))
    policy = make_policy(name, sim.context(), **params)
    rounds = sim._lookup_rounds()
    assert rounds.replays(policy)
    assert_same_run(protocol, rounds.simulate(policy))


@pytest.mark.parametrize("seed", range(40))
def test_compiled_replay_is_the_protocols_on_random_traces(seed, tmp_path):
    sim = Simulator(random_token_trace(seed))
    rng = random.Random(seed)
    path = datastore(tmp_path / "d.npz", sim, rng)
    for name in ("pld-sd", "suffix", "rest"):
        for _ in range(2):
            same_as_the_protocol(sim, name, random_params(name, rng, path))


@pytest.mark.parametrize("name", ["qwen-coder-humaneval", "qwen-coder-mtbench"])
def test_compiled_replay_is_the_protocols_on_shipped_traces(name, tmp_path):
    sim = Simulator(read_trace(f"traces/{name}"))
    other = Simulator(read_trace("traces/qwen-coder-edit"))
    answers = [(rp.prompt_tokens, rp.target_tokens) for s in (sim, other) for rp in s.replay.prompts]
    Datastore.of_outputs(answers).save(tmp_path / "d.npz")
    for policy, params in (("pld-sd", {}), ("suffix", {}), ("rest", {"datastore": str(tmp_path / "d.npz")})):
        same_as_the_protocol(sim, policy, params)


def first_rounds(trace, name: str, **params) -> list[tuple[int, ...]]:
    """The compiled replay's first two rounds of the first prompt: (committed, proposed,
    accepted, drafted by the draft model, fed)."""
    sim = Simulator(trace)
    rounds = sim._lookup_rounds()._rounds(make_policy(name, sim.context(), **params))
    return [tuple(r) for r in rounds[0][:2].tolist()]


def test_no_compiled_lookup_reads_a_future_token(tmp_path):
    """The target's next token (7) completes a match of the context ending at position 1: a lookup
    that read it would propose 8 9 ... there, which the target accepts. Each compiled lookup,
    reading the prompt and the committed tokens only, finds nothing at position 1 (pld-sd: the
    draft model drafts instead) and finds 8 9 ... from position 2, once 7 is committed."""
    prompt, target = [7, 8, 9, 30, 31], [40, 7, 8, 9, 30, 50]
    trace = token_trace([(prompt, target)])
    assert first_rounds(trace, "pld-sd", gamma=2) == [(1, 2, 0, 1, 1), (2, 3, 3, 0, 0)]  # cap: the budget (6)
    assert first_rounds(trace, "suffix", max_spec_factor=3) == [(1, 0, 0, 0, 0), (2, 3, 3, 0, 0)]
    store = tmp_path / "d.npz"  # 40 7 8 9: only a context ending 40 7 retrieves it (min_suffix 2)
    Datastore.build([[40, 7, 8, 9]], [fingerprint([1])]).save(store)
    trace = token_trace([([5, 6], [40, 7, 8, 9, 50])])
    assert first_rounds(trace, "rest", datastore=str(store)) == [(1, 0, 0, 0, 0), (2, 2, 2, 0, 0)]


def test_the_protocol_runs_what_the_compiled_replay_does_not():
    """A timeline asks for the protocol; a policy with an engine's own end of a request too."""
    sim = Simulator(random_token_trace(3))
    policy = make_policy("suffix", sim.context())
    assert sim._lookup_rounds().replays(policy)
    policy.past_end = 2
    assert not sim._lookup_rounds().replays(policy)
    assert not sim._lookup_rounds().replays(make_policy("sd", sim.context()))
    timeline = sim.run("suffix", timeline_prompt=0)
    assert timeline.timeline and timeline.summary.to_dict() == sim.run("suffix").summary.to_dict()


def test_suffix_trees_grow_without_changing_a_proposal():
    """A tree sized for 8 tokens grows (and rehashes) to take 200; walked from the root at every
    length (none of the context's suffixes taken from its last ones), it speculates as the policy's."""
    from simlab.policies.suffix_tree import SuffixTree
    from simlab.sim import suffix_rounds

    tree = suffix_rounds.Tree(4, 8)
    rng = random.Random(0)
    tokens = np.asarray(random_tokens(rng, 200, 5), dtype=np.int64)
    for t in tokens[:8].tolist():
        suffix_rounds.extend(*tree.arrays(), 4, t)
    tree.room(192)
    assert len(tree.nodes) >= int(tree.meta[0]) + 4 * 192 > 1 + 4 * 8  # grown
    for t in tokens[8:].tolist():
        suffix_rounds.extend(*tree.arrays(), 4, t)
    reference = SuffixTree(4)
    reference.extend(0, tokens.tolist())
    draft, best = np.zeros(6, dtype=np.int64), np.zeros(6, dtype=np.int64)
    for n in range(2, 200, 7):
        context = tokens[:n]
        ours = suffix_rounds.speculate(*tree.arrays()[:2], np.array([0, 0]), tree.active, context, n, 4, 6,
                                       np.float32(1.0), np.float32(0.1), draft, best)
        theirs, score = reference.speculate(context[-4:].tolist(), 6, 1.0, 0.1)
        assert (best[:ours[0]].tolist(), ours[1]) == (theirs, score)


def test_rest_ranges_follow_the_context_as_it_grows():
    """REST's compiled suffix-array ranges, brought from one context to the next (one to nine tokens
    on, as rounds commit), are the datastore's occurrences of every suffix up to the longest that
    occurs, and that longest is the one returned."""
    from simlab.sim import rest_rounds

    rng = random.Random(2)
    sequences = [random_tokens(rng, rng.randint(5, 90), 4) for _ in range(8)]
    store = Datastore.build(sequences, [fingerprint([j]) for j in range(len(sequences))])
    context = np.asarray(random_tokens(rng, 600, 4), dtype=np.int64)
    ranges = np.empty((17, 2), dtype=np.int64)
    seen = top = 0
    n = 1
    while n < len(context):
        top = rest_rounds._ranges(store.tokens, store.order, context, n, seen, min(16, n, top + n - seen), ranges)
        occurring = [m for m in range(1, min(16, n) + 1) if len(store.occurrences(context[n - m:n]))]
        assert top == max(occurring, default=0)
        for m in occurring:
            assert store.order[ranges[m, 0]:ranges[m, 1]].tolist() == store.occurrences(context[n - m:n]).tolist()
        seen, n = n, n + rng.randint(1, 9)


@pytest.mark.parametrize("name", ["ngram", "suffix", "rest"])
def test_a_looked_up_end_token_is_the_targets_in_the_compiled_replay_too(name, tmp_path):
    """The prompt holds the answer and its end token, so the first lookup proposes the end token
    where the target's path ends: the compiled replay, as the protocol, keeps only the tokens
    before it (the end token is the target's own)."""
    from tests.test_lookup import EOS

    sim = Simulator(token_trace([([5, 1, 2, 3, EOS, EOS, 5, 1], [2, 3, EOS])], budget=8))
    params = {"ngram": {"prompt_lookup_min": 2, "prompt_lookup_max": 2, "num_tokens": 4},
              "suffix": {"num_tokens": 4, "min_token_prob": 0.0},
              "rest": {"datastore": datastore(tmp_path / "d.npz", sim), "num_tokens": 4}}[name]
    same_as_the_protocol(sim, name, params)

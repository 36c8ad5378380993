"""Tree rounds: a chain is a width-one tree, hand-checked static and EAGLE-2 trees, the
acceptance-guided tree's stopping rule, and bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.common.locations import TRACES
from simlab.policies import REGISTRY, PolicyContext, make_policy
from simlab.policies.base import Policy, PromptInfo, RoundState, TreePlan
from simlab.policies.rounds import ExpandTree, PolicyError, VerifyTree, decode
from simlab.policies.trees import Eagle2
from simlab.sim.executor import SimExecutor
from simlab.sim.run import Simulator
from simlab.sim.trees import TreeRounds
from simlab.trace.checksums import rehash
from simlab.trace.io import read_trace
from simlab.trees.candidates import Candidates
from simlab.trees.draft_tree import ROOT, DraftTree
from tests.helpers import hand_trace, latency_table

SMOLLM2 = TRACES / "smollm2-selfspec"
FILLER = 60_000  # token ids of candidates that are not the target's


def tree_trace(ranks: list[list[int]], k: int = 4, latency=None, expansion=None, depth: int = 0, **hand):
    """A hand trace whose target token at position t is the draft's ``ranks[p][t]``-th candidate
    (-1: none of the top-k); ``expansion(pos) -> [(parent, rank, prob, on_path)]`` adds EAGLE-2
    trees of top-k ``k`` and ``depth`` levels (on-path nodes carry the target's tokens); ``hand``
    goes to :func:`hand_trace`."""
    trace = hand_trace(["".join("1" if r == 0 else "0" for r in rs) for rs in ranks], latency=latency, **hand)
    pos = trace.positions
    rows = []
    for row, r in zip(pos.itertuples(), [r for rs in ranks for r in rs]):
        for j in range(k):
            token = row.target_token if j == r else FILLER + 10 * row.pos + j
            rows.append((row.prompt_id, row.pos, j, token, 0.5 / (j + 1)))
    trace.topk = pd.DataFrame(rows, columns=["prompt_id", "pos", "rank", "token", "prob"])
    trace.manifest.topk = k
    if expansion is not None:
        tree_rows = []
        for row in pos.itertuples():
            nodes = expansion(row.pos)
            depths = []
            for node, (parent, rank, prob, on_path) in enumerate(nodes):
                depths.append(1 if parent < 0 else depths[parent] + 1)
                t = row.pos + depths[-1] - 1
                target = int(row.target_token) + depths[-1] - 1  # hand_trace's tokens count up by one
                token = target if on_path and t < len(ranks[row.prompt_id]) else FILLER + node
                tree_rows.append((row.prompt_id, row.pos, node, parent, rank, token, prob))
        trace.tree = pd.DataFrame(tree_rows, columns=["prompt_id", "pos", "node", "parent", "rank", "token", "prob"])
        trace.manifest.tree_depth = depth
    return trace


COUNTS = ("target_calls", "draft_calls", "drafted", "accepted", "tokens", "wall_time_s", "ad_wall_time_s",
          "num_drafts", "acceptance_per_position", "draft_busy", "target_busy", "speedup")


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_sd_through_a_width_one_tree_gives_todays_numbers_exactly(gamma):
    sim = Simulator(read_trace(SMOLLM2))
    chain = sim.run("sd", {"gamma": gamma}, keep_tokens=True)  # keep_tokens: the round-by-round executor
    tree = sim.run("tree-static", {"shape": "x".join(["1"] * gamma)}, keep_tokens=True)
    for key in COUNTS:
        assert getattr(tree.summary, key) == getattr(chain.summary, key), key
    assert tree.tokens == chain.tokens
    assert tree.per_prompt.equals(chain.per_prompt)


def test_a_width_one_tree_stops_at_the_budget_like_a_chain():
    trace = hand_trace(["1111101", "1011111111"], stop="eos", max_new_tokens=12)
    sim = Simulator(trace)
    chain, tree = sim.run("sd", {"gamma": 4}, keep_tokens=True), sim.run("tree-static", {"shape": "1x1x1x1"},
                                                                          keep_tokens=True)
    for key in COUNTS:
        assert getattr(tree.summary, key) == getattr(chain.summary, key), key


def test_a_static_tree_by_hand():
    # One prompt of 5 positions (position 0 is the prefill's); the target's token is the draft's
    # candidate of rank 1, 0, 3, 0 at positions 1..4. Shape 2x1: the root's ranks 0 and 1, each
    # with its greedy child (4 nodes, depth 2).
    # Round 1 from position 1: rank 1 (node 1), then rank 0 under it (node 3): 2 accepted, 3 emitted.
    # Round 2 from position 4, the last: budget - committed - 1 = 0 levels, a plain target step.
    verify = {1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5, 5: 3.0}
    trace = tree_trace([[0, 1, 0, 3, 0]], k=4, latency=latency_table(draft=0.1, verify=verify))
    res = Simulator(trace, topology="two-devices").run("tree-static", {"shape": "2x1"}, with_cost=False)
    s = res.summary
    assert (s.target_calls, s.accepted, s.drafted, s.draft_calls) == (2, 2, 4, 2)
    # draft: level 1 over the root (0.1 s), level 2 over 2 nodes: 0.1 x verify(2)/verify(1) = 0.15 s;
    # verify 4 nodes + root: 3.0 s; then a 1-token target step: 1.0 s
    assert s.wall_time_s == pytest.approx(0.1 + 0.15 + 3.0 + 1.0)
    assert s.ad_wall_time_s == pytest.approx(4 * 1.0)


def test_probed_tree_forwards_move_a_tree_round_by_exactly_what_they_cost_more():
    # test_a_static_tree_by_hand's trace, on a table whose tree forwards were probed: the
    # 5-token verification 4.5 s (the chain: 3.0 s), the 1-token one of the last round 1.2 s
    # (1.0 s), the draft's 2-node level 3 draft steps (the chain stand-in: 1.5/1.0 = 1.5 steps).
    # The run moves by 0.1 x (3 - 1.5) + 1.5 + 0.2 = 1.85 s: 0.1 + 0.3 + 4.5 + 1.2 = 6.1 s against 4.25.
    verify = {1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5, 5: 3.0}
    chain = tree_trace([[0, 1, 0, 3, 0]], k=4, latency=latency_table(draft=0.1, verify=verify))
    probed = tree_trace([[0, 1, 0, 3, 0]], k=4, latency=latency_table(draft=0.1, verify=verify, tree={1: 1.2, 5: 4.5},
                                                                      expand={2: 0.3}))
    runs = {}
    for name, trace in (("chain", chain), ("probed", probed)):
        sim = Simulator(trace, topology="two-devices")
        closed = sim.run("tree-static", {"shape": "2x1"}, with_cost=False).summary
        protocol = sim.run("tree-static", {"shape": "2x1"}, with_cost=False, keep_tokens=True).summary
        assert closed.wall_time_s == protocol.wall_time_s  # the closed form prices as the executor does
        runs[name] = closed
    assert runs["chain"].wall_time_s == pytest.approx(4.25)
    assert runs["probed"].wall_time_s - runs["chain"].wall_time_s == pytest.approx(1.85, rel=1e-12)
    assert runs["probed"].wall_time_s == pytest.approx(6.1, rel=1e-12)
    assert runs["probed"].ad_wall_time_s == runs["chain"].ad_wall_time_s == pytest.approx(4.0)  # no tree in AD
    assert (runs["probed"].target_calls, runs["probed"].accepted) == (runs["chain"].target_calls, 2)


def test_ags_tree_prices_its_threshold_with_the_probed_tree_verification():
    # eq. 12's T_v is the verification the tree will get: with tree forwards probed at 2x the
    # chain, h = 1 - T_d / T_v = 1 - 0.1 / 2.6 (the chain's: 1 - 0.1 / 1.3)
    chain = {k: 1.0 + 0.1 * k for k in range(1, 12)}
    trace = tree_trace([[0] * 12], k=2, expansion=eagle_example, depth=3,
                       latency=latency_table(draft=0.1, verify=chain, tree={k: 2 * s for k, s in chain.items()}))
    policy = REGISTRY["ags-tree"](Simulator(trace, topology="two-devices").context(), max_draft=3)
    policy.plan(RoundState(1, 10, 0, 11))
    assert policy.threshold(2) == pytest.approx(1 - 0.1 / 2.6)


def test_a_static_tree_accepts_a_second_candidate_that_a_chain_cannot():
    trace = tree_trace([[0, 1, 1, 1, 1, 1, 1]], k=2)
    sim = Simulator(trace)
    assert sim.run("tree-static", {"shape": "1x1"}, with_cost=False).summary.accepted == 0
    assert sim.run("tree-static", {"shape": "2x2"}, with_cost=False).summary.accepted == 4  # 2 per round


# K = 2, three levels, probabilities exact in binary. Values (path products):
# level 1: n0 .5, n1 .375; level 2 expands both: n2 .25, n3 .125 (under n0), n4 .28125, n5 .046875
# (under n1); level 3 expands the two best of level 2, n4 then n2: n6 .140625, n7 .0703125 (under
# n4), n8 .1875, n9 .03125 (under n2). By value: n0 n1 n4 n2 n8 n6 n3 n7 n5 n9.
EAGLE = [(-1, 0, .5), (-1, 1, .375), (0, 0, .5), (0, 1, .25), (1, 0, .75), (1, 1, .125),
         (4, 0, .5), (4, 1, .25), (2, 0, .75), (2, 1, .125)]


def eagle_example(pos):
    """The tree above at every position; the target's path is n1 -> n4 -> n6."""
    on = {1, 4, 6}
    spec = EAGLE
    return [(p, r, prob, i in on) for i, (p, r, prob) in enumerate(spec)]


def eagle_trace():
    return tree_trace([[0] * 12], k=2, expansion=eagle_example, depth=3,
                      latency=latency_table(draft=0.1, verify={k: 1.0 + 0.1 * k for k in range(1, 12)}))


def test_eagle2_grows_by_value_and_verifies_the_top_n():
    c = Candidates()
    c.add_level(EAGLE[:2])
    policy = REGISTRY["eagle2"](PolicyContext(latency=None, tree_topk=2, tree_depth=3), depth=3, nodes=5)
    assert list(policy.grow(c)) == [0, 1]
    c.add_level(EAGLE[2:6])
    assert list(policy.grow(c)) == [4, 2]  # values .28125 and .25 beat .125 and .046875
    c.add_level([(4, 0, .5), (4, 1, .25), (2, 0, .75), (2, 1, .125)])
    chosen = policy.select(c)  # .5, .375, .28125, .25, then n8's .1875
    assert sorted(chosen) == [0, 1, 2, 4, 8]
    assert c.tree(chosen) == DraftTree((-1, -1, 0, 1, 2), (0, 1, 0, 0, 0))


@pytest.mark.parametrize("nodes, rounds, draft_calls, drafted", [
    # n1 -> n4 verified, n6 not: 2 accepted a round from positions 1, 4, 7; from 10 only 1 level fits
    # (budget 12 - 10 - 1), where n1 is accepted: 4 rounds, 3 + 3 + 3 + 1 forwards, 5 + 5 + 5 + 2 nodes
    (5, [2, 2, 2, 1], 10, 17),
    # n6 too: 3 a round from 1, 5; from 9, 2 levels fit (6 candidates, all verified): n1 -> n4
    (6, [3, 3, 2], 8, 18),
    # n0 and n1 only: 1 a round from 1, 3, 5, 7 (3 levels) and 9 (2 levels fit); at 11 none fits:
    # a plain target step
    (2, [1, 1, 1, 1, 1, 0], 14, 10),
])
def test_eagle2_replays_the_recorded_tree(nodes, rounds, draft_calls, drafted):
    res = Simulator(eagle_trace(), topology="two-devices").run("eagle2", {"depth": 3, "nodes": nodes}, with_cost=False)
    s = res.summary
    hist = res.positions.accepted_hist
    assert sorted(k for k, v in hist.items() for _ in range(v)) == sorted(rounds)
    assert (s.target_calls, s.accepted, s.draft_calls, s.drafted) == (len(rounds), sum(rounds), draft_calls, drafted)


def test_ags_tree_stops_a_branch_when_p_rej_reaches_h():
    policy = REGISTRY["ags-tree"](PolicyContext(latency=None, tree_topk=2, tree_depth=3), rejection_threshold=0.5,
                                  max_draft=3)
    c = Candidates()
    c.add_level([(-1, 0, 0.5), (-1, 1, 0.25)])  # P_rej 0.5 (= h: stops), 0.75
    assert list(policy.grow(c)) == []
    c = Candidates()
    c.add_level([(-1, 0, 0.5 + 2 ** -20), (-1, 1, 0.25)])  # P_rej just below h: this branch grows
    assert list(policy.grow(c)) == [0]


def test_ags_tree_h_from_the_latency_model():
    # T_v = verify of min(n, candidates) + 1 tokens, T_d = one draft forward over the root: h = 1 - T_d/T_v
    trace = eagle_trace()
    sim = Simulator(trace, topology="two-devices")
    policy = REGISTRY["ags-tree"](sim.context(), max_draft=3)
    policy.plan(RoundState(1, 10, 0, 11))
    assert policy.threshold(2) == pytest.approx(1 - 0.1 / 1.3)


class Dangling(Policy):
    name, summary, paper = "test-dangling", "", ""

    def plan(self, state):
        return TreePlan(DraftTree((-1, 3), (0, 0)))


class OrphanSelect(Policy):
    name, summary, paper = "test-orphan", "", ""

    def plan(self, state):
        return TreePlan(None, topk=2, max_depth=2)

    def grow(self, candidates):
        return candidates.levels[-1]

    def select(self, candidates):
        return [2]  # a depth-2 candidate without its parent


@pytest.mark.parametrize("policy", [Dangling, OrphanSelect])
def test_malformed_trees_are_policy_errors_naming_the_policy(policy):
    from simlab.sim.executor import SimExecutor
    from simlab.trace.replay import TraceReplay

    trace = eagle_trace()
    sim = Simulator(trace)
    with pytest.raises(PolicyError, match=policy.name):
        SimExecutor(sim.latency).run(TraceReplay(trace), policy(sim.context()))


@pytest.mark.parametrize("policy, params, words", [
    ("tree-static", {"shape": "4,0"}, "at least 1"),
    ("tree-static", {"shape": "2x2"}, "--topk K"),
    ("eagle2", {}, "--topk K --tree-depth D"),
    ("ags-tree", {}, "--topk K --tree-depth D"),
    ("tree-static", {"nodes": 0}, "nodes must be an integer >= 1"),
])
def test_bad_tree_parameters_and_traces_fail_in_one_line(policy, params, words):
    sim = Simulator(hand_trace(["10110"]))
    with pytest.raises(SimlabError, match=words) as err:
        sim.run(policy, params)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("params, words", [({"top_k": 3}, "top_k 3"), ({"depth": 4}, "depth 4")])
def test_eagle2_shapes_the_recording_cannot_replay_fail_before_running(params, words):
    with pytest.raises(SimlabError, match=words):
        Simulator(eagle_trace()).run("eagle2", params)


@pytest.mark.parametrize("policy", ["tree-static", "eagle2", "ags-tree"])
def test_tree_policies_refuse_sampled_traces(policy):
    trace = tree_trace([[0, 1, 0]], k=2)
    trace.manifest.temperature = 1.0
    with pytest.raises(SimlabError, match=f"^policy '{policy}' replays greedy verification only; this trace was "
                                          r"recorded at temperature 1 \(record with --temperature 0\)$"):
        Simulator(trace).run(policy, {"shape": "2"} if policy == "tree-static" else {})


def test_sequoia_shape_from_the_trace_positional_acceptance():
    # ranks: 0 at 6 positions of 8, 1 at 2: accept = [.75, .25]; with 2 nodes, depth 2 the best tree
    # is a chain of two greedy nodes (.75 + .75^2 = 1.31) over two siblings (.75 + .25 = 1.0)
    trace = tree_trace([[0, 0, 1, 0, 0, 1, 0, 0]], k=2)
    policy = REGISTRY["tree-static"](Simulator(trace).context(), nodes=2, depth=2)
    assert policy.tree == DraftTree((-1, 0), (0, 0))


@pytest.mark.parametrize("policy, params", [("tree-static", {"shape": "2x2x1"}), ("tree-static", {}),
                                            ("eagle2", {"depth": 3}), ("ags-tree", {"max_draft": 3})])
def test_tree_policies_emit_exactly_the_target_tokens(policy, params):
    trace = tree_trace([[0, 1, 0, 3, -1, 0, 2, 0, 0, 1, 0, -1]], k=4 if policy == "tree-static" else 2,
                       expansion=eagle_example if policy != "tree-static" else None, depth=3)
    if policy == "tree-static":
        trace.manifest.tree_depth = 0
    res = Simulator(trace).run(policy, params, keep_tokens=True, with_cost=False)
    assert res.tokens[0] == trace.positions.sort_values("pos").target_token.tolist()[1:]
    assert res.summary.tokens == 11


def test_tree_tables_round_trip_and_are_checked_on_load(tmp_path):
    from simlab.trace.io import write_trace

    path = write_trace(eagle_trace(), tmp_path / "t")
    back = read_trace(path)
    assert back.manifest.topk == 2 and back.manifest.tree_depth == 3 and len(back.tree) == 12 * 10
    assert Simulator(back).run("eagle2", {"depth": 3}).summary.accepted > 0
    (path / "tree.parquet").unlink()
    with pytest.raises(SimlabError, match="tree.parquet"):  # gone from the files the manifest lists
        read_trace(path)
    rehash(path)  # the manifest vouches for the tables left: what is checked next is the tree's absence
    with pytest.raises(SimlabError, match="tree.parquet is missing.*--tree-depth"):
        read_trace(path)


def test_a_tree_whose_node_precedes_its_parent_is_refused(tmp_path):
    from simlab.trace.io import write_trace

    trace = eagle_trace()
    trace.tree.loc[trace.tree.index[2], "parent"] = 5  # node 2 of position 0 under node 5
    with pytest.raises(SimlabError, match="each after its parent"):
        read_trace(write_trace(trace, tmp_path / "t"))


def test_old_traces_load_without_tree_data():
    trace = read_trace(SMOLLM2)
    assert trace.topk is None and trace.tree is None and trace.manifest.topk == 0


# -- tree policies in closed form (simlab.sim.trees) against the round protocol ------------------


def synthetic_tree_trace(seed: int, k: int = 3, depth: int = 4, lengths=(40, 23, 31), budget: int = 45):
    """Random EAGLE-2 recordings: each position's tree grown as the recorder grows it (the top-k
    of each level by value expanded), with probabilities from a few powers of two so that values
    often tie (within a level and across levels: a probability of 1 repeats its parent's value),
    nodes numbered in a random order within each level, and a random target path through it
    (cut anywhere); the target's rank among the top-k (for fixed trees) is random too. The
    prompts stop at an end token before a budget of ``budget`` new tokens, so rounds near the
    end draft fewer levels. Latencies grow with tokens and context."""
    rng = np.random.default_rng(seed)
    verify = {j: 0.0517 + 0.0031 * j ** 1.1 for j in range(1, 80)}
    ranks = [rng.choice([-1, 0, 0, 0, 1, 2], n).tolist() for n in lengths]
    trace = tree_trace(ranks, k=k, stop="eos", max_new_tokens=budget,
                       latency=latency_table(draft=0.0123, verify=verify, slope=3.7e-6))
    rows = []
    for row in trace.positions.itertuples():
        c = Candidates()

        def level(parents):
            return [(e, r, float(p)) for e in parents
                    for r, p in enumerate(sorted(rng.choice([1.0, .5, .5, .25, .125, .0625], k), reverse=True))]

        c.add_level(level([-1]))
        for _ in range(depth - 1):
            c.add_level(level(c.best(c.levels[-1], k)))
        name = np.concatenate([lv.start + rng.permutation(len(lv)) for lv in c.levels])  # candidate -> node
        path, at = set(), -1
        for d in range(depth):
            kids = [i for i in c.levels[d] if c.parents[i] == at]
            if not kids or rng.random() < 0.2:
                break
            at = int(rng.choice(kids))
            path.add(at)
        for i in np.argsort(name):
            t = row.pos + c.depths[i] - 1
            token = row.target_token + c.depths[i] - 1 if i in path and t < lengths[row.prompt_id] else FILLER + i
            parent = -1 if c.parents[i] < 0 else int(name[c.parents[i]])
            rows.append((row.prompt_id, row.pos, int(name[i]), parent, c.ranks[i], token, c.probs[i]))
    trace.tree = pd.DataFrame(rows, columns=["prompt_id", "pos", "node", "parent", "rank", "token", "prob"])
    trace.manifest.tree_depth = depth
    return trace


def assert_closed_form_is_the_protocol(sim: Simulator, policy: str, params: dict) -> bool:
    """The closed form's report equals the round protocol's, number for number, or both refuse
    the trace alike; returns whether the closed form answered."""
    try:
        protocol = SimExecutor(sim.latency, sim.topology).run(sim.replay, make_policy(policy, sim.context(), **params))
    except SimlabError as error:
        assert TreeRounds(sim.replay, sim.latency).simulate(make_policy(policy, sim.context(), **params)) is None
        with pytest.raises(SimlabError, match=str(error)[:40]):
            sim.run(policy, params)
        return False
    closed = TreeRounds(sim.replay, sim.latency).simulate(make_policy(policy, sim.context(), **params))
    assert closed is not None, (policy, params)
    assert [r.counts for r in closed.prompts] == [r.counts for r in protocol.prompts], (policy, params)
    assert [r.prompt_id for r in closed.prompts] == [r.prompt_id for r in protocol.prompts]
    assert dict(closed.positions.checked_hist) == dict(protocol.positions.checked_hist), (policy, params)
    assert dict(closed.positions.accepted_hist) == dict(protocol.positions.accepted_hist), (policy, params)
    return True


GROWING = [("eagle2", {})] + [("eagle2", {"nodes": n, "depth": d}) for n in (1, 3, 4, 8, 16, 40) for d in (1, 2, 4)] + [
    ("ags-tree", {})] + [("ags-tree", {"nodes": n, "max_draft": d}) for n in (4, 16) for d in (2, 4)] + [
    ("ags-tree", {"rejection_threshold": h, "nodes": n}) for h in (0.0, 0.3, 0.5, 0.75, 0.9, 1.0) for n in (2, 8)]
STATIC = [("tree-static", {})] + [("tree-static", {"shape": s}) for s in ("1", "3", "1x1x1x1", "3x2x1", "2x1x3x1x2")] + [
    ("tree-static", {"nodes": n, "depth": d}) for n, d in ((4, 2), (12, 6), (30, 3))]


@pytest.mark.parametrize("policy, params", GROWING + STATIC)
def test_tree_policies_in_closed_form_are_the_protocol_on_the_shipped_trace(policy, params):
    assert assert_closed_form_is_the_protocol(Simulator(read_trace(TRACES / "smollm2-tree")), policy, params)


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_policies_in_closed_form_are_the_protocol_on_synthetic_recordings(seed):
    sim = Simulator(synthetic_tree_trace(seed), topology="two-devices")
    for policy, params in GROWING + STATIC:
        assert assert_closed_form_is_the_protocol(sim, policy, params)


def test_tree_policies_in_closed_form_are_the_protocol_with_probed_tree_forwards():
    # the probe's tree axis at a few sizes, each a little dearer than the chain (verifications
    # 10% + 1% per token, expansions 0.8 steps per node): the closed form still prices every round
    # as the executor does, and the prices are the probed ones
    trace = synthetic_tree_trace(0)
    lat = trace.latency
    chain = lat[(lat.op == "target_forward") & lat.k.isin([1, 2, 5, 9, 17, 40])]
    steps = lat[lat.op == "draft_step"]
    expand = pd.concat([steps.assign(op="draft_tree", k=w, seconds=steps.seconds * (1 + 0.8 * (w - 1))) for w in (2, 3, 6)])
    trace.latency = pd.concat([lat, chain.assign(op="target_tree", seconds=chain.seconds * (1.1 + 0.01 * chain.k)), expand],
                              ignore_index=True)
    sim = Simulator(trace, topology="two-devices")
    for policy, params in GROWING + STATIC:
        assert assert_closed_form_is_the_protocol(sim, policy, params)
    chain_priced = Simulator(synthetic_tree_trace(0), topology="two-devices")
    for policy in ("eagle2", "tree-static"):
        assert sim.run(policy, {}).summary.wall_time_s > chain_priced.run(policy, {}).summary.wall_time_s


def test_a_recording_that_lacks_an_expansion_is_refused_alike():
    trace = synthetic_tree_trace(2, lengths=(30,))
    tree = trace.tree
    at = tree[tree.pos == 1]  # the first round
    level2 = at[at.parent.isin(at[at.parent == -1].node)]
    expanded = level2[level2.node.isin(at.parent)].node.iloc[0]
    idle = level2[~level2.node.isin(at.parent)].node.iloc[0]
    tree.loc[(tree.pos == 1) & (tree.parent == expanded), "parent"] = idle  # eagle2 expands a node with no children
    sim = Simulator(trace, topology="two-devices")
    for depth in (3, 4):
        assert not assert_closed_form_is_the_protocol(sim, "eagle2", {"nodes": 6, "depth": depth})
    assert assert_closed_form_is_the_protocol(sim, "eagle2", {"depth": 2})  # level 3 is not drafted


class EveryCandidate(Eagle2):
    name = "test-every-candidate"

    def select(self, candidates):
        return range(len(candidates))


def test_a_growing_tree_that_selects_otherwise_is_replayed_by_the_protocol():
    sim = Simulator(read_trace(TRACES / "smollm2-tree"))
    policy = EveryCandidate(sim.context(), depth=2)
    assert TreeRounds(sim.replay, sim.latency).simulate(policy) is None
    assert SimExecutor(sim.latency, sim.topology).run(sim.replay, policy).prompts[0].counts.drafted > 0


def test_sequoia_drafts_nothing_where_the_draft_is_never_right():
    # no target token is among the top-2 anywhere: accept = [0, 0], every tree is worth 0 and the
    # empty one (fewest nodes) wins; its rounds are plain target steps, 1 per token as in ad
    sim = Simulator(tree_trace([[-1, -1, -1, -1, -1]], k=2))
    assert REGISTRY["tree-static"](sim.context(), nodes=2, depth=2).tree == DraftTree((), ())
    s = sim.run("tree-static", {"nodes": 2, "depth": 2}, with_cost=False).summary
    assert (s.target_calls, s.drafted, s.tokens) == (4, 0, 4)


def test_a_static_tree_without_a_shape_or_a_trace_is_refused_by_name():
    with pytest.raises(SimlabError) as err:
        REGISTRY["tree-static"](PolicyContext(latency=None))
    assert str(err.value) == "policy 'tree-static': give a shape, or a trace for Sequoia's optimiser"


def test_a_static_tree_wider_than_a_greedy_trace_says_how_to_record_one():
    with pytest.raises(SimlabError) as err:
        Simulator(hand_trace(["10110"])).run("tree-static", {"shape": "2x2"})
    assert str(err.value) == ("policy 'tree-static' drafts the draft's top-2 candidates; this trace has only its "
                              "greedy token; record it with --topk K")


class Grower(Policy):
    """Plans one growing tree round after another and expands ``expand(candidates)``."""

    name, summary, paper = "test-grower", "", ""

    def __init__(self, context, plan, expand=lambda candidates: candidates.levels[-1]):
        super().__init__(context)
        self._plan, self._expand = plan, expand

    def plan(self, state):
        return self._plan

    def grow(self, candidates):
        return self._expand(candidates)


def grown_rounds(plan, expand=None):
    """decode() of a Grower on a prompt of 8 positions, driven by hand."""
    context = Simulator(hand_trace(["1" * 8])).context()
    policy = Grower(context, plan) if expand is None else Grower(context, plan, expand)
    return decode(policy, PromptInfo(0, 10, 8, 8))


@pytest.mark.parametrize("topk, max_depth", [(0, 2), (2, 0)])
def test_a_growing_tree_needs_topk_and_max_depth_of_at_least_one(topk, max_depth):
    with pytest.raises(PolicyError) as err:
        next(grown_rounds(TreePlan(None, topk=topk, max_depth=max_depth)))
    assert str(err.value) == (f"test-grower: a growing tree needs topk and max_depth >= 1, got "
                              f"{TreePlan(None, topk=topk, max_depth=max_depth)}")


def test_a_growing_tree_of_one_candidate_a_level_and_one_level_is_allowed():
    rounds = grown_rounds(TreePlan(None, topk=1, max_depth=1))
    assert next(rounds) == ExpandTree(1, 1, (ROOT,), 1)
    verify = rounds.send(((ROOT, 0, 0.9),))
    assert type(verify) is VerifyTree and verify.widths == (1,) and verify.tree.size == 1


def test_growing_a_candidate_that_is_not_of_the_newest_level_is_refused():
    # level 1 holds candidates 0..1, level 2 (children of 0) 2..3; expanding 0 again is refused
    rounds = grown_rounds(TreePlan(None, topk=2, max_depth=3), expand=lambda candidates: [0])
    assert next(rounds) == ExpandTree(1, 1, (ROOT,), 2)
    assert rounds.send(((ROOT, 0, 0.9), (ROOT, 1, 0.1))) == ExpandTree(1, 2, (0,), 2)
    with pytest.raises(PolicyError) as err:
        rounds.send(((0, 0, 0.8), (0, 1, 0.2)))
    assert str(err.value) == "test-grower: grow() must name candidates of the newest level (2..3), got (0,)"


def test_a_growing_round_with_nothing_to_draft_asks_the_policy_to_select_nothing():
    # at the budget's last position a tree round may draft no level: the policy is not asked to
    # select among no candidates (a select that names one would make a malformed tree), and the
    # round verifies the empty tree: a plain target step
    context = Simulator(hand_trace(["1" * 8])).context()
    policy = Grower(context, TreePlan(None, topk=2, max_depth=3))
    policy.select = lambda candidates: [0]
    rounds = decode(policy, PromptInfo(0, 10, 2, 2))
    verify = next(rounds)
    assert type(verify) is VerifyTree and verify.widths == () and verify.tree.size == 0


def test_a_tree_rounds_timeline_names_its_draft_runs_and_what_they_fed():
    # 7 positions, every target token the draft's greedy one; shape 1x1 (a two-node chain). At 1
    # both nodes are accepted (positions 1, 2) and the target adds 3; the depth-2 node is a leaf
    # the draft never fed, so the round from 4 first feeds two tokens (it and the target's 3),
    # and accepts 4, 5 (cap 7 - 4 - 1 = 2 levels) with the target's 6.
    res = Simulator(tree_trace([[0] * 7], k=4), topology="two-devices").run(
        "tree-static", {"shape": "1x1"}, timeline_prompt=0, with_cost=False)
    assert [(s.name, s.args) for s in res.timeline if s.device == "draft"] == [
        ("draft x2", {"position": 1, "tokens": 2}), ("draft x2", {"position": 4, "tokens": 2, "fed": 2})]
    assert [(s.name, s.args) for s in res.timeline if s.device == "target"] == [
        ("verify x3", {"position": 1, "tokens": 3, "accepted": 2}), ("verify x3", {"position": 4, "tokens": 3, "accepted": 2})]

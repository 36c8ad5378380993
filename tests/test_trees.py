"""Draft trees: hand-built trees whose accepted paths can be checked by eye."""

import numpy as np
import pytest

from simlab.common.errors import SimlabError
from simlab.trace.tree_replay import ExpansionAt, Expansions, rank_acceptance
from simlab.trees.candidates import Candidates
from simlab.trees.draft_tree import NOT_IN_TOPK, ROOT, DraftTree, accepted_length, chain, parse_shape, static_tree
from simlab.trees.sequoia import best_tree


def test_static_tree_gives_each_depth_its_children_breadth_first():
    tree = static_tree((2, 1))
    # root -> nodes 0 (rank 0), 1 (rank 1); node 0 -> node 2; node 1 -> node 3
    assert tree.parents == (-1, -1, 0, 1)
    assert tree.ranks == (0, 1, 0, 0)
    assert tree.depths() == (1, 1, 2, 2)


def test_greedy_verification_accepts_the_path_that_follows_the_target_ranks():
    tree = static_tree((2, 1))
    assert accepted_length(tree, [1, 0, 0]) == 2  # second candidate, then its greedy child; depth 3 absent
    assert accepted_length(tree, [0, 1]) == 1  # depth-2 nodes only hold rank 0
    assert accepted_length(tree, [2, 0]) == 0  # rank 2 was never proposed
    assert accepted_length(tree, [NOT_IN_TOPK, 0]) == 0


@pytest.mark.parametrize("ranks", [[0, 0, 0, 0], [0, 0, 3, 0], [1, 0], [0, NOT_IN_TOPK, 0], []])
def test_a_chain_is_a_width_one_tree_accepting_the_matching_prefix(ranks):
    # a chain draft matches the target exactly where the target's token is the draft's top candidate
    prefix = next((i for i, r in enumerate(ranks) if r != 0), len(ranks))
    assert accepted_length(chain(3), ranks) == min(prefix, 3)


@pytest.mark.parametrize("tree, words", [
    (DraftTree((-1, 1), (0, 0)), "parent 1"),
    (DraftTree((-1, -1), (0, 0)), "repeats rank 0"),
    (DraftTree((-1,), (4,)), "rank 4"),
    (DraftTree((-1, 0), (0,)), "2 parents but 1 ranks"),
])
def test_malformed_trees_are_explained(tree, words):
    assert words in tree.problem(topk=4)


def test_well_formed_trees_have_no_problem():
    assert static_tree((4, 2, 2, 1)).problem(topk=4) is None


@pytest.mark.parametrize("text, words", [("4,x", "comma-separated"), ("4,0", "at least 1"),
                                         ("100,100,100", "at most 1024")])
def test_bad_shapes_fail_in_one_line(text, words):
    with pytest.raises(SimlabError, match=words) as err:
        parse_shape(text)
    assert "\n" not in str(err.value)


def test_shape_parses_children_per_depth():
    assert parse_shape("4,2,2,1") == (4, 2, 2, 1)


def test_sequoia_spends_a_budget_of_one_on_the_likeliest_candidate():
    value, tree = best_tree([0.3, 0.6], n=1, depth=3)
    assert (tree.parents, tree.ranks, value) == ((-1,), (1,), pytest.approx(0.6))


def test_sequoia_with_certain_greedy_acceptance_builds_a_chain():
    value, tree = best_tree([1.0, 0.5], n=4, depth=4)
    assert tree == chain(4) and value == pytest.approx(4.0)


def test_sequoia_widens_when_depth_is_capped():
    # depth 1: only siblings count; 0.5 + 0.3 beats any single node
    value, tree = best_tree([0.5, 0.3, 0.1], n=2, depth=1)
    assert tree.ranks == (0, 1) and value == pytest.approx(0.8)


def test_sequoia_value_is_the_expected_accepted_length_of_its_tree():
    accept = [0.6, 0.2, 0.1]
    value, tree = best_tree(accept, n=6, depth=3)
    # expected accepted drafts = sum over nodes of the product of accept[rank] along the path
    prob = []
    for p, r in zip(tree.parents, tree.ranks):
        prob.append(accept[r] * (1.0 if p == -1 else prob[p]))
    assert tree.size <= 6 and max(tree.depths()) <= 3 and tree.problem(topk=3) is None
    assert value == pytest.approx(sum(prob))
    assert value > 0.6 + 0.36 + 0.216  # beats the 3-chain, which fits the budget


def test_candidates_are_numbered_by_arrival_and_valued_by_their_path_product():
    c = Candidates()
    c.add_level([(ROOT, 0, 0.5), (ROOT, 1, 0.25)])  # candidates 0 and 1, depth 1
    c.add_level([(0, 0, 0.5), (1, 0, 0.8)])  # 2 under 0, 3 under 1
    assert c.levels == [range(0, 2), range(2, 4)] and c.depths == [1, 1, 2, 2]
    assert c.probs == [0.5, 0.25, 0.5, 0.8]
    assert c.values == [0.5, 0.25, 0.5 * 0.5, 0.25 * 0.8] == [0.5, 0.25, 0.25, 0.2]
    assert c.best(range(4), 2) == [0, 1]  # 0.5, then 0.25 (1 before 2: ties to the earlier one)
    assert c.tree([0, 3, 1]) == DraftTree((ROOT, ROOT, 1), (0, 1, 0))
    assert c.tree([4]) == "candidate 4 does not exist (4 candidates)"
    assert c.tree([2]) == "candidate 2 is chosen without its parent 0"
    assert c.tree([0, 0]) == "a candidate is chosen twice"


def test_recorded_expansions_are_cut_into_one_tree_per_position():
    # top-3, depth 2: 3 root children and 3 x 3 grandchildren, 3 + 3**2 = 12 nodes per position;
    # node n of position p holds token 100 p + n, children in rank order. The target's tokens
    # from position 0 are 2, 101, 107: at 0, node 2 (rank 2), whose children 9..11 hold no 101;
    # at 1, node 1 (rank 1), then its child 7 (parent 1's second child, rank 1)
    parent = [ROOT] * 3 + [0, 0, 0, 1, 1, 1, 2, 2, 2]
    nodes = 2 * len(parent)
    exp = Expansions(3, 2, np.array(parent * 2), np.array([0, 1, 2] * 8), np.full(nodes, 0.25),
                     np.array([100 * (n // 12) + n % 12 for n in range(nodes)]), [2, 101, 107])
    assert exp.size == 12
    assert (exp.at(0).path_ranks, exp.at(1).path_ranks) == ((2,), (1, 1))
    assert exp.at(1).answers[1] == ((0, 0.25), (1, 0.25), (2, 0.25))


def test_rank_acceptance_is_the_share_of_positions_at_each_rank():
    # 5 positions: ranks 0, 0, 1, not in the top-k, 2 -> 2/5, 1/5, 1/5; a prompt without
    # positions adds nothing
    assert rank_acceptance([[0, 0, 1, NOT_IN_TOPK], [2], []], 3) == [0.4, 0.2, 0.2]
    assert rank_acceptance([], 3) == [0.0, 0.0, 0.0]  # no prompts: no positions to share


def test_a_recorded_tree_lists_each_nodes_children_in_rank_order_whatever_their_numbers():
    # three root children numbered 0, 1, 2 but of ranks 2, 0, 1; the target's token 6 is node 2
    tree = ExpansionAt([ROOT, ROOT, ROOT], [2, 0, 1], [0.125, 0.5, 0.25], [7, 5, 6], [6])
    assert tree.children[ROOT] == (1, 2, 0)
    assert tree.answers[ROOT] == ((0, 0.5), (1, 0.25), (2, 0.125))
    assert tree.path_ranks == (1,)


def test_a_shape_may_have_exactly_the_most_nodes():
    # "4,2": 4 children of the root and 2 under each, 4 + 4 * 2 = 12 nodes
    assert parse_shape("4,2", max_nodes=12) == (4, 2)
    with pytest.raises(SimlabError, match="has 12 nodes; at most 11$"):
        parse_shape("4,2", max_nodes=11)

"""Draft trees: hand-built trees whose accepted paths can be checked by eye."""

import pytest

from simlab.errors import SimlabError
from simlab.trees.draft_tree import NOT_IN_TOPK, DraftTree, accepted_length, chain, parse_shape, static_tree
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

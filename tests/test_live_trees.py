"""Tree attention on a real model (SmolLM2-135M): one forward over a flattened draft tree (the
target's verification), or one forward per level (the draft's expansion), gives at every node the
logits a plain forward over that node's root-to-node path gives, and the cache kept to one path
continues as the path's own cache would (simlab/trees/attention.py)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="live decoding needs the models extra (torch)")
pytest.importorskip("transformers", reason="live decoding needs the models extra (transformers)")

from simlab.live.executor import _Model  # noqa: E402
from simlab.models import install  # noqa: E402
from simlab.models.load import load_model, resolve  # noqa: E402
from simlab.trees.attention import LiveTree, tree_inputs, verify_inputs  # noqa: E402
from simlab.trees.draft_tree import ROOT, static_tree  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT = [1, 504, 3458, 282, 4093, 314, 260, 1789, 30, 1007, 2114, 28, 338, 1363]
TREE = static_tree((3, 2, 1))  # 3 + 6 + 6 nodes, depth 3, siblings side by side


@pytest.fixture(scope="module")
def model():
    install("smollm2")
    return load_model(resolve("smollm2"), "cpu", "float32")


def _prefilled(model) -> _Model:
    m = _Model(model, "target", lambda: None)
    m.forward(PROMPT[:-1])
    return m


def _tokens() -> list[int]:
    """A token per node, different among siblings (node i: token 1000 + 37 i)."""
    return [1000 + 37 * i for i in range(TREE.size)]


def _paths() -> list[list[int]]:
    paths = []
    for i in range(TREE.size):
        path, n = [], i
        while n != ROOT:
            path.append(n)
            n = TREE.parents[n]
        paths.append(path[::-1])
    return paths


def _tree_forward(m: _Model, tokens: list[int]) -> torch.Tensor:
    """The verification's forward: the last committed token and every node, in one forward."""
    cached = m.length
    first = cached + 1
    visible = [[first + n for n in path] for path in _paths()]
    positions = [cached] + [cached + d for d in TREE.depths()]
    inputs = tree_inputs(cached, cached, 1, visible, positions, torch.float32, "cpu")
    return m.forward([PROMPT[-1]] + tokens, tree=inputs)


def _level_forwards(m: _Model, tokens: list[int]) -> torch.Tensor:
    """The draft's way: the last committed token, then one forward per level, each over the
    nodes of that level, whose rows must not see the earlier levels' other branches. Returns the
    rows in the layout of :func:`_tree_forward`."""
    rows = [m.forward([PROMPT[-1]])[-1]]
    shared = m.length
    slot: dict[int, int] = {}
    depths = TREE.depths()
    for depth in range(1, TREE.depth + 1):
        level = [i for i in range(TREE.size) if depths[i] == depth]
        for j, i in enumerate(level):
            slot[i] = m.length + j
        visible = [[slot[n] for n in _paths()[i]] for i in level]
        inputs = tree_inputs(m.length, shared, 0, visible, [shared - 1 + depth] * len(level), torch.float32, "cpu")
        rows += list(zip(level, m.forward([tokens[i] for i in level], tree=inputs)))
    out = [rows[0]] + [row for _, row in sorted(rows[1:], key=lambda r: r[0])]
    return torch.stack(out)


def _verify_inputs_forward(m: _Model, tokens: list[int]) -> torch.Tensor:
    """:func:`_tree_forward` with the inputs the live decoder and the latency probe build."""
    inputs = verify_inputs(m.length, 1, TREE.parents, TREE.depths(), torch.float32, "cpu")
    return m.forward([PROMPT[-1]] + tokens, tree=inputs)


def _live_tree_levels(m: _Model, tokens: list[int]) -> torch.Tensor:
    """:func:`_level_forwards` with the inputs the live decoder and the latency probe build
    (:meth:`LiveTree.feed`): each level's candidates are added when their parents are fed."""
    rows = [m.forward([PROMPT[-1]])[-1]]
    tree, candidate = LiveTree(m.length), {}
    depths = TREE.depths()
    for depth in range(1, TREE.depth + 1):
        level = [i for i in range(TREE.size) if depths[i] == depth]
        for i in level:
            p = TREE.parents[i]
            candidate[i] = tree.add(ROOT if p == ROOT else candidate[p], TREE.ranks[i], tokens[i])
        inputs = tree.feed([candidate[i] for i in level], m.length, torch.float32, "cpu")
        rows += list(zip(level, m.forward([tokens[i] for i in level], tree=inputs)))
    out = [rows[0]] + [row for _, row in sorted(rows[1:], key=lambda r: r[0])]
    return torch.stack(out)


@pytest.mark.parametrize("feed", [_tree_forward, _level_forwards, _verify_inputs_forward, _live_tree_levels],
                         ids=["one-forward", "per-level", "one-forward-as-live", "per-level-as-live"])
def test_a_tree_forward_equals_the_forward_of_every_path(model, feed):
    tokens = _tokens()
    tree_logits = feed(_prefilled(model), tokens)
    base = _prefilled(model)
    for i, path in enumerate(_paths()):
        chain = copy.deepcopy(base)
        logits = chain.forward([PROMPT[-1]] + [tokens[n] for n in path])
        # the last committed token's row, then each node on the path, as its own chain saw them
        assert torch.allclose(tree_logits[0], logits[0], atol=1e-4)
        for depth, n in enumerate(path, start=1):
            assert torch.allclose(tree_logits[n + 1], logits[depth], atol=1e-4), (i, n)


def test_the_cache_kept_to_a_path_continues_as_that_paths_cache(model):
    tokens = _tokens()
    path = _paths()[-1]  # a leaf's path, through nodes that are not first among their siblings
    m = _prefilled(model)
    _tree_forward(m, tokens)
    first = len(PROMPT)
    m.keep(list(range(first)) + [first + n for n in path])
    assert m.length == m.cache.get_seq_length() == len(PROMPT) + len(path)
    chain = _prefilled(model)
    chain.forward([PROMPT[-1]] + [tokens[n] for n in path])
    nxt = [2024, 11]
    assert torch.allclose(m.forward(nxt), chain.forward(nxt), atol=1e-4)

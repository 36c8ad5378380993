"""Speculative sampling in the live executor is lossless in distribution, computed exactly.

At temperature > 0 two decodes of a prompt agree only by chance, so losslessness is a property
of distributions: the sequence the executor emits must be distributed exactly as the target's
own sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", arXiv:2211.17192, Theorem 1 / Appendix A.1; for draft trees, SpecInfer's multi-step
speculative sampling: Miao et al., "SpecInfer: Accelerating Large Language Model Serving with
Tree-based Speculative Inference and Verification", ASPLOS 2024, arXiv:2305.09781, Theorem
4.2). The executor draws randomness in two places only (``_draw``: a token from a distribution,
a sampled tree's children included; ``_coin``: accept a draft). Replacing them with an
enumeration of every outcome and its probability turns a decode into a tree whose leaves are the
emitted sequences; summing the leaves' probabilities per sequence gives the executor's exact
output distribution, which is compared with the product of the target's sampling probabilities
for every sequence of the budget's length. A tiny randomly initialised model over a 3-token
vocabulary keeps the tree small (mechanics only; the real-model tests are in tests/test_live.py).
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="live decoding needs the models extra (torch)")
transformers = pytest.importorskip("transformers", reason="live decoding needs the models extra (transformers)")

from simlab.live.executor import LiveExecutor  # noqa: E402
from simlab.policies import PolicyContext, make_policy  # noqa: E402
from tests.helpers import EveryRoundParallel, SerialThenParallel  # noqa: E402

VOCAB = 3
BUDGET = 3  # a tree round from position 1 keeps one level (rounds cap a tree at budget - committed - 1)
DEEP = 4  # ... and two levels
PROMPT = [1, 2, 0]


def prompt(vocab: int) -> list[int]:
    """PROMPT within a vocabulary of ``vocab`` tokens."""
    return [t % vocab for t in PROMPT]
TEMPERATURE = 0.7


def tiny_model(seed: int, vocab: int = VOCAB):
    """A random Llama over ``vocab`` tokens whose next-token distributions are far from uniform."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                                      initializer_range=0.6, tie_word_embeddings=False, eos_token_id=None)
    return transformers.LlamaForCausalLM(config).eval()


class Enumerating(LiveExecutor):
    """An executor whose two random draws follow a script of choices and record the probability
    of each choice; :func:`exact_distribution` walks every script."""

    def start(self, script: list[int]) -> None:
        self.script, self.at, self.prob, self.options = list(script), 0, 1.0, []

    def _choose(self, weights: list[float]) -> int:
        live = [i for i, w in enumerate(weights) if w > 0]
        if self.at == len(self.script):
            self.script.append(0)
        choice = live[self.script[self.at]]
        self.options.append(len(live))
        self.at += 1
        self.prob *= weights[choice]
        return choice

    def _draw(self, dist):
        return self._choose(dist.double().tolist())

    def _coin(self, prob):
        return self._choose([prob, 1.0 - prob]) == 0


def exact_distribution(executor: Enumerating, policy, budget: int = BUDGET) -> dict[tuple[int, ...], float]:
    """Probability of every sequence the executor can emit (depth-first over all outcomes).
    Sets ``executor.deepest``: the most nodes a tree round accepted, over every outcome."""
    dist: dict[tuple[int, ...], float] = {}
    script: list[int] | None = []
    executor.deepest = 0
    while script is not None:
        executor.start(script)
        run = executor.run(policy, 0, prompt(executor.target_model.config.vocab_size), budget)
        executor.deepest = max([executor.deepest] + [r["accepted"] for r in run.rounds if r["mode"] == "tree"])
        key = tuple(run.tokens)
        dist[key] = dist.get(key, 0.0) + executor.prob
        script = _next_script(executor.script, executor.options)
    return dist


def _next_script(script: list[int], options: list[int]) -> list[int] | None:
    """The next leaf in depth-first order: bump the deepest choice that has an untried option."""
    for i in range(len(script) - 1, -1, -1):
        if script[i] + 1 < options[i]:
            return script[:i] + [script[i] + 1]
    return None


def target_distribution(target, budget: int = BUDGET) -> dict[tuple[int, ...], float]:
    """The target's own sampling: the product of softmax(logits / T) along every sequence."""
    out, vocab = {}, target.config.vocab_size
    for seq in itertools.product(range(vocab), repeat=budget):
        with torch.inference_mode():
            logits = target(input_ids=torch.tensor([prompt(vocab) + list(seq)])).logits[0].double()
        probs = torch.softmax(logits / TEMPERATURE, dim=-1)
        rows = range(len(PROMPT) - 1, len(PROMPT) + budget - 1)
        out[seq] = float(torch.prod(torch.stack([probs[r, y] for r, y in zip(rows, seq)])))
    return out


@pytest.fixture(scope="module")
def pairs():
    """``pairs(vocab, budget)``: draft, target and the target's distribution over ``budget``
    tokens, built once; one intra-op thread (the enumeration runs hundreds of tiny forwards,
    where thread hand-offs cost more than the arithmetic)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    built = {}

    def get(vocab: int, budget: int):
        if (vocab, budget) not in built:
            target, draft = tiny_model(0, vocab), tiny_model(1, vocab)
            built[vocab, budget] = draft, target, target_distribution(target, budget)
        return built[vocab, budget]

    yield get
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair(pairs):
    return pairs(VOCAB, BUDGET)


# What tree policies may draft here: no trace bounds them (as in a live run with --no-compare)
TREES = PolicyContext(latency=None, tree_topk=2, tree_depth=2)
POLICIES = {"sd gamma=2": lambda: make_policy("sd", None, gamma=2),
            "parallel rounds": lambda: EveryRoundParallel(None),
            "serial then parallel": lambda: SerialThenParallel(None),
            # a fixed tree's children are sampled; a grown one's are the draft's top-k
            "tree-static 2x1": lambda: make_policy("tree-static", TREES, shape="2x1"),
            "eagle2 top-2": lambda: make_policy("eagle2", TREES, top_k=2, depth=2, nodes=3)}


def max_gap(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_speculative_sampler_emits_the_targets_distribution(pair, policy):
    draft, target, want = pair
    executor = Enumerating(draft, target, [], temperature=TEMPERATURE)
    got = exact_distribution(executor, POLICIES[policy]())
    executor.close()
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-6)
    assert set(got) <= set(want)
    assert max_gap(got, want) < 1e-6  # float32 logits: the two sides differ by rounding only (about 3e-7 here)


@pytest.mark.parametrize("policy, vocab", [("tree-static 2x1", 2), ("eagle2 top-2", VOCAB)])
def test_trees_two_levels_deep_emit_the_targets_distribution(pairs, policy, vocab):
    """Over DEEP tokens the first tree round keeps both levels, so an accepted child's own
    children are judged too. A sampled tree enumerates every draft draw as well: over 3 tokens
    that is tens of thousands of decodes, so it runs over 2 (about a thousand)."""
    draft, target, want = pairs(vocab, DEEP)
    executor = Enumerating(draft, target, [], temperature=TEMPERATURE)
    got = exact_distribution(executor, POLICIES[policy](), DEEP)
    executor.close()
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-6)
    assert max_gap(got, want) < 1e-6
    assert executor.deepest == 2


class ResidualFromTarget(Enumerating):
    """A planted bug: after a rejection, draw from p instead of norm(max(0, p - q))."""

    def _correction(self, p, q):
        return super()._correction(p, None)


def test_the_check_is_sharp_enough_to_catch_a_wrong_residual(pair):
    """The tiny pair's draft differs enough from its target that a sampler drawing the
    correction from the wrong distribution misses by far more than the tolerance above."""
    draft, target, want = pair
    executor = ResidualFromTarget(draft, target, [], temperature=TEMPERATURE)
    got = exact_distribution(executor, make_policy("sd", None, gamma=2))
    executor.close()
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-6)
    assert max_gap(got, want) > 1e-3


class RejectedSiblingsForgotten(Enumerating):
    """A planted bug: a rejected tree child leaves the target's distribution as it was, so the
    next sibling is judged, and the round's last token drawn, against p, not norm(max(0, p - q))."""

    def _residual(self, p, q):
        return p


class TopKJudgedAsSampled(Enumerating):
    """A planted bug: a grown tree's top-k children judged with the draft's distribution, as if
    they had been drawn from it (the residual rule is lossless only for the distribution a child
    was actually drawn from)."""

    def _tree_forward(self, state, draft, forwards, start, expand):
        logits, tree = super()._tree_forward(state, draft, forwards, start, expand)
        for j, e in enumerate(expand):
            tree.proposal[e] = self._dist(logits[j])
        return logits, tree


@pytest.mark.parametrize("policy, bug", [("tree-static 2x1", RejectedSiblingsForgotten),
                                         ("eagle2 top-2", RejectedSiblingsForgotten),
                                         ("eagle2 top-2", TopKJudgedAsSampled)],
                         ids=["sampled-residual", "top-k-residual", "top-k-as-sampled"])
def test_the_check_catches_a_wrong_tree_verifier(pair, policy, bug):
    draft, target, want = pair
    executor = bug(draft, target, [], temperature=TEMPERATURE)
    got = exact_distribution(executor, POLICIES[policy]())
    executor.close()
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-6)
    assert max_gap(got, want) > 1e-3

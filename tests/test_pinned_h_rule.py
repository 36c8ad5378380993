"""The h-rule's cost terms in ``ags`` and ``ags-tree``, derived by hand from the paper's equations
(Sun et al., "Acceptance-Guided Adaptive Speculative Decoding for Efficient Large Language Model
Inference", §2.2-2.3, eqs. 6-7 and 11-12; issue 44, item 5):

    continue only if  T_d(k) + P_rej(k)·T_r < T_v      (eq. 11)
    i.e. stop when    P_rej(k) ≥ h = (T_v − T_d(k)) / T_r    (eq. 12), T_r = T_v in simlab

Which forward sizes and contexts each term is priced at is what these tests pin: the latency
table grows with k *and* with context (every forward costs 0.001 s more per token of context),
so a term priced at the wrong size or context moves h past the margins chosen below.

Latency: a draft step 0.1 s, a k-token target forward 1.0 + 0.1·k s, each plus 0.001 s per
token of context; the draft's forward over a 2-node tree level (probed) 0.15 s plus 0.003 s per
token of context, so that a level priced at the wrong context is seen too.
"""

import pytest

from simlab.latency.model import TableLatency
from simlab.policies import REGISTRY, PolicyContext
from simlab.common.signals import TokenSignal
from simlab.policies.base import RoundState
from simlab.sim.run import Simulator
from simlab.trees.candidates import Candidates
from tests.helpers import latency_table
from tests.test_tree_policies import eagle_example, tree_trace

SLOPE = 0.001
VERIFY = {k: 1.0 + 0.1 * k for k in range(1, 40)}
SAMPLES = latency_table(draft=0.1, verify=VERIFY, slope=SLOPE, expand={2: 0.15})
_LEVEL = SAMPLES["op"] == "draft_tree"
SAMPLES.loc[_LEVEL, "seconds"] = 0.15 + 0.003 * SAMPLES.loc[_LEVEL, "context_len"]


def level2(c):
    """The draft's forward over a 2-node tree level at context c."""
    return 0.15 + 0.003 * c


def step(c):
    """A draft step at context c."""
    return 0.1 + SLOPE * c


def forward(k, c):
    """A k-token target forward at context c."""
    return VERIFY[k] + SLOPE * c


# -- ags: a chain ---------------------------------------------------------------------------------

def chain_h(k, c):
    """eq. 12 after k drafts of a round at context c: T_v verifies the k drafts and the bonus
    position (a (k + 1)-token forward), T_d is the k draft steps, the draft's cache growing by one
    per step (contexts c .. c + k - 1)."""
    t_v = forward(k + 1, c)
    t_d = sum(step(c + i) for i in range(k))
    return (t_v - t_d) / t_v


def test_ags_prices_t_v_as_the_k_plus_1_token_verification_and_t_d_as_k_steps_from_the_rounds_context():
    # at context 30: k = 1: (1.23 - 0.13) / 1.23; k = 2: (1.33 - 0.261) / 1.33; k = 3: (1.43 - 0.393) / 1.43
    assert [chain_h(k, 30) for k in (1, 2, 3)] == pytest.approx([1.10 / 1.23, 1.069 / 1.33, 1.037 / 1.43])
    table = PolicyContext(latency=TableLatency.from_samples(SAMPLES), context_len=20)
    grid = Simulator(tree_trace([[0] * 12], k=2, latency=SAMPLES)).context()
    for context in (table, grid):  # live decoding's plain table and the simulator's grid alike
        policy = REGISTRY["ags"](context)
        assert [policy.threshold(k, 30) for k in (1, 2, 3)] == pytest.approx([chain_h(k, 30) for k in (1, 2, 3)],
                                                                             rel=1e-12)


def test_ags_stops_at_the_first_draft_whose_p_rej_reaches_h_of_the_rounds_own_context():
    # confidences 0.9, 0.5, ...: P_rej(1) = 0.1, P_rej(2) = 1 - 0.45 = 0.55. A round at context
    # 30: h(2) = (1.33 - 0.261) / 1.33 = 0.804 goes on; with a third 0.5, P_rej(3) = 0.775 >=
    # h(3) = 0.725 stops. A round at context 600: h(2) = (1.9 - (0.7 + 0.701)) / 1.9 = 0.263 stops
    # at the second draft, where h of the context's typical length (20: h(2) = (1.32 - 0.241) /
    # 1.32 = 0.817) or of the round before (30) would go on.
    policy = REGISTRY["ags"](PolicyContext(latency=TableLatency.from_samples(SAMPLES), context_len=20))

    def drafts_until_stop(context_len, confidences):
        policy.begin_round(RoundState(1, 50, 0, context_len))
        for i, conf in enumerate(confidences, 1):
            if policy.stops(TokenSignal(i, conf, 1 - conf)):
                return i
        return None

    assert chain_h(2, 600) == pytest.approx((1.9 - 1.401) / 1.9) and chain_h(2, 20) == pytest.approx(1.079 / 1.32)
    assert drafts_until_stop(30, [0.9, 0.5, 0.5, 0.9]) == 3
    assert drafts_until_stop(600, [0.9, 0.5, 0.9]) == 2
    assert drafts_until_stop(30, [0.9, 0.5, 0.5, 0.9]) == 3  # each context keeps its own h


def test_ags_stops_when_p_rej_equals_h_exactly():
    # eq. 11 continues only while T_d + P_rej·T_r < T_v, i.e. P_rej < h: at P_rej = h the round
    # stops (eq. 7's "P_rej > h" would go on; docs/policies/ags.md). h = 0.5, conf 0.5: P_rej(1) = 0.5
    policy = REGISTRY["ags"](PolicyContext(latency=None), rejection_threshold=0.5)
    policy.begin_round(RoundState(1, 50, 0, 30))
    assert policy.stops(TokenSignal(1, 0.5, 0.5))
    policy.begin_round(RoundState(1, 50, 0, 30))
    assert not policy.stops(TokenSignal(1, 0.5 + 2 ** -20, 0.5))


# -- ags-tree -------------------------------------------------------------------------------------

def test_ags_tree_prices_t_v_at_the_nodes_it_would_verify_and_t_d_at_the_levels_drafted_so_far():
    """A round at context 30 with nodes = 3, top-2, three levels. T_v verifies min(nodes,
    candidates) + 1 tokens under the tree mask (no tree verification probed: the chain's price);
    T_d is the draft forwards so far, one per level at context 30 + d: the root's single-node
    step, then each expansion over the nodes it expanded (a 2-node level: the probed 0.15 s)."""
    sim = Simulator(tree_trace([[0] * 12], k=2, expansion=eagle_example, depth=3, latency=SAMPLES),
                    topology="two-devices")
    policy = REGISTRY["ags-tree"](sim.context(), nodes=3, max_draft=3)
    policy.plan(RoundState(1, 10, 0, 30))
    c = Candidates()
    # level 1, 2 candidates: T_v = forward(min(3, 2) + 1 = 3, 30) = 1.33, T_d = step(30) = 0.13
    h1 = (forward(3, 30) - step(30)) / forward(3, 30)
    assert h1 == pytest.approx(1.2 / 1.33)
    c.add_level([(-1, 0, 0.9), (-1, 1, 0.8)])  # P_rej 0.1 and 0.2, both below h1: both grow
    assert policy.threshold(len(c)) == pytest.approx(h1, rel=1e-12)
    assert list(policy.grow(c)) == [0, 1]
    # level 2 after a 2-node expansion, 6 candidates: T_v = forward(min(3, 6) + 1 = 4, 30) = 1.43;
    # T_d = step(30) + the 2-node level at context 31 (0.15 + 0.093) = 0.373: h2 = 1.057 / 1.43 = 0.7392
    t_d = step(30) + level2(31)
    h2 = (forward(4, 30) - t_d) / forward(4, 30)
    assert h2 == pytest.approx(1.057 / 1.43)
    c.add_level([(0, 0, 0.9), (0, 1, 0.05), (1, 0, 0.325), (1, 1, 0.05)])  # values .81, .045, .26, .04
    assert policy.threshold(len(c)) == pytest.approx(h2, rel=1e-12)
    # the best two are n2 (P_rej 0.19: grows) and n4 (P_rej 0.74 >= 0.7392: stops). Each wrong term
    # would let n4 grow: T_v over all 6 candidates (h = (1.73 - 0.373) / 1.73 = 0.784), the level
    # priced as two draft steps (h = (1.43 - 0.261) / 1.43 = 0.817), T_d of the root step only
    # (0.909), the level at the round's context, 30 (step(31) + level2(30): h = (1.43 - 0.371) /
    # 1.43 = 0.7406), or every context 0 (h = (1.4 - 0.253) / 1.4 = 0.819)
    for wrong in ((1.73 - 0.373) / 1.73, (1.43 - 0.261) / 1.43, (1.43 - 0.13) / 1.43, (1.43 - 0.371) / 1.43,
                  (1.4 - 0.253) / 1.4):
        assert h2 < 1 - 0.26 < wrong
    assert list(policy.grow(c)) == [2]
    # level 3 after a 1-node expansion (n2 alone: a draft step at context 32)
    t_d += step(32)
    c.add_level([(2, 0, 0.5), (2, 1, 0.25)])
    assert policy.threshold(len(c)) == pytest.approx((forward(4, 30) - t_d) / forward(4, 30), rel=1e-12)

"""The papers' closed forms beside the simulator, on one trace: where the i.i.d. assumption breaks.

Two acceptance figures, which measure different things:

- α (``alpha``), the closed forms' per-position acceptance: at every drafted position (1..n−1 of
  each prompt; position 0 is the prefill's token) whether the draft's token *given the true
  prefix* is accepted. It depends on the trace only.
- ``acceptance_sim``, the simulator's ``acceptance_rate`` (accepted / drafted) of vanilla SD at
  γ: drafts after a round's first rejection are drafted but never accepted, so it is lower than
  α and depends on the schedule (γ, the policy), as in ``simlab simulate``.

For vanilla SD at each γ, tokens per round and speedup three ways:

- ``iid``: Leviathan et al.'s forms with the per-position α;
- ``runs``: a run-length model that knows where rounds start. A round starts right after a
  rejected draft (state A) or after a round that accepted all γ drafts (state B; the position
  before the start is that round's bonus token). For each state, P(R ≥ j | X) — the chance
  that the j positions from the start are all accepted — is counted over every position of
  the trace that could start such a round. Rounds move between the states as a two-state
  chain (a round ends in B when all γ drafts are accepted, with p_X = P(R ≥ γ | X)), so a
  share π_B = p_A / (1 − p_B + p_A) of rounds starts in B, and tokens per round are
  Σ_X π_X (1 + Σ_{j≤γ} P(R ≥ j | X)). On an i.i.d. trace both states have P(R ≥ j) = α^j and
  this is Leviathan's E(α, γ); on bursty traces rounds after a rejection are shorter, which
  mean α alone cannot show;
- ``sim``: the simulator's replay — exact for greedy traces.

Both closed forms price a round with the latency model at the trace's typical context length
(the one policies are built with): c = T_d / T_t(1) and v = T_v(γ+1) / T_t(1); the simulator
prices every round at its own context, so the columns also differ where latency grows with
context.

Also printed: acceptance by position in the draft run over every start position,
α_j = P(R ≥ j) / P(R ≥ j − 1) (constant on an i.i.d. trace, rising with j on a bursty one);
the h-rule's threshold h(k) = (T_v − T_d(k)) / T_r (acceptance-guided adaptive
SD, eq. 12) with T_d(k) the time of k draft steps, T_v a (k+1)-token verify and T_r = T_v (a
rejection costs one more verification of the same size; the ``ags`` policy's choice); SPIDE's
window two ways — eq. 6 as written, s = ⌊v_q / v_p⌋ = ⌊T_t(1) / T_d⌋ from one-token costs, and
the window ``spide`` and ``pearl`` use when theirs is not given (the largest s whose s draft
steps fit in an s-token verify, :func:`~simlab.policies.timing.balanced_window`; equal to eq. 6
where verify cost is flat in k, far larger on CPUs), each solo and with co-running latencies;
and, for traces with per-exit-layer signals, DEL's TPL(ℓ, d) table with α_ℓ measured per layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from simlab.analytic import closed_form as analytic
from simlab.common.errors import SimlabError
from simlab.policies.timing import balanced_window
from simlab.sim.run import Simulator


@dataclass(frozen=True)
class GammaRow:
    gamma: int
    tokens_iid: float
    tokens_runs: float
    tokens_sim: float
    speedup_iid: float
    speedup_runs: float
    speedup_sim: float
    acceptance_sim: float  # the simulator's acceptance_rate (accepted / drafted), not α

    @property
    def err_iid(self) -> float:
        """Relative error of the i.i.d. closed-form speedup against the simulated one."""
        return self.speedup_iid / self.speedup_sim - 1.0

    @property
    def err_runs(self) -> float:
        return self.speedup_runs / self.speedup_sim - 1.0


@dataclass(frozen=True)
class HRow:
    k: int
    t_draft_k: float
    t_verify: float
    t_reject: float
    h: float


@dataclass
class TplTable:
    """DEL's TPL(ℓ, d): rows are exit layers, columns d = 0..max_d."""

    n_layers: int
    layers: list[int]
    alpha: list[float]
    values: list[list[float]]

    @property
    def best(self) -> tuple[int, int, float]:
        v = np.asarray(self.values)
        i, d = np.unravel_index(int(np.argmax(v)), v.shape)
        return self.layers[i], int(d), float(v[i, d])


@dataclass
class TraceAnalysis:
    alpha: float
    drafted_positions: int
    survival: list[float]  # P(R >= j) over every start position, j = 1..max gamma
    context_len: int
    t_draft: float
    t_target: float
    gammas: list[GammaRow] = field(default_factory=list)
    h: list[HRow] = field(default_factory=list)
    topology: str = ""
    window: int | None = None  # eq. 6 from one-token costs
    window_corun: int | None = None
    policy_window: int | None = None  # what spide/pearl use without a window (balanced_window)
    policy_window_corun: int | None = None
    tpl: TplTable | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def position_acceptance(self) -> list[float]:
        """α_j = P(R ≥ j) / P(R ≥ j−1): acceptance of the j-th draft given the earlier ones."""
        prev = [1.0] + self.survival[:-1]
        return [s / p if p > 0 else float("nan") for s, p in zip(self.survival, prev)]

    def to_dict(self) -> dict:
        return {
            "alpha": self.alpha,
            "drafted_positions": self.drafted_positions,
            "survival": self.survival,
            "position_acceptance": self.position_acceptance,
            "context_len": self.context_len,
            "t_draft_s": self.t_draft,
            "t_target_s": self.t_target,
            "gammas": [{**asdict(g), "err_iid": g.err_iid, "err_runs": g.err_runs} for g in self.gammas],
            "h_rule": [asdict(h) for h in self.h],
            "topology": self.topology,
            "window": self.window,
            "window_corun": self.window_corun,
            "policy_window": self.policy_window,
            "policy_window_corun": self.policy_window_corun,
            "tpl": None if self.tpl is None else {**asdict(self.tpl), "best": self.tpl.best},
            "notes": self.notes,
        }


def run_survival(paths, max_j: int) -> tuple[float, int, list[float]]:
    """Mean acceptance, drafted positions and P(R ≥ j) for j = 1..max_j, pooled over prompts.

    ``paths`` are (accept, run) lists per prompt, as :class:`~simlab.trace.replay.DraftPath`
    holds them; position 0 is skipped and a start t counts for j only if t + j − 1 exists."""
    accepted = drafted = 0
    hits, starts = np.zeros(max_j), np.zeros(max_j)
    for accept, run in paths:
        acc = np.asarray(accept[1:], dtype=bool)
        r = np.asarray(run[1:])
        accepted += int(acc.sum())
        drafted += len(acc)
        for j in range(1, max_j + 1):
            usable = r[: max(len(r) - j + 1, 0)]
            hits[j - 1] += (usable >= j).sum()
            starts[j - 1] += len(usable)
    if drafted == 0:
        raise SimlabError("the trace has no drafted positions (every prompt has a single token)")
    survival = np.divide(hits, starts, out=np.zeros(max_j), where=starts > 0)
    return accepted / drafted, drafted, survival.tolist()


def round_start_tokens(paths, gamma: int) -> float:
    """Tokens per round of vanilla SD with γ drafts under the two-state run-length model
    (module docstring, ``runs``); ``paths`` are (accept, run) lists per prompt."""
    hits, starts = np.zeros((2, gamma)), np.zeros((2, gamma))
    for accept, run in paths:
        acc, r = np.asarray(accept, dtype=bool), np.asarray(run)
        t = np.arange(2, len(r))
        after_reject = t[~acc[t - 1]]
        after_full = t[t - 1 - gamma >= 1]
        after_full = after_full[r[after_full - 1 - gamma] >= gamma]
        for state, first in enumerate((after_reject, after_full)):
            for j in range(1, gamma + 1):
                usable = first[first + j - 1 < len(r)]
                hits[state, j - 1] += (r[usable] >= j).sum()
                starts[state, j - 1] += len(usable)
    seen = starts[:, 0] > 0
    if not seen.any():
        return float("nan")
    surv = np.divide(hits, starts, out=np.zeros_like(hits), where=starts > 0)
    if seen.all():
        p_a, p_b = surv[0, -1], surv[1, -1]
        share_b = p_a / (1.0 - p_b + p_a) if (1.0 - p_b + p_a) > 0 else 1.0
    else:
        share_b = float(seen[1])  # only one kind of round start occurs
    tokens = 1.0 + surv.sum(axis=1)
    return float((1.0 - share_b) * tokens[0] + share_b * tokens[1])


def tpl_table(sim: Simulator, max_d: int) -> TplTable | None:
    """TPL per exit layer from the per-layer acceptance of the trace, or None without layers."""
    prompts = sim.replay.prompts
    layers = sorted({layer for p in prompts for layer in p.layers})
    if not layers:
        return None
    n_layers = sim.trace.manifest.n_layers
    if n_layers < 1:
        raise SimlabError("the trace has per-layer signals but its manifest gives no n_layers (needed for TPL)")
    alphas = []
    for layer in layers:
        bits = [b for p in prompts for b in p.layers[layer].accept[1:]]
        alphas.append(float(np.mean(bits)) if bits else 0.0)
    values = [[analytic.tokens_per_layer(a, d, layer, n_layers) for d in range(max_d + 1)]
              for layer, a in zip(layers, alphas)]
    return TplTable(n_layers, layers, alphas, values)


def analyse_trace(sim: Simulator, max_gamma: int = 10) -> TraceAnalysis:
    """Closed forms, the run-length model and simulated vanilla SD for γ = 1..max_gamma."""
    if max_gamma < 1:
        raise SimlabError(f"--max-gamma must be >= 1, got {max_gamma}")
    paths = [(p.draft.accept, p.draft.run) for p in sim.replay.prompts]
    alpha, drafted, survival = run_survival(paths, max_gamma)
    ctx = sim.context().context_len
    lat = sim.latency
    out = TraceAnalysis(alpha, drafted, survival, ctx, float("nan"), float(lat.target_forward(1, ctx)),
                        topology=sim.topology.value)
    out.tpl = tpl_table(sim, max_gamma)
    try:
        out.t_draft = float(lat.draft_step(ctx))
    except SimlabError as exc:
        out.notes.append(f"no vanilla-SD comparison: {exc}")
        return out
    c = out.t_draft / out.t_target
    for g in range(1, max_gamma + 1):
        v = float(lat.target_forward(g + 1, ctx)) / out.t_target
        e_iid = analytic.expected_tokens(alpha, g)
        e_runs = round_start_tokens(paths, g)
        s = sim.run("sd", {"gamma": g}, with_cost=False).summary
        out.gammas.append(GammaRow(g, e_iid, e_runs, s.tokens / s.target_calls,
                                   analytic.speedup_from_costs(e_iid, g, c, v),
                                   analytic.speedup_from_costs(e_runs, g, c, v), s.speedup, s.acceptance_rate))
    for k in range(1, max_gamma + 1):
        t_v = float(lat.target_forward(k + 1, ctx))
        t_d = float(lat.draft_seconds(ctx, k))
        out.h.append(HRow(k, t_d, t_v, t_v, analytic.h_threshold(t_v, t_d, t_v)))
    out.window = analytic.parallel_window(out.t_draft, out.t_target)
    context = sim.context()
    out.policy_window = balanced_window(replace(context, corun=False))
    if getattr(lat.model, "has_corun", False):
        out.window_corun = analytic.parallel_window(float(lat.draft_step(ctx, corun=True)),
                                                    float(lat.target_forward(1, ctx, corun=True)))
        out.policy_window_corun = balanced_window(replace(context, corun=True))
    return out

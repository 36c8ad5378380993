"""The policy interface: a policy decides, an executor does.

The same policy object drives the SimPy simulator and the live decoder (docs/architecture.md,
"One policy, two executors"), in the shape of Hugging Face's candidate generators: proposals and
stop decisions go out, verification outcomes come back. A policy never sees a future
acceptance bit; it sees

- at the start of each round, a :class:`RoundState` (how many tokens are committed, how
  many remain, how many drafted tokens are waiting for verification);
- in a serial round, one :class:`~simlab.common.signals.TokenSignal` per drafted token;
- after every target verification, an :class:`Outcome`.

It answers with a plan per round (:class:`Serial` or :class:`Parallel`) and, while drafting
serially, a :class:`Decision` per token. Policies hold no clock and do no I/O: durations they
need (e.g. the h-rule's T_v, T_d, T_r) come from the latency model they are built with.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple, Protocol, Sequence

from simlab.common.errors import SimlabError
from simlab.common.signals import ShadowTokens, TokenSignal
from simlab.trees.candidates import Candidates
from simlab.trees.draft_tree import DraftTree


class Decision(enum.Enum):
    """What to do after a drafted token in a serial round."""

    DRAFT = "draft"  # draft another token
    VERIFY = "verify"  # stop; the target verifies the drafts now (serial)
    PARALLEL = "parallel"  # stop; hand the drafts to a parallel round (SPIDE's switch)
    DROP = "drop"  # stop; discard the token just drafted and verify the ones before it (DEL Alg. 1)


class Serial(NamedTuple):
    """Draft up to ``max_draft`` tokens one by one, then verify them in one target forward.

    With ``fixed=True`` the policy promises to draft exactly ``max_draft`` tokens whatever the
    signals say (vanilla SD), so executors may skip asking it after each token. ``layer``
    names the exit layer of a self-speculative draft (None: the separate draft model).
    ``min_draft``: a draft that ends shorter than this (counted after a ``DROP``) is discarded
    whole and the target verifies none of it — llama.cpp's ``--draft-min``, whose engine then
    runs a plain target step rather than verify a draft it judges too short to pay off.

    A named tuple (immutable, as plans are shared) rather than a frozen dataclass: many
    policies plan a new one every round, and a tuple is built several times faster.
    """

    max_draft: int
    fixed: bool = False
    layer: int | None = None
    min_draft: int = 0


@dataclass(frozen=True, slots=True)
class Parallel:
    """One parallel round (PEARL, SPIDE): the target verifies the pending drafts plus the first
    new one while the draft drafts ``window`` new tokens at the same time."""

    window: int


@dataclass(frozen=True, slots=True)
class TreePlan:
    """A tree round (:mod:`simlab.trees`): the draft drafts a tree, one forward per depth, and
    the target verifies all its nodes in one forward; the longest accepted path is committed.

    ``tree`` is a fixed tree of (parent, rank) nodes; None grows the tree level by level: after
    each draft forward the policy sees the ``topk`` children of every node it expanded
    (:meth:`Policy.grow` names the nodes to expand next, none to stop, at most ``max_depth``
    levels) and then picks the nodes to verify (:meth:`Policy.select`).
    """

    tree: DraftTree | None = None
    topk: int = 0
    max_depth: int = 0


class Lookup(NamedTuple):
    """A round that drafts without a draft model: the policy's :meth:`Policy.propose` looks up to
    ``max_draft`` tokens up in what the decoder holds (the prompt and the tokens committed so far,
    and whatever cache or datastore the policy keeps), and the target verifies them in one
    forward; nothing proposed makes it a plain target step. With ``fallback``, a round whose
    lookup proposes nothing drafts by that serial plan instead (the draft model)."""

    max_draft: int
    fallback: Serial | None = None


Plan = Serial | Parallel | TreePlan | Lookup


class RoundState(NamedTuple):
    """What a policy knows when it plans a round."""

    committed: int  # tokens emitted so far (position of the next token to decide)
    remaining: int  # tokens still to emit for this prompt
    pending: int  # drafted tokens awaiting verification (parallel mode)
    context_len: int  # tokens in the target's context before this round


class Outcome(NamedTuple):
    """The result of one target verification.

    ``checked`` are the signals of the draft tokens the target judged, in order, up to and
    including the first rejected one (a sequence, possibly built lazily by the executor); ``accepted`` of them were accepted. ``emitted`` counts
    every token committed by this verification (accepted drafts plus the target's own token).
    In a parallel round, ``first_new_accepted`` says whether the first token drafted during the
    round was accepted (then the rest of that round's drafts stay pending).
    """

    parallel: bool
    drafted: int  # draft tokens produced for this round (serial) or during it (parallel)
    checked: Sequence[TokenSignal]
    accepted: int
    emitted: int
    first_new_accepted: bool = False

    @property
    def rejected(self) -> bool:
        return self.accepted < len(self.checked)


@dataclass(frozen=True)
class Kind:
    """A parameter's type and range: how a command line parses it and how :class:`Policy`
    checks it (once, for every policy, when the policy is built)."""

    type: type
    range: str  # as help text shows it
    check: Callable[[str, Any], Any]  # (name, value) -> the value, or SimlabError


@dataclass(frozen=True)
class Param:
    """A policy parameter, declared once: ``simlab policies``, the flags of ``simulate`` and
    ``live``, sweep grids and validation all read it.

    A default of None means "derived" (from the latency model or the trace) and None is then
    accepted as a value. ``aliases`` are other names the parameter answers to, e.g. Hugging
    Face's ``num_assistant_tokens`` for γ.
    """

    name: str
    default: Any
    help: str
    kind: Kind
    aliases: tuple[str, ...] = ()

    def check(self, value: Any) -> Any:
        return None if value is None and self.default is None else self.kind.check(self.name, value)


@dataclass
class PromptInfo:
    """What a policy may know about a prompt before decoding it.

    ``budget`` is the most tokens the prompt may generate (``--max-new-tokens``): drafting is
    capped by it. ``n_tokens`` is where the prompt ends: a trace knows it (the EOS or the
    budget); the live decoder starts with the budget and lowers it when the target emits an
    end token. ``replay`` is the trace replay of this prompt; only the oracle policy (the
    declared exception, a serial-schedule bound) may read it. It is None in live decoding.
    ``stop`` is where the prompt itself ends when the path given runs on past it, for a policy
    with ``past_end`` (:mod:`simlab.trace.past_end`); ``n_tokens`` otherwise.
    """

    prompt_id: int
    prompt_len: int
    n_tokens: int
    budget: int = 0
    replay: Any = None
    stop: int = 0

    def __post_init__(self) -> None:
        self.budget = max(self.budget, self.n_tokens)
        self.stop = self.stop or self.n_tokens


class AcceptancePredictor(Protocol):
    """P(accept) of a drafted token from what a decoder knows at that moment.

    ``recent_acceptance`` is the fraction of the last :data:`RECENT_WINDOW` checked draft
    tokens that were accepted (1.0 before any check), which a policy tracks from its outcomes.
    Trained predictors (``simlab calibrate predictor``) implement this; policies that need a
    predictor fall back to :class:`ConfidencePredictor` when none is given.
    """

    name: str

    def predict_accept(self, signal: TokenSignal, recent_acceptance: float) -> float: ...


RECENT_WINDOW = 16


class ConfidencePredictor:
    """The untrained default: the draft's own top-1 probability taken as P(accept).

    ``reads`` names that field of the signal, its answer whatever the recent acceptance: a policy
    may read the field directly (``operator.attrgetter``, one C call per drafted token) rather
    than through :meth:`predict_accept`, and need not track the recent acceptance."""

    name = "confidence"
    reads = "confidence"

    def predict_accept(self, signal: TokenSignal, recent_acceptance: float) -> float:
        return signal.confidence


@dataclass
class PolicyContext:
    """What policies are built with: the latency model and facts about the trace/models.

    ``corun`` says that parallel rounds will run both models on one device (the one-device
    topology), so windows sized from latencies should use the co-running figures.
    ``best_gamma``, when given, returns vanilla SD's best γ on the same trace and latency model
    (tuned offline, as the papers do; SPIDE w/o dyna-draft drafts that many tokens).
    """

    latency: Any
    exit_layers: list[int] = field(default_factory=list)
    n_layers: int = 0
    context_len: int = 128  # a typical context length, for policies that size windows up front
    predictor: AcceptancePredictor | None = None
    corun: bool = False
    best_gamma: Callable[[], int] | None = None
    # tree data of the trace (manifest fields topk and tree_depth; 0: none) and its temperature;
    # a live run without a trace gives the top-k and depth of the trees it drafts
    tree_topk: int = 0
    tree_depth: int = 0
    temperature: float = 0.0
    #: Sequoia's positional acceptance from the trace: P(the target's token is the r-th candidate)
    rank_acceptance: Callable[[], list[float]] | None = None
    #: the trace's budget (manifest max_new_tokens; 0: unknown), past which it recorded no token
    max_new_tokens: int = 0
    #: the models' end tokens (the trace's manifest), which Hugging Face's prompt lookup cuts at
    eos_token_ids: list[int] = field(default_factory=list)


class Policy(ABC):
    """Base class. Subclasses set ``name``, ``summary``, ``paper`` and ``params``, and say in
    ``choices`` what they decided where their paper is silent (``simlab policies`` prints it)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    paper: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    choices: ClassVar[str] = ""
    #: True for the oracle: it reads the replay (future acceptance) and is only a bound (over serial schedules).
    needs_future: ClassVar[bool] = False
    #: Where a policy models another engine's decoding that simlab's own decoder does not run, the
    #: command that checks it against that engine (``simlab live`` refuses it and names this).
    checked_by: ClassVar[str | None] = None
    #: True if the policy may plan parallel rounds.
    parallel: ClassVar[bool] = False
    #: False for a policy that never drafts (autoregressive decoding): no draft model runs, so its
    #: target forwards are priced as plain decoding steps (``LatencyModel.target_step``), which on
    #: an engine whose verification also feeds the draft (llama.cpp) cost less than a one-token
    #: verification.
    drafts: ClassVar[bool] = True
    #: True if the policy plans tree rounds (:class:`TreePlan`).
    drafts_trees: ClassVar[bool] = False
    #: True if the policy reads every exit layer's token after the prefill and each serial
    #: verification (:meth:`observe_shadows`; DEL's shadow tokens).
    needs_shadows: ClassVar[bool] = False
    #: True if a serial round stops drafting right after the draft proposes an end token (the
    #: token is still verified), as Hugging Face's assistant does. False: the draft drafts on
    #: past it, as the papers' algorithms (which do not treat end tokens) are written; what
    #: follows a rejected end token is wasted, and an accepted one ends the prompt anyway.
    #: Parallel rounds never stop early: their window is fixed when the round starts.
    stops_at_draft_end: ClassVar[bool] = False
    #: Positions past each prompt's end that the engine the policy models drafts and verifies
    #: (vLLM: its K drafts of a request's last step, counted when accepted): the simulator replays
    #: such a policy on the path extended that far (:mod:`simlab.trace.past_end`) and the policy
    #: stops at the prompt's own end (:meth:`done`) and keeps only the tokens before it (:meth:`kept`).
    past_end: int = 0
    #: True if the policy plans :class:`Lookup` rounds, which read the tokens themselves
    #: (:meth:`propose`), and prices its lookups (:meth:`lookup_seconds`).
    looks_up: ClassVar[bool] = False

    @classmethod
    def draft_end_choice(cls) -> str:
        """The declared choice, as ``simlab policies`` prints it."""
        if cls.stops_at_draft_end:
            return "serial drafts stop after the draft's own end token (as Hugging Face's assistant does)"
        choice = "the draft drafts on past its own end token (its algorithm does not treat end tokens)"
        return choice + ("; a parallel window runs to its length, fixed when the round starts" if cls.parallel else "")

    def __init__(self, context: PolicyContext, **values: Any):
        self.context = context
        values = self.canonical(values)
        for p in self.params:
            setattr(self, p.name, p.check(values.get(p.name, p.default)))

    @classmethod
    def canonical(cls, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` under the parameters' own names (aliases resolved); unknown names and a
        parameter given twice (under two names) are a :class:`SimlabError`."""
        name_of = {alias: p.name for p in cls.params for alias in (p.name, *p.aliases)}
        unknown = sorted(set(values) - set(name_of))
        if unknown:
            raise SimlabError(
                f"policy {cls.name!r} has no parameter(s) {unknown}; "
                f"it takes {[p.name for p in cls.params] or 'none'}"
            )
        out: dict[str, Any] = {}
        for key, value in values.items():
            name = name_of[key]
            if name in out:
                raise SimlabError(f"policy {cls.name!r}: {name} is given twice (as {name} and an alias)")
            out[name] = value
        return out

    def reset(self, prompt: PromptInfo) -> None:
        """Called before each prompt. State kept across prompts (e.g. SPIDE's table) stays."""

    @abstractmethod
    def plan(self, state: RoundState) -> Plan:
        """Plan the next round."""

    def on_draft(self, signal: TokenSignal) -> Decision:
        """After each drafted token of a serial round (not called for ``Serial(fixed=True)``)."""
        return Decision.DRAFT

    def stop_rule(self) -> Callable[[TokenSignal], bool] | None:
        """The test of a drafted token that :meth:`on_draft` answers VERIFY on, for a policy whose
        ``on_draft`` answers only VERIFY or DRAFT (None: ask ``on_draft``). The draft loop then
        calls the test in its place: the simulator decides once per simulated draft token, and
        one call fewer per token is a large share of a replayed round."""
        return None

    def observe(self, outcome: Outcome) -> None:
        """After each target verification."""

    def observes(self) -> bool:
        """Whether :meth:`observe` uses the outcomes: :func:`~simlab.policies.rounds.decode` builds none
        for a policy that does not (PEARL's parallel rounds are most of its simulation). By
        default, whether the policy's class overrides :meth:`observe`."""
        return type(self).observe is not Policy.observe

    def grow(self, candidates: Candidates) -> Sequence[int]:
        """In a growing tree round, after each draft forward: the candidates of the newest level
        to expand next (none: stop drafting)."""
        return ()

    def select(self, candidates: Candidates) -> Sequence[int]:
        """In a growing tree round, after drafting: the candidates to verify (with their parents)."""
        return range(len(candidates))

    def observe_shadows(self, shadows: ShadowTokens) -> None:
        """After the prefill and each serial verification, for policies with ``needs_shadows``."""

    def propose(self, context: Sequence[int], cap: int) -> Sequence[int]:
        """In a :class:`Lookup` round: at most ``cap`` tokens to follow ``context``, which holds the
        prompt's tokens and the tokens committed so far and nothing later (the executor cuts it)."""
        return ()

    def settle(self, context: Sequence[int], cap: int = 0) -> Sequence[int]:
        """After a prompt's last round, for a policy that keeps what it saw (suffix decoding's cache
        of earlier responses): ``context`` is the whole prompt and every token committed. Proposes
        nothing; not priced (nothing waits on it)."""
        return ()

    def lookup_seconds(self, context_len: int) -> float:
        """What one :meth:`propose` over ``context_len`` tokens costs on the host's CPU, as the
        policy's implementation measured (a lookup policy's own figures; see its docs page)."""
        return 0.0

    def done(self, committed: int) -> bool:
        """Before each round: True when the engine the policy models stops decoding here, short of
        the prompt's end (llama.cpp's ``-n`` rule). Policies that keep this never stop early."""
        return False

    def kept(self, committed: int) -> int:
        """Of the ``committed`` tokens (position 0's included), those the engine outputs: all of
        them, unless it cuts what its last verification accepted past its stop (vLLM's
        ``max_tokens`` and end token). The executors count these as the prompt's tokens."""
        return committed

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, **{p.name: getattr(self, p.name) for p in self.params}}


# The largest count a parameter takes (a draft length, a tree's nodes or depth): no context a trace
# holds reaches it, and a count past it would only make a policy tabulate what no round can use
# (a draft of a billion tokens once hung `simulate` pricing every length up front).
MAX_COUNT = 100_000


def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """Validate an integer parameter once, in the constructor (scikit-learn style)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")) or value != int(value) or value < minimum:
        raise SimlabError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > MAX_COUNT:
        raise SimlabError(f"{name} must be at most {MAX_COUNT:,} (longer than any context a trace holds), got {value!r}")
    return int(value)


def check_probability(name: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or not 0 <= value <= 1:
        raise SimlabError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def check_positive(name: str, value: Any) -> float:
    """A finite number > 0 (scales, growth factors)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise SimlabError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SimlabError(f"{name} must be true or false, got {value!r}")
    return value


def check_choice(*options: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if value not in options:
            raise SimlabError(f"{name} must be one of {', '.join(options)}; got {value!r}")
        return value

    return check


COUNT = Kind(int, "integer ≥ 1", check_positive_int)
# a count whose 0 means "off" or "the trace's own" (llama.cpp's --draft-min and -n, vLLM's max_tokens)
NON_NEGATIVE = Kind(int, "integer ≥ 0", lambda name, value: check_positive_int(name, value, minimum=0))
PROBABILITY = Kind(float, "0 ≤ x ≤ 1", check_probability)
POSITIVE = Kind(float, "x > 0", check_positive)
BOOL = Kind(bool, "true or false", check_bool)


def choice(*options: str) -> Kind:
    return Kind(str, " | ".join(options), check_choice(*options))

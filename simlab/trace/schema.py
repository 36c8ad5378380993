"""What a trace holds: its tables, their columns and the manifest.

A trace is one model pair x one prompt set x one hardware x one decoding setting, stored as a
directory::

    NAME/
      manifest.json       schema version, models, hardware, temperature, command, ..., and the
                          sha256 of every table file (``checksums``: simlab.trace.checksums)
      prompts.parquet     one row per finished prompt (the commit record, written last)
      positions.parquet   one row per generated position on the target's own output path
      rollouts.parquet    the draft's own continuation after each position where it diverged,
                          and past the path's end (the tail); ``--rollout-layers``: also an
                          exit layer's own
      layers.parquet      optional: per exit layer, the early-exit token and confidence
      topk.parquet        optional (``--topk K``): the draft's top-K candidates at every position
      tree.parquet        optional (``--tree-depth D``): EAGLE-2's candidate tree at every position
      past_end.parquet    optional (``simlab vllm record``): the target's path run on past each
                          prompt's end (its end token, its budget), with the draft's signals there
      latency.parquet     forward-latency samples measured on the recording hardware

Conventions used by every table (the one place they are defined):

- ``pos`` counts generated tokens from 0; position 0 is produced by the target's prefill.
- ``context_len`` is the number of tokens already in a model's KV cache before a forward.
- Probabilities called *signals* (``draft_conf``, ``draft_entropy``) come from the raw softmax
  of the draft logits (temperature 1), because that is what SPIDE (eq. 2), SVIP and
  Draft & Verify read. Probabilities used for *acceptance* (``q_target``, ``p_target``,
  ``p_draft``, ``accept_prob``) are taken at the recorded temperature; for greedy traces
  (temperature 0) they are raw-softmax values kept as features, and acceptance is the exact
  token match.
- Entropies are in nats, times in seconds.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1

MANIFEST = "manifest.json"

# Columns of a generated position: positions.parquet, and past_end.parquet past the prompt's end.
POSITION_COLUMNS = {
    "prompt_id": "int32",
    "pos": "int32",
    "target_token": "int32",  # the target's token: the output path
    "draft_token": "int32",  # the draft's token given the true prefix
    "draft_conf": "float32",  # draft top-1 probability (SPIDE eq. 2)
    "draft_entropy": "float32",  # draft entropy in nats (SVIP, AdaEDL)
    "q_target": "float32",  # draft probability of the target token
    "p_target": "float32",  # target probability of the target token
    "p_draft": "float32",  # target probability of the draft token
    "accept_prob": "float32",  # sum_x min(p, q) at the recorded temperature
}

# table name -> {column: arrow type name}. Columns listed here are required; a table may carry
# extra columns (e.g. ``predictor_score`` or ``feat_*`` features) which are kept as they are.
TABLES: dict[str, dict[str, str]] = {
    "prompts": {
        "prompt_id": "int32",
        "source": "string",  # where the prompt came from, e.g. "humaneval/HumanEval/3"
        "prompt_len": "int32",  # tokens in the (templated) prompt
        "n_tokens": "int32",  # generated tokens recorded for this prompt
        "stop": "string",  # "eos" or "length"
        "prompt_text": "string",
    },
    "positions": POSITION_COLUMNS,
    "rollouts": {
        "prompt_id": "int32",
        "pos": "int32",  # the position where the draft diverged from the target; n_tokens: the tail
        "step": "int32",  # the draft at position pos + step: 1 = right after its own wrong token; 0 only in the tail
        "token": "int32",
        "draft_conf": "float32",
        "draft_entropy": "float32",
        # whose continuation: -1 (NO_LAYER) the trace's draft; l >= 1 exit layer l, continuing
        # from its own wrong token at a position where its early-exit token (layers.parquet)
        # differs from the target's
        "layer": "int32",
    },
    # the path past each prompt's end, positions n_tokens, n_tokens + 1, ...: the target decoding on
    # as if it had not stopped (past its end token, past the budget), the draft given that prefix;
    # what an engine that drafts and verifies past the end (vLLM) meets there (simlab.trace.past_end)
    "past_end": POSITION_COLUMNS,
    "layers": {
        "prompt_id": "int32",
        "pos": "int32",
        "layer": "int32",  # exit layer l: the first l decoder layers, final norm, LM head
        "token": "int32",
        "draft_conf": "float32",
        "draft_entropy": "float32",
    },
    "topk": {
        "prompt_id": "int32",
        "pos": "int32",
        "rank": "int32",  # 0 = the draft's greedy token; K rows per position
        "token": "int32",
        "prob": "float32",  # draft probability given the true prefix (raw softmax)
    },
    "tree": {
        "prompt_id": "int32",
        "pos": "int32",  # the position the tree starts at (its root is the token before)
        "node": "int32",  # 0.. in creation order, per position
        "parent": "int32",  # -1: the root
        "rank": "int32",  # which of the parent's top-K candidates the node is
        "token": "int32",
        "prob": "float32",  # draft probability of the token given the node's own prefix
    },
    "latency": {
        "op": "string",  # one of LATENCY_OPS
        "k": "int32",  # new tokens in the forward (1 for a draft step; tree ops: tokens under the tree mask; exit_head: rows)
        "context_len": "int32",
        "layer": "int32",  # exit layer of a self-speculative draft step or tree expansion; -1 otherwise
        "corun": "bool",  # measured while the other model was running on the same device
        "repeat": "int32",
        "seconds": "float64",
        "batch": "int32",  # sequences in the forward, each bringing k new tokens at context_len
    },
}

NO_LAYER = -1

# Columns added after traces were first shipped: a table written without one reads as if every
# row held this value (latency samples probed before the batch axis are of one sequence;
# rollouts recorded before exit layers had their own are the draft's).
DEFAULTED_COLUMNS: dict[str, dict[str, object]] = {"latency": {"batch": 1}, "rollouts": {"layer": NO_LAYER}}


def with_defaults(name: str, df):
    """``df`` (a DataFrame of table ``name``) with any missing :data:`DEFAULTED_COLUMNS` filled."""
    missing = {c: v for c, v in DEFAULTED_COLUMNS.get(name, {}).items() if c not in df.columns}
    return df.assign(**missing) if missing else df

class Topology(str, enum.Enum):
    """Where the draft and the target compute (what parallel rounds cost: see
    :mod:`simlab.sim.devices`). Defined with the trace because a trace records it."""

    TWO_DEVICES = "two-devices"
    ONE_DEVICE = "one-device"


OPTIONAL_TABLES = frozenset({"layers", "topk", "tree", "past_end"})
# Forwards the latency probe times: the draft's one-token step and the target's k-token forward
# (every trace has both), and, from the probe's tree axis, the same forwards under a tree
# attention mask: the target's verification of a tree (k tokens: the last committed one and
# k - 1 nodes) and the draft's expansion of one level (k nodes); from the probe's exit-head axis
# the target's final norm and LM head over k rows of hidden state (DEL's shadow tokens read one
# per exit layer; context_len 0: it reads no KV cache). simlab.record.latency says how. An engine
# whose one-token target forward is not its plain decoding step (llama.cpp's verification also
# runs the draft) times that step on its own as target_step (k = 1): the autoregressive baseline.
# A prompt's prefill as a server runs it (k prompt tokens, only the last position's logits) may be
# timed too, the target's and the draft's apart: target_prefill, draft_prefill.
REQUIRED_LATENCY_OPS = ("draft_step", "target_forward")
LATENCY_OPS = (*REQUIRED_LATENCY_OPS, "target_tree", "draft_tree", "exit_head", "target_step", "target_prefill",
               "draft_prefill")
NOT_IN_TOPK = -1  # a target token's rank when it is not among the draft's recorded top-K
# No forward of any model on any hardware simlab targets takes an hour: a latency sample (or a
# latency model's answer) above this is a unit mistake or corruption, not a measurement.
MAX_FORWARD_SECONDS = 3600.0


@dataclass
class Manifest:
    """Everything needed to reproduce or judge a trace, stored as ``manifest.json``.

    ``kind`` is ``"recorded"`` for traces of real models and ``"synthetic"`` for generated
    ones; tools print the kind so that synthetic numbers are never mistaken for measurements.
    """

    kind: str
    draft_model: str
    target_model: str
    dataset: str
    hardware: str
    device: str = "cpu"
    dtype: str = "float32"
    tokenizer: str = ""
    temperature: float = 0.0
    seed: int = 0
    max_new_tokens: int = 0
    rollout_len: int = 0
    exit_layers: list[int] = field(default_factory=list)
    n_layers: int = 0  # decoder layers of the target (for self-speculative traces)
    # Self-speculative traces (no separate draft model): the exit layer whose early-exit
    # signals fill the draft columns of positions.parquet, so serial policies run unchanged.
    draft_layer: int = NO_LAYER
    # Exit layers whose own divergence rollouts every prompt holds (``--rollout-layers``;
    # rollouts.parquet rows of that ``layer``). A layer joins the list once the last prompt
    # lacking it has them, so a recording interrupted while adding a layer leaves it out.
    rollout_layers: list[int] = field(default_factory=list)
    # Tree data (simlab.record.tree_expansion): K candidates per position in topk.parquet (0:
    # none), and the depth of the EAGLE-2 trees of top-k K in tree.parquet (0: none).
    topk: int = 0
    tree_depth: int = 0
    # Where the two models computed while recording: "one-device" or "two-devices". Empty in
    # traces written before the field existed; :meth:`recorded_topology` derives it then.
    topology: str = ""
    eos_token_ids: list[int] = field(default_factory=list)
    command: str = ""
    created: str = ""
    libraries: dict[str, str] = field(default_factory=dict)
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def recorded_topology(self) -> Topology:
        """The topology the trace's latencies were measured in: the default of every simulation.

        The ``topology`` field when set. Older traces lack it, and the rule is then: a recorded
        trace was one device (``simlab record`` has always loaded draft and target on the one
        ``device`` of the manifest, and measured co-running latencies there); a synthetic trace
        is the papers' setup of two accelerators, the only one its made-up latencies describe.
        """
        if self.topology:
            return Topology(self.topology)
        return Topology.TWO_DEVICES if self.kind == "synthetic" else Topology.ONE_DEVICE

"""What a loaded trace must satisfy before anything replays it, and where it first does not.

A value the simulator cannot use must stop the load, never reach a policy: a NaN entropy makes
SVIP's stop rule never fire, a null token counts as a rejection, one 1e300 s latency sample
turns a speedup into 81,600x. So every column has a rule (:data:`RULES`: no nulls, finite,
within a range), checked on every row; a message names the table, the column, the first bad
row's prompt and position (or latency point) and how many rows are bad. The manifest's fields
are checked against the types :class:`~simlab.trace.schema.Manifest` declares.

The checks read the tables' numpy columns (:meth:`~simlab.trace.tables.Trace.columns`), so that
loading a trace imports no pandas; only those of the exit layers' and the past-the-end tables,
which few traces hold, read DataFrames.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from simlab.common.errors import SimlabError
from simlab.trace.schema import (
    LATENCY_OPS,
    MAX_FORWARD_SECONDS,
    NO_LAYER,
    REQUIRED_LATENCY_OPS,
    Manifest,
    with_defaults,
)
from simlab.trace.tables import Columns, Trace

PROB_SLACK = 1e-5  # float32 softmax sums may exceed 1 by a rounding error
ENTROPY_SLACK = 1e-6


@dataclass(frozen=True)
class Rule:
    """Every value of a column is present, finite (numbers) and within [low, high]."""

    low: float = -math.inf
    high: float = math.inf
    what: str = "null"  # what is wrong with a bad value, for messages

    def bad(self, values: np.ndarray) -> np.ndarray:
        """Per value, whether it breaks the rule: of text or truth values only a missing one (an
        integer column with a missing value reads as floats, the missing one NaN)."""
        if values.dtype.kind in "OUSb":
            return np.fromiter((_missing(v) for v in values), dtype=bool, count=len(values))
        v = values.astype(float)
        return ~(np.isfinite(v) & (v >= self.low) & (v <= self.high))


def _missing(value) -> bool:
    return value is None or (isinstance(value, (float, np.floating)) and math.isnan(value))


PRESENT = Rule()
NATURAL = Rule(0, what="null or negative")
POSITIVE = Rule(1, what="null or below 1")
PROB = Rule(0, 1 + PROB_SLACK, "null, not finite or outside [0, 1]")
ENTROPY = Rule(-ENTROPY_SLACK, what="null, not finite or negative")

# table -> column -> rule; every required column of every table has one.
RULES: dict[str, dict[str, Rule]] = {
    "prompts": {"prompt_id": NATURAL, "source": PRESENT, "prompt_len": NATURAL, "n_tokens": POSITIVE,
                "stop": PRESENT, "prompt_text": PRESENT},
    "positions": {"prompt_id": NATURAL, "pos": NATURAL, "target_token": NATURAL, "draft_token": NATURAL,
                  "draft_conf": PROB, "draft_entropy": ENTROPY, "q_target": PROB, "p_target": PROB,
                  "p_draft": PROB, "accept_prob": PROB},
    "rollouts": {"prompt_id": NATURAL, "pos": NATURAL, "step": NATURAL, "token": NATURAL,
                 "draft_conf": PROB, "draft_entropy": ENTROPY,
                 "layer": Rule(NO_LAYER, what=f"null or below {NO_LAYER}")},
    "layers": {"prompt_id": NATURAL, "pos": NATURAL, "layer": POSITIVE, "token": NATURAL,
               "draft_conf": PROB, "draft_entropy": ENTROPY},
    "topk": {"prompt_id": NATURAL, "pos": NATURAL, "rank": NATURAL, "token": NATURAL, "prob": PROB},
    "tree": {"prompt_id": NATURAL, "pos": NATURAL, "node": NATURAL, "parent": Rule(-1, what="null or below -1"),
             "rank": NATURAL, "token": NATURAL, "prob": PROB},
    "latency": {"op": PRESENT, "k": POSITIVE, "context_len": NATURAL,
                "layer": Rule(NO_LAYER, what=f"null or below {NO_LAYER}"), "corun": PRESENT, "repeat": NATURAL,
                "batch": POSITIVE, "seconds": Rule(np.nextafter(0, 1), MAX_FORWARD_SECONDS,
                                f"null, not finite, not positive or above {MAX_FORWARD_SECONDS:g} s")},
}

RULES["past_end"] = RULES["positions"]  # the same columns, past each prompt's end


def _row(table: Columns, i: int) -> str:
    """Where row ``i`` of a table is, in the trace's own terms."""
    def at(col: str) -> str:
        return _shown(table[col][i])

    if "prompt_id" in table:
        return f"prompt {at('prompt_id')}" + (f", position {at('pos')}" if "pos" in table else "")
    return f"row {i} ({at('op')}, k={at('k')}, context_len={at('context_len')})"


def _shown(value) -> str:
    """A cell as a user wrote it: 3 rather than 3.0 or np.int32(3)."""
    if _missing(value):
        return "null" if value is None else "NaN"
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value.item() if hasattr(value, "item") else value)


def check_columns(name: str, table: Columns, where: str) -> None:
    """Apply :data:`RULES` to table ``name``; raise on the first column with a bad value."""
    for col, rule in RULES[name].items():
        bad = rule.bad(table[col])
        if bad.any():
            first, n = int(np.flatnonzero(bad)[0]), int(bad.sum())
            raise SimlabError(f"{where}: {name}.parquet column {col!r} has {n} value{'s' * (n > 1)} "
                              f"{rule.what}; the first is {_shown(table[col][first])} at {_row(table, first)}")


_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "list[int]": (list,), "dict": (dict,)}


def check_manifest_types(data: dict, where: str) -> None:
    """Each manifest field holds the type :class:`Manifest` declares (``temperature`` a number,
    ``exit_layers`` a list of integers...)."""
    for f in dataclasses.fields(Manifest):
        if f.name not in data:
            continue
        value, declared = data[f.name], str(f.type)
        kinds = _TYPES.get(declared, _TYPES["dict"] if declared.startswith("dict") else None)
        ok = isinstance(value, kinds) and not isinstance(value, bool)
        if ok and declared == "list[int]":
            ok = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if ok and declared == "float":
            ok = math.isfinite(value)
        if not ok:
            raise SimlabError(f"{where}: manifest.json field {f.name!r} must be {declared}, got {value!r}")


def validate(trace: Trace) -> None:
    """Check the invariants that the simulator relies on; raise :class:`SimlabError`."""
    where = f"trace {trace.path}" if trace.path else "trace"
    m = trace.manifest
    if not (m.temperature >= 0) or math.isinf(m.temperature):
        raise SimlabError(f"{where}: temperature must be >= 0, got {m.temperature}")
    if trace.n_prompts == 0:
        raise SimlabError(f"{where}: prompts.parquet lists no prompts")
    for name in ("prompts", "positions", "rollouts", "layers", "topk", "tree", "past_end", "latency"):
        if trace.has(name):
            check_columns(name, trace.columns(name), where)
    _check_positions(trace, where)
    _check_layers(trace, where)
    _check_rollout_layers(trace, where)
    _check_rollout_tails(trace, where)
    _check_trees(trace, where)
    _check_past_end(trace, where)
    validate_latency(trace.columns("latency"), where)


def _check_positions(trace: Trace, where: str) -> None:
    prompts = trace.columns("prompts")
    pos = trace.columns("positions").sorted_by(["prompt_id", "pos"])
    ids, n_tokens = prompts["prompt_id"], prompts["n_tokens"]
    if len(set(ids.tolist())) != len(ids):
        raise SimlabError(f"{where}: prompts.parquet lists a prompt_id twice")
    # each prompt's rows: its count, first and last position (rows sorted by prompt and position)
    pid, at = pos["prompt_id"], pos["pos"]
    starts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]]) if len(pid) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(pid)]
    have, count, low, high = pid[starts], ends - starts, at[starts], at[ends - 1]
    # checked for every prompt at once; the loop below only words the first failure
    i = np.minimum(np.searchsorted(have, ids), max(len(have) - 1, 0))
    listed = (i < len(have)) & (have[i] == ids) if len(have) else np.zeros(len(ids), bool)
    fine = listed & (count[i] == n_tokens) & (low[i] == 0) & (high[i] == n_tokens - 1) if len(have) else listed
    for row in np.flatnonzero(~fine).tolist():
        prompt, n, c = ids[row], int(n_tokens[row]), i[row]
        if not listed[row]:
            raise SimlabError(f"{where}: prompt {prompt} has no rows in positions.parquet")
        raise SimlabError(
            f"{where}: prompt {prompt} should have positions 0..{n - 1} exactly once in "
            f"positions.parquet (found {int(count[c])} rows, {int(low[c])}..{int(high[c])})"
        )
    if ((pid[1:] == pid[:-1]) & (at[1:] == at[:-1])).any():
        raise SimlabError(f"{where}: positions.parquet has a (prompt_id, pos) pair twice")


def _check_past_end(trace: Trace, where: str) -> None:
    """past_end.parquet continues a prompt's path: positions n_tokens, n_tokens + 1, ... each once
    (a prompt may have none)."""
    past = trace.past_end
    if past is None or past.empty:
        return
    n = past["prompt_id"].map(trace.prompts.set_index("prompt_id")["n_tokens"])
    if n.isna().any():
        first = past.loc[n.isna(), "prompt_id"].iat[0]
        raise SimlabError(f"{where}: past_end.parquet has rows of prompt {first}, which prompts.parquet does not list")
    t = past.assign(n=n.astype(int)).sort_values(["prompt_id", "pos"], kind="stable")
    offset = t.groupby("prompt_id").cumcount().to_numpy()
    bad = t["pos"].to_numpy() != t["n"].to_numpy() + offset
    if bad.any():
        row = t.iloc[int(np.flatnonzero(bad)[0])]
        raise SimlabError(f"{where}: past_end.parquet must continue each prompt's path from its n_tokens, one row per "
                          f"position; prompt {row['prompt_id']} has position {row['pos']} where "
                          f"{row['n'] + offset[int(np.flatnonzero(bad)[0])]} was due")


def _check_layers(trace: Trace, where: str) -> None:
    m, layers = trace.manifest, trace.layers
    if layers is None:
        if m.exit_layers or m.draft_layer != NO_LAYER:
            raise SimlabError(f"{where}: layers.parquet is missing, but manifest.json names exit layers "
                              f"{m.exit_layers} (draft_layer {m.draft_layer}); a self-speculative trace needs it")
        return
    unknown = sorted(set(layers["layer"].unique()) - set(m.exit_layers))
    if unknown:
        raise SimlabError(f"{where}: layers.parquet has exit layers {unknown} that manifest.json's exit_layers "
                          f"{m.exit_layers} does not list")
    if layers.empty:
        return
    per = layers.groupby(["prompt_id", "layer"])["pos"].count()
    n = trace.prompts.set_index("prompt_id")["n_tokens"]
    short = [key for key, count in per.items() if count != n.get(key[0], -1)]
    if short:
        raise SimlabError(f"{where}: layers.parquet must cover every position of each prompt and layer; "
                          f"(prompt_id, layer) {short[0]} does not")


def _check_rollout_layers(trace: Trace, where: str) -> None:
    """Rollouts of an exit layer follow its recorded early-exit tokens, so the layer must be
    recorded (and not be the draft layer, whose rollouts are the draft's); a layer the manifest
    lists in ``rollout_layers`` has a rollout at every position where it diverges, as the
    replay then never stands in for one."""
    m = trace.manifest
    named = set(trace.columns("rollouts")["layer"].tolist()) - {NO_LAYER} | set(m.rollout_layers)
    allowed = set(m.exit_layers) - {m.draft_layer}
    if not named <= allowed:
        raise SimlabError(f"{where}: rollouts of exit layers {sorted(named - allowed)}, which are not among "
                          f"manifest.json's exit_layers {m.exit_layers} less the draft layer {m.draft_layer}")
    if not m.rollout_layers:
        return
    keys = ["prompt_id", "layer", "pos"]
    rollouts = with_defaults("rollouts", trace.rollouts)
    layers = trace.layers[trace.layers["layer"].isin(m.rollout_layers)]
    layers = layers.merge(trace.positions[["prompt_id", "pos", "target_token"]], on=["prompt_id", "pos"])
    diverged = layers.loc[layers["token"] != layers["target_token"], keys]
    rolled = rollouts.loc[rollouts["layer"].isin(m.rollout_layers), keys].drop_duplicates()
    missing = diverged.merge(rolled, on=keys, how="left", indicator=True)
    missing = missing[missing["_merge"] == "left_only"]
    if not missing.empty:
        first = missing.iloc[0]
        raise SimlabError(f"{where}: manifest.json lists rollout_layers {m.rollout_layers}, but exit layer "
                          f"{first['layer']} has no rollout at prompt {first['prompt_id']}, position {first['pos']}, "
                          f"where it diverged ({len(missing)} such positions)")


def _check_rollout_tails(trace: Trace, where: str) -> None:
    """A rollout starts at a divergence (pos < n_tokens, from step 1) or is the tail past the
    path's end (pos = n_tokens, from step 0); the replay reads step 0 only of a tail."""
    rollouts, prompts = trace.columns("rollouts"), trace.columns("prompts")
    n = _n_tokens_of(rollouts["prompt_id"], prompts)
    at, step = rollouts["pos"], rollouts["step"]
    bad = ((step == 0) & (at != n)) | (at > n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SimlabError(f"{where}: rollouts.parquet has a row at {_row(rollouts, i)}, step "
                          f"{_shown(step[i])}: step 0 belongs only to the tail, the rollout at the "
                          "prompt's n_tokens, and no rollout starts past it")


def _n_tokens_of(ids: np.ndarray, prompts: Columns) -> np.ndarray:
    """The n_tokens of each prompt of ``ids`` (floats: NaN for one prompts.parquet does not list)."""
    order = np.argsort(prompts["prompt_id"], kind="stable")
    listed, n = prompts["prompt_id"][order], prompts["n_tokens"][order].astype(float)
    if not len(listed):
        return np.full(len(ids), np.nan)
    i = np.minimum(np.searchsorted(listed, ids), len(listed) - 1)
    return np.where(listed[i] == ids, n[i], np.nan)


def _check_trees(trace: Trace, where: str) -> None:
    """topk.parquet: ranks 0..K-1 at every position (K = the manifest's ``topk``); tree.parquet:
    per position, nodes 0.. in order, each parent an earlier node (or -1), K children per
    expanded node, at most the manifest's ``tree_depth`` levels."""
    m, n = trace.manifest, int(trace.columns("prompts")["n_tokens"].sum())
    for name, field in (("topk", m.topk), ("tree", m.tree_depth)):
        if (not trace.has(name)) != (field == 0):
            flag = "--topk" if name == "topk" else "--tree-depth"
            raise SimlabError(f"{where}: manifest.json says {name if name == 'topk' else 'tree_depth'}={field} "
                              f"but {name}.parquet is {'present' if field == 0 else 'missing'} (recorded with {flag})")
    if m.tree_depth and m.topk < 1:
        raise SimlabError(f"{where}: manifest.json has tree_depth {m.tree_depth} but topk {m.topk}")
    if trace.has("topk"):
        t = trace.columns("topk").sorted_by(["prompt_id", "pos", "rank"])
        expected = np.tile(np.arange(m.topk), n)
        if len(t) != n * m.topk or not np.array_equal(t["rank"], expected):
            raise SimlabError(f"{where}: topk.parquet must hold ranks 0..{m.topk - 1} at every position of every "
                              f"prompt ({n * m.topk} rows); it has {len(t)}")
    if trace.has("tree"):
        t = trace.columns("tree").sorted_by(["prompt_id", "pos", "node"])
        keys = t["prompt_id"].astype(np.int64) * (1 << 32) + t["pos"]
        first = np.r_[True, keys[1:] != keys[:-1]]
        node = np.arange(len(t)) - np.maximum.accumulate(np.where(first, np.arange(len(t)), 0))
        parent = t["parent"]
        size = m.topk + (m.tree_depth - 1) * m.topk ** 2
        counts = np.diff(np.r_[np.flatnonzero(first), len(t)])
        bad = (t["node"] != node) | (parent >= node)
        if bad.any() or len(counts) != n or (counts != size).any():
            raise SimlabError(f"{where}: tree.parquet must hold, at every position, nodes 0..{size - 1} (EAGLE-2 "
                              f"trees of top-k {m.topk}, depth {m.tree_depth}) each after its parent")
        _check_expansions(t, m.topk, m.tree_depth, where)
    if trace.has("topk"):
        _check_topk(trace, m.topk, where)


def _check_topk(trace: Trace, k: int, where: str) -> None:
    """topk.parquet, position by position: the draft's top-K candidates are distinct tokens in
    order of probability (what a fixed tree's ranks mean)."""
    t = trace.columns("topk").sorted_by(["prompt_id", "pos", "rank"])
    bad = _unordered(t["token"].reshape(-1, k), t["prob"].reshape(-1, k))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SimlabError(f"{where}: topk.parquet at {_row(t, i * k)} does not hold a top-{k}: a position's candidates "
                          "must be distinct tokens in order of probability, rank 0 first")


def _check_expansions(t: Columns, k: int, depth: int, where: str) -> None:
    """tree.parquet, position by position (``t`` sorted by prompt, position and node), as the
    recorder writes EAGLE-2's expansion (simlab.record.tree_expansion): level 1 is the root's
    top-K; level l >= 2 is K blocks of K children, ranks 0..K-1 in order of probability, the
    children of level l - 1's K nodes of largest value (the product of probabilities on the path,
    in float64 parent first, ties to the earlier node), best first. A replay reads its trees from
    these nodes; a table that breaks the rule replays trees that were never drafted."""
    size = k + (depth - 1) * k * k
    parent, rank = t["parent"].reshape(-1, size), t["rank"].reshape(-1, size)
    token, prob = t["token"].reshape(-1, size), t["prob"].reshape(-1, size)
    rows = len(parent)
    bad = (rank != np.tile(np.arange(k), size // k)).any(axis=1) | (parent[:, :k] != -1).any(axis=1)
    bad |= _unordered(token.reshape(-1, k), prob.reshape(-1, k)).reshape(rows, -1).any(axis=1)
    value = prob[:, :k].astype(np.float64)  # the newest level's values
    start = 0  # the newest level's first node
    for level in range(2, depth + 1):
        first = k + (level - 2) * k * k
        blocks = parent[:, first : first + k * k].reshape(rows, k, k)
        best = np.argsort(-value, axis=1, kind="stable")[:, :k] + start  # the recorder's frontier, best first
        bad |= (blocks != blocks[:, :, :1]).any(axis=(1, 2)) | (blocks[:, :, 0] != best).any(axis=1)
        picked = np.take_along_axis(value, np.clip(blocks[:, :, 0] - start, 0, value.shape[1] - 1), axis=1)
        value = (picked[:, :, None] * prob[:, first : first + k * k].reshape(rows, k, k).astype(np.float64)).reshape(rows, -1)
        start = first
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SimlabError(f"{where}: tree.parquet is not an EAGLE-2 expansion at {_row(t, i * size)}: level 1 must be "
                          f"the root's top-{k}, each further level the top-{k} children (ranks in order of probability) "
                          f"of the {k} nodes of largest value of the level before, best first")


def _unordered(token: np.ndarray, prob: np.ndarray) -> np.ndarray:
    """Per row of candidates in rank order: whether their probabilities rise or a token repeats."""
    ordered = np.sort(token, axis=1)
    return (np.diff(prob, axis=1) > 0).any(axis=1) | (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)


def validate_latency(lat: Columns, where: str) -> None:
    """Latency samples must be finite, positive, plausible and of known operations."""
    if not len(lat):
        raise SimlabError(f"{where}: latency.parquet has no samples")
    check_columns("latency", lat, where)
    ops = set(lat["op"].tolist()) - set(LATENCY_OPS)
    if ops:
        raise SimlabError(f"{where}: latency.parquet has unknown ops {sorted(ops)}; expected {list(LATENCY_OPS)}")
    for op in REQUIRED_LATENCY_OPS:
        if not ((lat["op"] == op) & (lat["batch"] == 1)).any():
            raise SimlabError(f"{where}: latency.parquet has no single-sequence (batch 1) {op!r} samples")

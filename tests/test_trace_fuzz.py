"""Generated damage: random NaN, null, infinite, negative and huge values in random cells of a
trace written to disk. Loading and simulating it must either refuse in one line
(:class:`SimlabError`) or, only when every planted value is a valid one, give a finite result;
never a traceback, never a silent answer from a value no trace can hold.

The validity oracle below is written from the schema's documentation (probabilities in
[0, 1], entropies and token ids >= 0, latencies in (0 s, 1 h]), not from the checks it tests.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simlab.common.errors import SimlabError
from simlab.sim.run import Simulator
from simlab.trace.io import read_trace, write_trace
from simlab.trace.synth import SynthSpec, synth_trace
from tests.helpers import put_table

HOUR = 3600.0
PROB = (0.0, 1.0)
NONNEG = (0.0, math.inf)
# Columns whose values any number in range may take without making the trace inconsistent,
# with their valid range: a planted value must be refused exactly when it lies outside.
VALUE_COLUMNS = {
    ("positions", "target_token"): NONNEG, ("positions", "draft_token"): NONNEG,
    ("positions", "draft_conf"): PROB, ("positions", "draft_entropy"): NONNEG, ("positions", "q_target"): PROB,
    ("positions", "p_target"): PROB, ("positions", "p_draft"): PROB, ("positions", "accept_prob"): PROB,
    ("rollouts", "token"): NONNEG, ("rollouts", "draft_conf"): PROB, ("rollouts", "draft_entropy"): NONNEG,
    ("latency", "seconds"): (1e-300, HOUR),
}
# Columns that tie rows together (ids, positions, counts): a planted value may also break the
# trace's structure, so an invalid value must be refused and a valid one may be.
STRUCTURE_COLUMNS = [("positions", "prompt_id"), ("positions", "pos"), ("prompts", "n_tokens"),
                     ("prompts", "prompt_id"), ("rollouts", "step"), ("rollouts", "pos"), ("latency", "k"),
                     ("latency", "context_len")]
STRUCTURE_VALID = {"step": (1, math.inf), "k": (1, math.inf), "n_tokens": (1, math.inf)}

FLOATS = st.sampled_from([None, math.nan, math.inf, -math.inf, -1.0, -1e-9, 0.0, 1e-3, 0.5, 1.0, 1.5, 7.0, 1e300])
INTS = st.sampled_from([None, -1, 0, 1, 3, 2**31 - 1])
CELLS = st.tuples(st.sampled_from([*VALUE_COLUMNS, *STRUCTURE_COLUMNS]), st.integers(0, 10_000), st.data())


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    spec = SynthSpec(prompts=3, tokens=12, rollout=3, seed=1)
    return write_trace(synth_trace(spec, command="test"), tmp_path_factory.mktemp("fuzz") / "base")


def _plant(root: Path, table: str, column: str, row: int, value) -> tuple[int, object]:
    """Put ``value`` in one cell, keeping the column's type; return the row and the value as stored."""
    path = root / f"{table}.parquet"
    t = pq.read_table(path)
    i = t.schema.get_field_index(column)
    field = t.schema.field(i)
    values = t[column].to_pylist()
    row %= len(values)
    values[row] = value
    array = pa.array(values, type=pa.float64() if pa.types.is_floating(field.type) else field.type)
    put_table(root, table, t.set_column(i, field, array.cast(field.type, safe=False)))
    return row, pq.read_table(path)[column].to_pylist()[row]


def _valid(value, low: float, high: float) -> bool:
    return value is not None and math.isfinite(value) and low <= value <= high


@settings(max_examples=80, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(CELLS, min_size=1, max_size=3), policy=st.sampled_from(["sd", "svip", "dv"]))
def test_damaged_trace_is_refused_or_valid(base, cells, policy):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"
        write_trace(read_trace(base), root)
        planted = {}  # (table, column, row) -> the value as stored (a later draw may overwrite a cell)
        for (table, column), row, data in cells:
            is_int = column in ("target_token", "draft_token", "token") or (table, column) in STRUCTURE_COLUMNS
            row, planted[table, column, row] = _plant(root, table, column, row, data.draw(INTS if is_int else FLOATS))
        must_refuse, may_refuse = False, False
        for (table, column, _), stored in planted.items():
            if (table, column) in VALUE_COLUMNS:
                must_refuse |= not _valid(stored, *VALUE_COLUMNS[table, column])
            else:
                may_refuse = True
                must_refuse |= not _valid(stored, *STRUCTURE_VALID.get(column, NONNEG))
        try:
            trace = read_trace(root)
            summary = Simulator(trace).run(policy, {}).summary
        except SimlabError as exc:
            assert "\n" not in str(exc)
            assert must_refuse or may_refuse, f"a valid trace was refused: {exc}"
            return
        assert not must_refuse, f"a trace with an invalid value was simulated: {cells}"
        assert math.isfinite(summary.speedup) and summary.speedup > 0

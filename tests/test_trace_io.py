"""The trace round-trips, and every kind of bad file gets a one-line explanation."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from simlab.trace import read_trace, write_trace
from simlab.trace.checksums import rehash
from simlab.trace.synth import SynthSpec, synth_trace
from tests.helpers import expect_error, put_table


@pytest.fixture()
def trace():
    return synth_trace(SynthSpec(prompts=3, tokens=40, seed=1), command="test")


@pytest.fixture()
def written(trace, tmp_path):
    return write_trace(trace, tmp_path / "t")


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False)


def test_write_then_read_gives_identical_tables_and_manifest(trace, written):
    back = read_trace(written)
    assert back.manifest == trace.manifest
    for name in ("prompts", "positions", "rollouts", "latency"):
        _same(getattr(back, name), getattr(trace, name))
    assert back.layers is None
    # and a second write of what was read is byte-identical in content
    again = read_trace(write_trace(back, written.parent / "again"))
    for name in ("prompts", "positions", "rollouts", "latency"):
        _same(getattr(again, name), getattr(back, name))


def test_rows_of_an_uncommitted_prompt_are_ignored(trace, written):
    """A recorder killed after writing positions but before prompts.parquet leaves extra rows."""
    pos = pd.concat([trace.positions, trace.positions[trace.positions.prompt_id == 0].assign(prompt_id=99)])
    put_table(written, "positions", pos)
    back = read_trace(written)
    assert 99 not in set(back.positions.prompt_id)
    assert len(back.positions) == len(trace.positions)


def test_missing_directory(tmp_path):
    expect_error(tmp_path / "nope", "trace not found")


def test_not_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    expect_error(f, "is not a directory")


def test_tables_without_manifest_are_an_interrupted_write(written):
    (written / "manifest.json").unlink()
    expect_error(written, "incomplete trace (interrupted write?)", "no manifest.json")


def test_directory_without_trace_files_is_not_a_trace(tmp_path):
    expect_error(tmp_path, "manifest.json is missing")


def test_manifest_not_json(written):
    (written / "manifest.json").write_text("{not json")
    expect_error(written, "not valid JSON")


def test_other_schema_version(written):
    data = json.loads((written / "manifest.json").read_text())
    data["schema_version"] = 999
    (written / "manifest.json").write_text(json.dumps(data))
    expect_error(written, "schema version 999", "reads version 1")


def test_unknown_manifest_field(written):
    data = json.loads((written / "manifest.json").read_text())
    data["colour"] = "blue"
    (written / "manifest.json").write_text(json.dumps(data))
    expect_error(written, "unknown fields", "colour")


def test_missing_table(written):
    (written / "positions.parquet").unlink()
    expect_error(written, "incomplete trace (interrupted write?)", "positions.parquet is missing")


def test_corrupt_parquet(written):
    (written / "latency.parquet").write_bytes(b"PAR1 this is not parquet")
    rehash(written)
    expect_error(written, "latency.parquet is not a readable Parquet file")


def test_missing_column(written, trace):
    put_table(written, "positions", trace.positions.drop(columns=["draft_conf"]))
    expect_error(written, "positions.parquet lacks columns", "draft_conf")


def test_wrong_column_type(written, trace):
    pos = trace.positions.assign(draft_conf="high")
    put_table(written, "positions", pos)
    expect_error(written, "column 'draft_conf'")


@pytest.mark.parametrize("bad", [np.nan, -0.5, 0.0, np.inf])
def test_bad_latency_values(written, trace, bad):
    lat = trace.latency.copy()
    lat.loc[0, "seconds"] = bad
    put_table(written, "latency", lat)
    expect_error(written, "latency.parquet column 'seconds' has 1 value null, not finite, not positive")


def test_probability_out_of_range(written, trace):
    pos = trace.positions.copy()
    pos.loc[3, "draft_conf"] = 1.5
    put_table(written, "positions", pos)
    expect_error(written, "draft_conf", "outside [0, 1]")


def test_positions_with_a_gap(written, trace):
    pos = trace.positions.drop(index=5)
    put_table(written, "positions", pos)
    expect_error(written, "prompt 0 should have positions 0..39")


@pytest.mark.parametrize("pos, step", [(5, 0), (41, 1)])
def test_a_rollout_step_0_off_the_tail_or_a_rollout_past_it(written, trace, pos, step):
    """Step 0 belongs to the tail only (pos = n_tokens = 40), and nothing starts past it."""
    rollouts = trace.rollouts.copy()
    rollouts.loc[0, ["pos", "step"]] = [pos, step]
    put_table(written, "rollouts", rollouts)
    expect_error(written, f"position {pos}, step {step}: step 0 belongs only to the tail")


def test_writing_leaves_no_temporary_files(written):
    assert not [f for f in os.listdir(written) if f.startswith(".")]

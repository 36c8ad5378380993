"""Every table file of a trace against the sha256 its manifest lists: one flipped byte anywhere
is refused in one line naming the file; a recorder killed between the renames of an update still
leaves a trace that loads; a trace without digests loads with a note; ``rehash`` changes nothing
but the manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import simlab.trace.io as trace_io
from simlab.common.locations import TRACES
from simlab.trace.checksums import CHECKSUMS, TABLE_FILES, file_digests, rehash
from simlab.trace.io import read_trace, update_trace, write_trace
from simlab.trace.synth import SynthSpec, synth_trace
from tests.helpers import expect_error

TREES = TRACES / "smollm2-tree"  # every optional table but past_end: layers, topk, tree
PAST_END = Path(__file__).resolve().parents[1] / "results" / "vllm" / "traces" / "qwen-coder-humaneval-vllm"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    return write_trace(synth_trace(SynthSpec(prompts=3, tokens=20, seed=1), command="test"),
                       tmp_path_factory.mktemp("sums") / "t")


def _copy(trace: Path, tmp_path: Path) -> Path:
    shutil.copytree(trace, tmp_path / "t")
    return tmp_path / "t"


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def _manifest(trace: Path) -> dict:
    return json.loads((trace / "manifest.json").read_text())


@pytest.mark.parametrize("source", [TREES, PAST_END], ids=["tree-trace", "vllm-trace"])
def test_one_flipped_byte_in_any_table_is_refused_naming_the_file(source, tmp_path):
    """At the start (the magic), in the data pages and in the footer (schema, statistics): the
    bytes that Parquet's page checksums would not all cover."""
    trace = _copy(source, tmp_path)
    for file in [f for f in TABLE_FILES if (trace / f).exists()]:
        pristine = (trace / file).read_bytes()
        for offset in (0, len(pristine) // 2, -20):
            _flip(trace / file, offset)
            expect_error(trace, f"{file} does not match its sha256 in manifest.json", "simlab trace rehash")
            (trace / file).write_bytes(pristine)
    read_trace(trace)


def test_a_flipped_byte_that_decodes_to_another_valid_trace_is_refused(tmp_path):
    """Issue 44's case: one bit of positions.parquet's draft tokens (byte 13001 of the shipped
    Qwen trace, inside their data page) flipped still decodes to a valid trace, and it simulates
    to another figure (794 target calls become 795); only the digest tells it from the recorded one."""
    from simlab.sim.run import Simulator

    trace = _copy(TRACES / "qwen-coder-humaneval", tmp_path)
    assert Simulator(read_trace(trace)).run("sd", {}).summary.target_calls == 794
    _flip(trace / "positions.parquet", 13001)
    expect_error(trace, "positions.parquet does not match its sha256")
    rehash(trace)  # vouched for as a deliberate edit: valid, and a number moves
    assert Simulator(read_trace(trace)).run("sd", {}).summary.target_calls == 795


def test_a_table_the_manifest_does_not_list_is_refused(tmp_path):
    trace = _copy(TREES, tmp_path)
    data = _manifest(trace)
    del data[CHECKSUMS]["topk.parquet"]
    (trace / "manifest.json").write_text(json.dumps(data))
    expect_error(trace, "topk.parquet is not listed in manifest.json's checksums")


def test_an_optional_table_the_manifest_lists_but_is_gone_is_refused(tmp_path):
    trace = _copy(TREES, tmp_path)
    (trace / "tree.parquet").unlink()
    expect_error(trace, "tree.parquet is missing, but manifest.json lists its checksum")


@pytest.mark.parametrize("value", [["abc"], {"positions.parquet": "abc"}, {"notes.parquet": "0" * 64}])
def test_a_malformed_checksums_field_is_refused(synthetic, tmp_path, value):
    trace = _copy(synthetic, tmp_path)
    (trace / "manifest.json").write_text(json.dumps({**_manifest(trace), CHECKSUMS: value}))
    expect_error(trace, "field 'checksums'", "simlab trace rehash")


def test_a_trace_without_checksums_loads_with_a_one_line_note_once(synthetic, tmp_path, capsys):
    trace = _copy(synthetic, tmp_path)
    data = _manifest(trace)
    del data[CHECKSUMS]
    (trace / "manifest.json").write_text(json.dumps(data))
    read_trace(trace)
    read_trace(trace)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simlab: note: trace ") and "simlab trace rehash" in err, err


def test_rehash_changes_the_manifest_only_and_by_the_checksums_alone(tmp_path):
    trace = _copy(TREES, tmp_path)
    tables = {f: (trace / f).read_bytes() for f in TABLE_FILES if (trace / f).exists()}
    text = (trace / "manifest.json").read_text()
    data = _manifest(trace)
    del data[CHECKSUMS]
    (trace / "manifest.json").write_text(json.dumps(data, indent=2) + "\n")
    assert rehash(trace) == file_digests(trace)
    assert (trace / "manifest.json").read_text() == text  # the shipped manifest, byte for byte
    assert {f: (trace / f).read_bytes() for f in tables} == tables


SHIPPED = sorted(d for d in [*TRACES.iterdir(), *TRACES.parent.glob("results/**/traces/*")]
                 if (d / "manifest.json").is_file() and (d / "prompts.parquet").is_file())


def test_every_shipped_trace_lists_the_checksums_of_all_its_tables():
    """traces/ and results/**/traces/: each trace's manifest lists exactly its table files' digests."""
    assert len(SHIPPED) >= 16
    for trace in SHIPPED:
        assert _manifest(trace).get(CHECKSUMS) == file_digests(trace), trace


@pytest.mark.parametrize("shipped", SHIPPED, ids=[d.name for d in SHIPPED])
def test_a_shipped_trace_simulates_the_same_with_its_checksums_as_without(shipped, tmp_path, capsys):
    """The digests are the files', not the trace's: `simulate --json` prints the same bytes."""
    from simlab.cli import main

    trace = _copy(shipped, tmp_path)
    main(["simulate", "--json", "--trace", str(trace)])
    checked = capsys.readouterr().out
    data = _manifest(trace)
    del data[CHECKSUMS]
    (trace / "manifest.json").write_text(json.dumps(data))
    main(["simulate", "--json", "--trace", str(trace)])
    unchecked = capsys.readouterr()
    assert "no checksums" in unchecked.err and unchecked.out == checked and '"target_calls"' in checked


# -- an update in place, killed between two renames ------------------------------------------------

def _grown(synthetic: Path):
    """The trace of ``synthetic`` and the same trace with a fourth prompt (what a recorder commits)."""
    old = read_trace(synthetic)
    new = synth_trace(SynthSpec(prompts=4, tokens=20, seed=1), command="test")
    return old, new


@pytest.mark.parametrize("renames", range(6))
def test_an_update_killed_after_any_rename_leaves_a_trace_that_loads(synthetic, tmp_path, monkeypatch, renames):
    """The pending manifest, then 4 tables (prompts last), then the final manifest: killed after
    ``renames`` of those files, the trace loads with the old prompts or the new ones; the next
    update (a resumed recorder) completes it."""
    old, new = _grown(synthetic)
    trace = _copy(synthetic, tmp_path)
    real = trace_io.replace_file
    done = []

    def killed(path, write):
        if len(done) == renames:
            raise KeyboardInterrupt
        done.append(path)
        return real(path, write)

    monkeypatch.setattr(trace_io, "replace_file", killed)
    with pytest.raises(KeyboardInterrupt):
        update_trace(new, trace)
    monkeypatch.setattr(trace_io, "replace_file", real)
    left = read_trace(trace)
    assert left.n_prompts in (old.n_prompts, new.n_prompts)
    update_trace(new, trace)
    back = read_trace(trace)
    assert back.n_prompts == new.n_prompts and "checksums_pending" not in _manifest(trace)
    assert _manifest(trace)[CHECKSUMS] == file_digests(trace)


def test_an_update_of_a_trace_without_checksums_gives_it_checksums(synthetic, tmp_path):
    old, new = _grown(synthetic)
    trace = _copy(synthetic, tmp_path)
    data = _manifest(trace)
    del data[CHECKSUMS]
    (trace / "manifest.json").write_text(json.dumps(data))
    update_trace(new, trace)
    assert _manifest(trace)[CHECKSUMS] == file_digests(trace)

"""Bad inputs and faults as a hostile user makes them: one row per case (what to break, the
command, the exit status, a fragment of the one-line message). Add a row for every new way a
command can be misused; no row may end in a traceback (an exception escaping ``main``).

The commands run in-process through :func:`simlab.cli.main`, exactly what ``python -m simlab``
runs, so a hundred cases take seconds rather than a hundred interpreter starts.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simlab.cli import main
from simlab.common.locations import CALIBRATE, TRACES
from simlab.sim.run import Simulator
from simlab.trace.checksums import rehash
from tests.helpers import put_table

SELFSPEC = TRACES / "smollm2-selfspec"
PAST_END = TRACES.parent / "results" / "vllm" / "traces" / "qwen-coder-humaneval-vllm"  # past_end.parquet
TREES = TRACES / "smollm2-tree"  # top-4 candidates and EAGLE-2 trees of top-k 4, depth 4
PROFILE = CALIBRATE / "qwen-coder-cpu.json"


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``simlab ARGS``."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A small synthetic trace and a sweep table of it, made once."""
    root = tmp_path_factory.mktemp("base")
    main(["synth", "--prompts", "3", "--tokens", "24", "--out", str(root / "trace")])
    main(["sweep", "--trace", str(root / "trace"), "--policy", "sd:gamma=1..3", "--workers", "1", "--no-cache",
          "--out", str(root / "sweep.csv")])
    main(["sweep", "--trace", str(root / "trace"), "--policy", "sd:gamma=1..2", "--rate", "1,2", "--requests", "3",
          "--workers", "1", "--no-cache", "--out", str(root / "rates.csv")])
    return root


@dataclass
class Ctx:
    """What a case can break: copies of the base trace and sweep, a plain file, a scratch folder."""

    base: Path
    tmp: Path

    @property
    def trace(self) -> Path:
        """A fresh copy of the base trace (copied on first use)."""
        t = self.tmp / "trace"
        if not t.exists():
            shutil.copytree(self.base / "trace", t)
        return t

    @property
    def file(self) -> Path:
        f = self.tmp / "plain.txt"
        f.write_text("not a directory\n")
        return f

    def sweep(self) -> Path:
        s = self.tmp / "sweep.csv"
        shutil.copy(self.base / "sweep.csv", s)
        return s

    def set_cell(self, table: str, column: str, row: int, value) -> Path:
        """The trace with one cell of one table replaced, keeping the column's type (so a null
        stays a null in an integer column, as another tool could write it)."""
        path = self.trace / f"{table}.parquet"
        t = pq.read_table(path)
        values = t[column].to_pylist()
        values[row] = value
        i = t.schema.get_field_index(column)
        t = t.set_column(i, t.schema.field(i), pa.array(values, type=t.schema.field(i).type))
        return put_table(self.trace, table, t)

    def set_manifest(self, **fields) -> Path:
        path = self.trace / "manifest.json"
        data = json.loads(path.read_text())
        data.update(fields)
        path.write_text(json.dumps(data))
        return self.trace

    def no_prompts(self) -> Path:
        for name in ("prompts", "positions", "rollouts"):
            put_table(self.trace, name, pq.read_table(self.trace / f"{name}.parquet").slice(0, 0))
        return self.trace

    def flipped(self, table: str, source: Path | None = None) -> Path:
        """A copy of the base trace (or of ``source``) with one bit flipped in the middle of a table file."""
        t = self.trace if source is None else self.tmp / source.name
        if not t.exists():
            shutil.copytree(source, t)
        data = bytearray((t / f"{table}.parquet").read_bytes())
        data[len(data) // 2] ^= 0x01
        (t / f"{table}.parquet").write_bytes(bytes(data))
        return t

    def checksums(self, edit: Callable[[dict], None]) -> Path:
        """The base trace with its manifest's checksums edited."""
        data = json.loads((self.trace / "manifest.json").read_text())
        edit(data["checksums"])
        (self.trace / "manifest.json").write_text(json.dumps(data))
        return self.trace

    def edited_cache(self) -> Path:
        """A sweep cache of the base trace with one number of one row edited."""
        cache = self.tmp / "cache"
        main(["sweep", "--trace", str(self.trace), "--policy", "sd:gamma=1..2", "--workers", "1", "--cache", str(cache)])
        (store,) = cache.glob("*.jsonl")
        text = store.read_text()
        store.write_text(text.replace('"target_calls": ', '"target_calls": 1', 1))
        return cache

    def selfspec_without_layers(self) -> Path:
        t = self.tmp / "selfspec"
        shutil.copytree(SELFSPEC, t, ignore=shutil.ignore_patterns("layers.parquet"))
        return t

    def profile(self, edit: Callable[[dict], None]) -> Path:
        data = json.loads(PROFILE.read_text())
        edit(data)
        p = self.tmp / "profile.json"
        p.write_text(json.dumps(data))
        return p

    def nan_sweep(self) -> Path:
        s = self.sweep()
        df = pd.read_csv(s)
        df["speedup"] = float("nan")
        df.to_csv(s, index=False)
        return s

    def text(self, name: str, content: str | bytes) -> Path:
        """A file of ``content`` (bytes: written as they are) in the scratch folder."""
        f = self.tmp / name
        f.write_bytes(content) if isinstance(content, bytes) else f.write_text(content)
        return f

    def folder(self, name: str) -> Path:
        """A directory named like a file (``sweep.csv``)."""
        (self.tmp / name).mkdir()
        return self.tmp / name

    def table(self, edit: Callable[[pd.DataFrame], None], source: str = "sweep") -> Path:
        """The base sweep table (``source``: or the rate sweep) with ``edit`` applied."""
        df = pd.read_csv(self.base / f"{source}.csv")
        edit(df)
        out = self.tmp / f"edited-{source}.csv"
        df.to_csv(out, index=False)
        return out

    def tree_trace(self, table: str, edit: Callable[[pd.DataFrame], None]) -> Path:
        """A copy of the shipped tree trace with one of its tree tables edited."""
        t = self.tmp / "trees"
        if not t.exists():
            shutil.copytree(TREES, t)
        df = pd.read_parquet(t / f"{table}.parquet")
        edit(df)
        return put_table(t, table, df)

    def model(self, layers: int) -> Path:
        """A model directory whose config.json declares ``layers`` decoder layers (no weights:
        what is checked before a model loads)."""
        d = self.tmp / "model"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers}))
        return d

    def timed_at_k1(self) -> Path:
        """The trace with its target forwards' latency samples cut to k = 1: every verification
        of drafts is then priced past what was measured (issue 44)."""
        df = pd.read_parquet(self.trace / "latency.parquet")
        return put_table(self.trace, "latency", df[(df["op"] != "target_forward") | (df["k"] == 1)])

    def not_a_trace(self) -> Path:
        d = self.tmp / "mine"
        d.mkdir(exist_ok=True)
        (d / "notes.txt").write_text("my own files\n")
        return d


def _negative_coefficient(profile: dict) -> None:
    profile["surfaces"][0]["base"][0] = -1.0


def _garbage(path: Path, vouched: bool = False) -> Path:
    """``path`` filled with random bytes; ``vouched``: and the trace rehashed, as if on purpose."""
    path.write_bytes(os.urandom(64))
    if vouched:
        rehash(path.parent)
    return path.parent


def _set(column: str, value, row: int = 0) -> Callable[[pd.DataFrame], None]:
    """An edit that puts ``value`` in one cell of a table (the column as objects, so text fits)."""
    def edit(df: pd.DataFrame) -> None:
        df[column] = df[column].astype(object)
        df.loc[row, column] = value
    return edit


SERVE = ("serve", "--requests", "3", "--trace")
LIVE = ("live", "--target", "smollm2", "--draft-layer", "3", "--prompts", "humaneval:1", "--no-compare")


SIM = ("simulate", "--json", "--trace")

# (id, args from a Ctx, exit status, fragment of stderr)
CASES: list[tuple[str, Callable[[Ctx], list], int, str]] = [
    # -- trace contents: every column, nulls, non-finite values, ranges ---------------------
    ("entropy-nan", lambda c: [*SIM, c.set_cell("positions", "draft_entropy", 5, float("nan"))], 2,
     "'draft_entropy' has 1 value null, not finite or negative; the first is NaN at prompt 0, position 5"),
    ("entropy-inf", lambda c: [*SIM, c.set_cell("positions", "draft_entropy", 3, float("inf"))], 2, "draft_entropy"),
    ("entropy-negative", lambda c: [*SIM, c.set_cell("positions", "draft_entropy", 3, -2.0)], 2, "draft_entropy"),
    ("target-token-null", lambda c: [*SIM, c.set_cell("positions", "target_token", 30, None)], 2,
     "'target_token' has 1 value null or negative; the first is NaN at prompt 1, position 6"),
    ("draft-token-negative", lambda c: [*SIM, c.set_cell("positions", "draft_token", 2, -5)], 2, "draft_token"),
    ("pos-null", lambda c: [*SIM, c.set_cell("positions", "pos", 2, None)], 2, "'pos'"),
    ("accept-prob-above-1", lambda c: [*SIM, c.set_cell("positions", "accept_prob", 4, 1.5)], 2,
     "outside [0, 1]"),
    ("q-target-nan", lambda c: [*SIM, c.set_cell("positions", "q_target", 4, float("nan"))], 2, "q_target"),
    ("p-target-null", lambda c: [*SIM, c.set_cell("positions", "p_target", 4, None)], 2, "p_target"),
    ("draft-conf-negative", lambda c: [*SIM, c.set_cell("positions", "draft_conf", 4, -0.1)], 2, "draft_conf"),
    ("latency-1e300", lambda c: [*SIM, c.set_cell("latency", "seconds", 7, 1e300)], 2,
     "latency.parquet column 'seconds' has 1 value null, not finite, not positive or above 3600 s"),
    ("latency-null", lambda c: [*SIM, c.set_cell("latency", "seconds", 0, None)], 2, "'seconds'"),
    ("latency-negative", lambda c: [*SIM, c.set_cell("latency", "seconds", 0, -0.01)], 2, "'seconds'"),
    ("latency-k-zero", lambda c: [*SIM, c.set_cell("latency", "k", 3, 0)], 2, "'k'"),
    ("latency-op-null", lambda c: [*SIM, c.set_cell("latency", "op", 3, None)], 2, "'op'"),
    ("latency-corun-null", lambda c: [*SIM, c.set_cell("latency", "corun", 3, None)], 2, "'corun'"),
    ("strict-extrapolated", lambda c: [*SIM, c.timed_at_k1(), "--strict"], 2,
     "--strict: sd on {tmp}/trace has "),
    ("n-tokens-null", lambda c: [*SIM, c.set_cell("prompts", "n_tokens", 1, None)], 2, "'n_tokens'"),
    ("prompt-id-null", lambda c: [*SIM, c.set_cell("prompts", "prompt_id", 1, None)], 2, "'prompt_id'"),
    ("rollout-conf-nan", lambda c: [*SIM, c.set_cell("rollouts", "draft_conf", 0, float("nan"))], 2,
     "rollouts.parquet column 'draft_conf'"),
    ("rollout-step-null", lambda c: [*SIM, c.set_cell("rollouts", "step", 0, None)], 2, "'step'"),
    ("rollout-entropy-inf", lambda c: [*SIM, c.set_cell("rollouts", "draft_entropy", 0, float("inf"))], 2,
     "rollouts.parquet column 'draft_entropy'"),
    ("no-prompts", lambda c: [*SIM, c.no_prompts()], 2, "lists no prompts"),
    # -- manifest -----------------------------------------------------------------------------
    ("manifest-temperature-string", lambda c: [*SIM, c.set_manifest(temperature="abc")], 2,
     "field 'temperature' must be float, got 'abc'"),
    ("manifest-exit-layers-int", lambda c: [*SIM, c.set_manifest(exit_layers=5)], 2,
     "field 'exit_layers' must be list[int], got 5"),
    ("manifest-exit-layers-strings", lambda c: [*SIM, c.set_manifest(exit_layers=["a"])], 2, "'exit_layers'"),
    ("manifest-seed-float", lambda c: [*SIM, c.set_manifest(seed=1.5)], 2, "field 'seed' must be int"),
    ("manifest-kind-null", lambda c: [*SIM, c.set_manifest(kind=None)], 2, "field 'kind' must be str"),
    ("manifest-extra-list", lambda c: [*SIM, c.set_manifest(extra=[1])], 2, "field 'extra'"),
    ("manifest-temperature-negative", lambda c: [*SIM, c.set_manifest(temperature=-1)], 2, "temperature"),
    ("manifest-version", lambda c: [*SIM, c.set_manifest(schema_version=99)], 2, "schema version 99"),
    ("manifest-unknown-field", lambda c: [*SIM, c.set_manifest(colour="red")], 2, "unknown fields"),
    ("manifest-array", lambda c: [*SIM, (c.trace / "manifest.json").write_text("[]") and c.trace], 2,
     "JSON object"),
    ("selfspec-without-layers", lambda c: ["simulate", "--policy", "del", "--trace", c.selfspec_without_layers()], 2,
     "layers.parquet is missing"),
    # -- damaged or half-written trace directories ----------------------------------------------
    ("prompts-missing", lambda c: [*SIM, (c.trace / "prompts.parquet").unlink() or c.trace], 2,
     "incomplete trace (interrupted write?)"),
    ("manifest-missing", lambda c: [*SIM, (c.trace / "manifest.json").unlink() or c.trace], 2,
     "incomplete trace (interrupted write?)"),
    ("positions-garbage", lambda c: [*SIM, _garbage(c.trace / "positions.parquet")], 2,
     "positions.parquet does not match its sha256 in manifest.json"),
    ("positions-garbage-rehashed", lambda c: [*SIM, _garbage(c.trace / "positions.parquet", vouched=True)], 2,
     "not a readable Parquet"),
    # -- integrity: every table file against the sha256 its manifest lists; one flipped bit is refused ------
    *((f"{table}-bit-flipped", lambda c, t=table, src=src: [*SIM, c.flipped(t, src)], 2,
       f"{table}.parquet does not match its sha256 in manifest.json: the file was damaged or edited after the "
       "trace was written; copy it again from where the trace came from, or if the edit was deliberate run "
       "`simlab trace rehash ")
      for table, src in (("prompts", None), ("positions", None), ("rollouts", None), ("latency", None),
                         ("layers", TREES), ("topk", TREES), ("tree", TREES), ("past_end", PAST_END))),
    ("table-not-listed", lambda c: [*SIM, c.checksums(lambda s: s.pop("rollouts.parquet"))], 2,
     "rollouts.parquet is not listed in manifest.json's checksums"),
    ("listed-table-gone", lambda c: [*SIM, c.checksums(lambda s: s.update({"layers.parquet": "0" * 64}))], 2,
     "layers.parquet is missing, but manifest.json lists its checksum"),
    ("checksum-not-hex", lambda c: [*SIM, c.checksums(lambda s: s.update({"prompts.parquet": "abc"}))], 2,
     "manifest.json field 'checksums' must map table files to sha256 digests"),
    ("trace-check-bit-flipped", lambda c: ["trace", "check", c.flipped("positions")], 2,
     "positions.parquet does not match its sha256"),
    ("trace-rehash-missing", lambda c: ["trace", "rehash", c.tmp / "nope"], 2, "is not a directory"),
    ("trace-rehash-not-a-trace", lambda c: ["trace", "rehash", c.not_a_trace()], 2, "manifest.json"),
    ("sweep-cache-row-edited", lambda c: ["sweep", "--trace", c.trace, "--policy", "sd:gamma=1..2", "--workers", "1",
                                          "--cache", c.edited_cache()], 0,
     "1 row(s) failed their sha256 check (edited, damaged, or written by an older simlab); simulating them again"),
    ("trace-is-a-file", lambda c: [*SIM, c.file], 2, "is not a directory"),
    ("trace-missing", lambda c: [*SIM, c.tmp / "nope"], 2, "trace not found"),
    ("empty-directory", lambda c: [*SIM, c.tmp], 2, "manifest.json is missing"),
    # -- parameters ---------------------------------------------------------------------------------
    ("gamma-twice", lambda c: [*SIM, c.trace, "--gamma", "3", "--param", "gamma=7"], 2,
     "--gamma 3 and --param gamma=7 both set gamma"),
    ("param-without-value", lambda c: [*SIM, c.trace, "--param", "gamma"], 2, "KEY=VALUE"),
    ("seed-negative", lambda c: [*SIM, c.trace, "--seed", "-1"], 2, "--seed must be a non-negative integer"),
    ("sweep-seed-negative", lambda c: ["sweep", "--trace", c.trace, "--policy", "sd", "--seed", "-1", "--no-cache"],
     2, "--seed"),
    ("synth-seed-negative", lambda c: ["synth", "--out", c.tmp / "t", "--seed", "-1"], 2, "--seed"),
    ("live-seed-negative", lambda c: ["live", "--target", c.tmp / "no-model", "--draft-layer", "3", "--seed", "-1"], 2,
     "--seed must be a non-negative integer"),  # refused before any model loads
    ("profile-negative-coefficient", lambda c: [*SIM, c.trace, "--latency", c.profile(_negative_coefficient)], 2,
     "latency model 'qwen-coder-cpu' gives"),
    ("profile-not-json", lambda c: [*SIM, c.trace, "--latency", c.file], 2, "not valid JSON"),
    ("frontier-all-nan", lambda c: ["plot", "frontier", c.nan_sweep(), "--out", c.tmp / "f.png"], 2,
     "column 'speedup' has 3 cell(s) that are not a finite number > 0; the first is blank in row 1"),
    # -- plots of tables with blank, non-numeric or impossible cells: one line, and no figure ---------
    ("frontier-speedup-text", lambda c: ["plot", "frontier", c.table(_set("speedup", "fast")), "--out", c.tmp / "f.png"],
     2, "column 'speedup' has 1 cell(s) that are not a finite number > 0; the first is 'fast' in row 1"),
    ("frontier-cost-negative", lambda c: ["plot", "frontier", c.table(_set("cost", -1.0, 2)), "--out", c.tmp / "f.png"],
     2, "column 'cost' has 1 cell(s) that are not a finite number > 0; the first is -1.0 in row 3"),
    ("frontier-param-text", lambda c: ["plot", "frontier", c.table(_set("gamma", "x")), "--out", c.tmp / "f.png"], 2,
     "column 'gamma' (policy 'sd') has 1 cell(s) that are not a finite number; the first is 'x' in row 1"),
    ("tau-speedup-blank", lambda c: ["plot", "tau", c.table(_set("speedup", None)), "--param", "gamma", "--out",
                                     c.tmp / "t.png"], 2, "column 'speedup'"),
    ("tau-param-text", lambda c: ["plot", "tau", c.table(_set("gamma", "x", 1)), "--param", "gamma", "--out",
                                  c.tmp / "t.png"], 2, "column 'gamma' (policy 'sd')"),
    ("acceptance-share-above-1", lambda c: ["plot", "acceptance", c.table(_set("acceptance_per_position", "[1.5]")),
                                            "--out", c.tmp / "a.png"], 2,
     "column 'acceptance_per_position' has 1 cell(s) that are not a finite number in [0, 1]; the first is 1.5 in row 1"),
    ("rates-rate-negative", lambda c: ["plot", "rates", c.table(_set("rate_per_s", -2.0), "rates"), "--out",
                                       c.tmp / "r.png"], 2, "column 'rate_per_s'"),
    ("rates-goodput-text", lambda c: ["plot", "rates", c.table(_set("goodput_requests_per_s", "lots"), "rates"),
                                      "--out", c.tmp / "r.png"], 2, "the first is 'lots' in row 1"),
    ("rates-latency-blank", lambda c: ["plot", "rates", c.table(_set("tpot_p90_s", None), "rates"), "--out",
                                       c.tmp / "r.png"], 2, "column 'tpot_p90_s'"),
    ("live-plot-negative", lambda c: ["plot", "live", c.text("live.csv", "measured_tokens_per_s,predicted_tokens_per_s\n"
                                                                         "-1,2\n"), "--out", c.tmp / "l.png"], 2,
     "column 'measured_tokens_per_s'"),
    # -- tree tables: a corrupted one is named, before anything is asked of it ---------------------------
    ("tree-reparented", lambda c: [*SIM, c.tree_trace("tree", _set("parent", 5, 24)), "--policy", "eagle2"], 2,
     "tree.parquet is not an EAGLE-2 expansion at prompt 0, position 0"),
    ("tree-rank-swapped", lambda c: [*SIM, c.tree_trace("tree", _set("rank", 2, 5)), "--policy", "eagle2"], 2,
     "tree.parquet is not an EAGLE-2 expansion"),
    ("tree-prob-out-of-order", lambda c: [*SIM, c.tree_trace("tree", _set("prob", 0.01, 4)), "--policy", "ags-tree"],
     2, "tree.parquet is not an EAGLE-2 expansion"),
    ("topk-prob-out-of-order", lambda c: [*SIM, c.tree_trace("topk", _set("prob", 0.9, 1)), "--policy", "tree-static"],
     2, "topk.parquet at prompt 0, position 0 does not hold a top-4"),
    # -- arrivals, rates and sizes that cannot run ------------------------------------------------------
    ("arrivals-binary", lambda c: [*SERVE, c.trace, "--arrivals", c.text("a.txt", b"\x00\xff\xfe\x81 arrivals")], 2,
     "is not a text file"),
    ("arrivals-empty", lambda c: [*SERVE, c.trace, "--arrivals", c.text("a.txt", "")], 2, "holds no arrival times"),
    ("arrivals-unsorted", lambda c: [*SERVE, c.trace, "--arrivals", c.text("a.txt", "2\n1\n3\n")], 2,
     "a.txt:2: arrival times must be sorted, got 1.0 after 2.0"),
    ("arrivals-negative", lambda c: [*SERVE, c.trace, "--arrivals", c.text("a.txt", "-1\n2\n3\n")], 2,
     "a.txt:1: arrival times must be finite and >= 0, got -1"),
    ("arrivals-past-the-clock", lambda c: [*SERVE, c.trace, "--arrivals", c.text("a.txt", "0\n1e300\n")], 2,
     "a.txt:2: arrival times must be at most 1e+09 s"),
    ("arrivals-directory", lambda c: [*SERVE, c.trace, "--arrivals", c.tmp], 2, "is a directory; it must name a file"),
    ("rate-underflows-the-clock", lambda c: [*SERVE, c.trace, "--rate", "1e-300"], 2,
     "--rate 1e-300 is too low: 3 arrivals reach"),
    ("rates-underflow-the-clock", lambda c: [*SERVE, c.trace, "--rate", "1e-300,1"], 2, "--rate 1e-300 is too low"),
    ("sweep-rate-underflows-the-clock", lambda c: ["sweep", "--trace", c.trace, "--policy", "sd", "--rate", "1e-300",
                                                   "--requests", "3", "--no-cache"], 2, "--rate 1e-300 is too low"),
    ("requests-a-billion", lambda c: [*SERVE, c.trace, "--requests", "1000000000"], 2,
     "--requests must be at most 1,000,000"),
    ("gamma-a-billion", lambda c: [*SIM, c.trace, "--gamma", "1000000000"], 2,
     "gamma must be at most 100,000 (longer than any context a trace holds), got 1000000000"),
    ("serve-gamma-a-billion", lambda c: [*SERVE, c.trace, "--gamma", "1000000000"], 2, "gamma must be at most 100,000"),
    ("sequoia-too-many-nodes", lambda c: [*SIM, TREES, "--policy", "tree-static", "--param", "nodes=100000"], 2,
     "Sequoia's optimiser takes at most 128 nodes and 16 levels"),
    ("tune-gamma-past-the-budget", lambda c: ["serve", "tune", "--trace", c.trace, "--max-gamma", "100", "--batch", "1",
                                              "--out", c.tmp / "t.json"], 2,
     "--max-gamma 100: no prompt of this trace drafts more than 22 tokens a round"),
    # -- a directory where a file is expected -------------------------------------------------------------
    ("latency-directory", lambda c: [*SIM, c.trace, "--latency", c.tmp], 2,
     "latency profile " + "{tmp} is a directory; it must name a file"),
    ("plot-table-directory", lambda c: ["plot", "frontier", c.folder("d.csv"), "--out", c.tmp / "f.png"], 2,
     "table " + "{tmp}/d.csv is a directory; it must name a file"),
    ("timeline-directory", lambda c: ["plot", "timeline", c.tmp, "--out", c.tmp / "t.png"], 2,
     "timeline " + "{tmp} is a directory"),
    ("prompts-directory", lambda c: [*LIVE, "--prompts", c.tmp], 2, "is a directory; it must name a .jsonl or .txt file"),
    # -- live options, refused before any model loads -----------------------------------------------------
    ("live-device-tpu", lambda c: [*LIVE, "--device", "tpu"], 2, "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    ("live-draft-device-tpu", lambda c: [*LIVE, "--draft-device", "tpu"], 2, "--draft-device must be cpu"),
    ("live-temperature-nan", lambda c: [*LIVE, "--temperature", "nan"], 2,
     "--temperature must be a finite number >= 0 (0: greedy), got nan"),
    ("live-temperature-inf", lambda c: [*LIVE, "--temperature", "inf"], 2, "got inf"),
    ("live-draft-layer-zero", lambda c: ["live", "--target", c.model(4), "--draft-layer", "0", "--no-compare"], 2,
     "--draft-layer must be a layer number >= 1"),
    ("live-draft-layer-negative", lambda c: ["live", "--target", c.model(4), "--draft-layer", "-2", "--no-compare"], 2,
     "got -2"),
    ("live-draft-layer-too-deep", lambda c: ["live", "--target", c.model(4), "--draft-layer", "5", "--no-compare",
                                             "--prompts", c.text("p.txt", "def f():\n")], 2,
     "--draft-layer 5: the target {tmp}/model has 4 decoder layers"),
    ("live-oracle", lambda c: [*LIVE, "--policy", "oracle"], 2, "sees the future; it exists only in simulation"),
    ("live-vllm", lambda c: [*LIVE, "--policy", "vllm"], 2, "check it on that engine with `simlab vllm run`"),
    ("record-device-tpu", lambda c: ["record", "--target", c.model(4), "--exit-layers", "2", "--device", "tpu", "--out",
                                     c.tmp / "t"], 2, "--device must be cpu, cuda or cuda:N"),
    ("record-temperature-inf", lambda c: ["record", "--target", c.model(4), "--exit-layers", "2", "--temperature", "inf",
                                          "--out", c.tmp / "t"], 2, "--temperature must be a finite number"),
    # -- output paths, checked before any work ------------------------------------------------------
    ("simulate-out-parent-is-file", lambda c: [*SIM, c.trace, "--out", c.file / "x.csv"], 2, "is not a directory"),
    ("simulate-out-is-directory", lambda c: [*SIM, c.trace, "--out", c.tmp], 2,
     "is a directory; it must name a file"),
    ("simulate-out-suffix", lambda c: [*SIM, c.trace, "--out", c.tmp / "x.txt"], 2, "must end in .csv or .parquet"),
    ("simulate-out-exists", lambda c: [*SIM, c.trace, "--out", c.sweep()], 2, "exists; pass --force"),
    ("simulate-timeline-parent-is-file", lambda c: [*SIM, c.trace, "--timeline", c.file / "t.json"], 2,
     "--timeline"),
    ("simulate-timeline-is-directory", lambda c: [*SIM, c.trace, "--timeline", c.tmp], 2, "is a directory"),
    ("synth-over-trace", lambda c: ["synth", "--out", c.trace], 2, "is not empty; pass --force"),
    ("synth-force-over-foreign-directory", lambda c: ["synth", "--out", c.not_a_trace(), "--force"], 2,
     "simlab did not write"),
    ("synth-out-is-file", lambda c: ["synth", "--out", c.file], 2, "is a file; it must name a directory"),
    ("synth-out-parent-is-file", lambda c: ["synth", "--out", c.file / "t"], 2, "is not a directory"),
    ("sweep-out-exists", lambda c: ["sweep", "--trace", c.trace, "--policy", "sd", "--out", c.sweep()], 2,
     "exists; pass --force"),
    ("sweep-out-is-directory", lambda c: ["sweep", "--trace", c.trace, "--policy", "sd", "--out", c.tmp], 2,
     "is a directory"),
    ("sweep-cache-is-file", lambda c: ["sweep", "--trace", c.trace, "--policy", "sd", "--cache", c.file], 2,
     "sweep cache"),
    ("sweep-grid-is-directory", lambda c: ["sweep", "--trace", c.trace, "--grid", c.tmp], 2,
     "cannot read grid file"),
    ("sweep-grid-missing", lambda c: ["sweep", "--trace", c.trace, "--grid", c.tmp / "g.toml"], 2,
     "grid file not found"),
    ("calibrate-out-exists", lambda c: ["calibrate", "fit", c.trace, "--out", c.file], 2, "exists; pass --force"),
    ("calibrate-out-parent-is-file", lambda c: ["calibrate", "fit", c.trace, "--out", c.file / "p.json"], 2,
     "is not a directory"),
    ("calibrate-predictor-out-is-directory", lambda c: ["calibrate", "predictor", c.trace, "--out", c.tmp], 2,
     "is a directory"),
    ("calibrate-roofline-out-exists", lambda c: ["calibrate", "roofline", "--target-config", "qwen2.5-7b",
                                                 "--out", c.file], 2, "exists; pass --force"),
    ("live-out-exists", lambda c: ["live", "--out", c.sweep(), "--prompts", "humaneval:1"], 2,
     "exists; pass --force"),
    ("serve-out-exists", lambda c: ["serve", "--trace", c.trace, "--requests", "3", "--out", c.sweep()], 2,
     "exists; pass --force"),
    ("serve-seed-negative", lambda c: ["serve", "--trace", c.trace, "--requests", "3", "--seed", "-1"], 2, "--seed"),
    ("plot-out-parent-is-file", lambda c: ["plot", "frontier", c.sweep(), "--out", c.file / "f.png"], 2,
     "is not a directory"),
    ("plot-mapping-missing-source", lambda c: ["plot", "mapping", c.tmp / "nope", "--out", c.tmp / "m.png"], 2,
     "nope not found; pass a trace directory or a mapping CSV"),
]


@pytest.mark.parametrize("make_args, status, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_in_one_line(base, tmp_path, capsys, make_args, status, fragment):
    args = make_args(Ctx(base, tmp_path))
    code, _, err = run_cli(capsys, *args)
    assert code == status, err
    assert fragment.replace("{tmp}", str(tmp_path)) in err, err
    if status == 2:
        assert err.startswith("simlab: error: ") and err.count("\n") == 1, err


def test_valid_inputs_of_the_table_still_run(base, tmp_path, capsys):
    """The base every row breaks is itself fine: each row fails because of its one change."""
    code, out, err = run_cli(capsys, *SIM, Ctx(base, tmp_path).trace)
    assert code == 0, err
    assert json.loads(out)["tokens"] > 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_directory_is_refused_before_work(base, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code, _, err = run_cli(capsys, *SIM, base / "trace", "--out", ro / "x.csv")
    assert code == 2 and "cannot write in" in err


def test_simlab_cache_pointing_at_a_file_is_refused(base, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SIMLAB_CACHE", str(Ctx(base, tmp_path).file))
    code, _, err = run_cli(capsys, "sweep", "--trace", base / "trace", "--policy", "sd", "--workers", "1")
    assert code == 2 and "sweep cache (--cache or $SIMLAB_CACHE)" in err, err


def test_sweep_checks_its_output_before_simulating(base, tmp_path, capsys):
    existing = Ctx(base, tmp_path).sweep()
    before = existing.read_bytes()
    code, _, err = run_cli(capsys, "sweep", "--trace", base / "trace", "--policy", "sd:gamma=1..4", "--workers", "1",
                           "--cache", tmp_path / "cache", "--out", existing)
    assert code == 2 and "--force" in err
    assert not (tmp_path / "cache").exists()  # nothing was simulated (finished rows go to the cache)
    assert existing.read_bytes() == before


def test_force_replaces_an_output_and_nothing_of_the_old_one_stays(base, tmp_path, capsys):
    old = tmp_path / "t"
    shutil.copytree(SELFSPEC, old)  # has layers.parquet, which a synthetic trace lacks
    code, _, err = run_cli(capsys, "synth", "--prompts", "2", "--tokens", "10", "--out", old, "--force")
    assert code == 0, err
    assert sorted(p.name for p in old.iterdir()) == ["latency.parquet", "manifest.json", "positions.parquet",
                                                      "prompts.parquet", "rollouts.parquet"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary copies left


def test_a_corrupt_sweep_cache_is_set_aside_once(base, tmp_path, capsys):
    args = ("sweep", "--trace", base / "trace", "--policy", "sd:gamma=1..2", "--workers", "1", "--cache", tmp_path)
    assert run_cli(capsys, *args)[0] == 0
    (store,) = tmp_path.glob("*.jsonl")
    store.write_bytes(b"\x00\xff garbage\n" + os.urandom(200) + b"\n")
    code, _, err = run_cli(capsys, *args)
    assert code == 0 and f"sweep cache {store} is corrupt" in err, err
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1
    code, out, err = run_cli(capsys, *args)
    assert code == 0 and "corrupt" not in err and "2 from the cache" in out


@pytest.mark.parametrize("damage", ["number-edited", "digest-dropped"])
def test_a_cache_row_that_fails_its_sha256_is_simulated_again_and_replaced(base, tmp_path, capsys, damage):
    """An edited number (or a row of a simlab that wrote no digests) is never served: the sweep
    says so in one line, simulates that configuration again, and its table equals an uncached
    sweep's; the row it appends replaces the bad one, so the next run is silent."""
    args = ("sweep", "--trace", base / "trace", "--policy", "sd:gamma=1..3", "--workers", "1", "--cache", tmp_path,
            "--force", "--out")
    timing = ["sim_seconds", "cpu_seconds"]
    assert run_cli(capsys, *args, tmp_path / "first.csv")[0] == 0
    first = pd.read_csv(tmp_path / "first.csv").drop(columns=timing)
    (store,) = tmp_path.glob("*.jsonl")
    lines = store.read_text().splitlines()
    row = json.loads(lines[1])
    if damage == "number-edited":
        row["target_calls"] += 1
    else:
        del row["sha256"]
    store.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    code, out, err = run_cli(capsys, *args, tmp_path / "again.csv")
    assert code == 0 and err.count("failed their sha256 check") == 1 and f"sweep cache {store}: 1 row(s)" in err, err
    assert "2 from the cache, 1 simulated" in out
    assert pd.read_csv(tmp_path / "again.csv").drop(columns=timing).equals(first)
    code, out, err = run_cli(capsys, *args, tmp_path / "third.csv")
    assert code == 0 and "sha256" not in err and "3 from the cache, 0 simulated" in out, err
    assert pd.read_csv(tmp_path / "third.csv").drop(columns=timing).equals(first)


def test_an_internal_error_keeps_its_traceback(base, monkeypatch, capsys):
    """Only user errors become one line: a bug in the simulator must surface as itself."""
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(Simulator, "run", broken)
    with pytest.raises(ZeroDivisionError):
        main([*SIM, str(base / "trace")])

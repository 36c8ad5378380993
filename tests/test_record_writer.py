"""The recorder's trace writer: the running figures a resumed recording keeps across its runs."""

import dataclasses

import pytest

from simlab.record.writer import TraceWriter
from simlab.trace.io import read_trace
from simlab.trace.synth import SynthSpec, synth_trace


class Load:
    """Stands in for simlab.common.cpu_load.OtherLoad: a share of the CPU others took, over a span."""

    def __init__(self, share, seconds):
        self._share, self._seconds = share, seconds

    def share(self):
        return self._share

    def seconds(self):
        return self._seconds


def commit(tmp_path, extra: dict, load: Load) -> dict:
    trace = synth_trace(SynthSpec(alpha=0.8, prompts=2, tokens=20, seed=0))
    manifest = dataclasses.replace(trace.manifest, extra=dict(extra))
    writer = TraceWriter(tmp_path / "t", manifest, trace.latency, with_layers=False, fresh=True)
    timed = trace.prompts.assign(generate_seconds=1.0, signals_seconds=0.5, rollout_seconds=0.5)  # as recorded
    writer.add({"prompts": timed, "positions": trace.positions, "rollouts": trace.rollouts})
    writer._load = load
    writer.commit(run_started=writer._started)
    return read_trace(tmp_path / "t").manifest.extra


def test_a_resumed_recording_weighs_each_runs_share_of_other_processes_by_its_seconds(tmp_path):
    # 50% over the first run's 100 s, 10% over this run's 300 s: (50 + 30) / 400 = 20% over 400 s
    extra = commit(tmp_path, {"other_cpu": 0.5, "other_cpu_seconds": 100.0}, Load(0.1, 300.0))
    assert extra["other_cpu"] == pytest.approx(0.2) and extra["other_cpu_seconds"] == 400.0


def test_a_trace_from_before_the_seconds_were_kept_weighs_its_share_by_its_wall_time(tmp_path):
    extra = commit(tmp_path, {"other_cpu": 0.4, "wall_seconds": 100.0}, Load(0.0, 100.0))
    assert extra["other_cpu"] == pytest.approx(0.2) and extra["other_cpu_seconds"] == 200.0


def test_a_first_run_or_an_unmeasured_one_keeps_what_it_has(tmp_path):
    assert commit(tmp_path / "a", {}, Load(0.3, 50.0))["other_cpu"] == pytest.approx(0.3)
    unmeasured = commit(tmp_path / "b", {"other_cpu": 0.3, "other_cpu_seconds": 50.0}, Load(None, 0.5))
    assert (unmeasured["other_cpu"], unmeasured["other_cpu_seconds"]) == (0.3, 50.0)
    # earlier runs that measured nothing add no seconds to this run's share
    extra = commit(tmp_path / "c", {"wall_seconds": 900.0}, Load(0.25, 60.0))
    assert (extra["other_cpu"], extra["other_cpu_seconds"]) == (0.25, 60.0)

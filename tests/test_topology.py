"""The one-device topology (simlab/sim/devices.py): while both models compute at once (a parallel
round) each forward takes its co-running time; serial rounds take solo times; without
co-running samples the solo times stand in and the run says so."""

import json
import subprocess
import sys

import pytest

from simlab.sim.run import Simulator
from simlab.trace.io import write_trace
from simlab.trace.schema import Topology
from tests.helpers import hand_trace, latency_table

PATTERN = "1" * 12


def spans(result, device):
    return [round(s.end - s.start, 9) for s in result.timeline if s.device == device]


def test_parallel_rounds_use_co_running_latencies_on_one_device():
    # solo: draft step 0.25 s, verify 1 s; beside the other model: draft x2, verify x1.5
    trace = hand_trace([PATTERN], latency=latency_table(draft=0.25, corun=(2.0, 1.5)))
    two = Simulator(trace).run("pearl", {"window": 4}, timeline_prompt=0, with_cost=False)
    one = Simulator(trace, topology="one-device").run("pearl", {"window": 4}, timeline_prompt=0, with_cost=False)
    assert spans(two, "draft")[0] == 1.0 and spans(two, "target")[0] == 1.0
    assert spans(one, "draft")[0] == 2.0 and spans(one, "target")[0] == 1.5
    # a round lasts as long as its slower side
    assert one.summary.wall_time_s == pytest.approx(sum(max(d, t) for d, t in zip(spans(one, "draft"),
                                                                                  spans(one, "target"))))
    assert one.summary.extra["corun_latency"] == "measured"


def test_serial_rounds_use_solo_latencies_on_one_device():
    trace = hand_trace([PATTERN], latency=latency_table(draft=0.25, corun=(2.0, 1.5)))
    runs = [Simulator(trace, topology=t).run("sd", {"gamma": 3}, with_cost=False).summary for t in
            ("two-devices", "one-device")]
    assert runs[0].wall_time_s == pytest.approx(runs[1].wall_time_s)


def test_one_device_without_co_running_samples_is_flagged():
    trace = hand_trace([PATTERN], latency=latency_table(draft=0.25))
    res = Simulator(trace, topology="one-device").run("spide", with_cost=False)
    assert res.summary.extra["corun_latency"].startswith("solo stand-in")
    assert "corun_latency" not in Simulator(trace).run("spide", with_cost=False).summary.extra


# -- the default topology: the one the trace was recorded in ---------------------------------

def test_a_recorded_trace_without_the_field_was_recorded_on_one_device():
    # simlab record has always loaded both models on the manifest's one device
    trace = hand_trace([PATTERN])
    trace.manifest.kind = "recorded"
    assert trace.manifest.recorded_topology() is Topology.ONE_DEVICE
    trace.manifest.kind = "synthetic"
    assert trace.manifest.recorded_topology() is Topology.TWO_DEVICES
    trace.manifest.topology = "one-device"  # an explicit field wins over the rule
    assert trace.manifest.recorded_topology() is Topology.ONE_DEVICE


def test_the_simulator_defaults_to_the_recorded_topology_and_a_flag_overrides_it():
    trace = hand_trace([PATTERN], latency=latency_table(draft=0.25, corun=(2.0, 1.5)))
    trace.manifest.topology = "one-device"
    default = Simulator(trace)
    assert default.topology is Topology.ONE_DEVICE
    walls = {t: Simulator(trace, topology=t).run("pearl", {"window": 4}, with_cost=False).summary.wall_time_s
             for t in ("one-device", "two-devices")}
    assert default.run("pearl", {"window": 4}, with_cost=False).summary.wall_time_s == walls["one-device"]
    assert walls["one-device"] != walls["two-devices"]


def simlab_text(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "simlab", *args], capture_output=True, text=True, check=True)
    return proc.stdout


def simlab(*args: str) -> dict:
    return json.loads(simlab_text(*args))


def test_simulate_and_sweep_name_the_topology_and_where_it_came_from(tmp_path):
    trace = hand_trace([PATTERN], latency=latency_table(draft=0.25, corun=(2.0, 1.5)))
    trace.manifest.topology = "one-device"
    write_trace(trace, tmp_path / "t")
    out = simlab("simulate", "--trace", str(tmp_path / "t"), "--policy", "pearl", "--json")
    assert (out["topology"], out["topology_from"]) == ("one-device", "trace manifest")
    out = simlab("simulate", "--trace", str(tmp_path / "t"), "--policy", "pearl", "--json", "--topology", "two-devices")
    assert (out["topology"], out["topology_from"]) == ("two-devices", "--topology")
    text = simlab_text("sweep", "--trace", str(tmp_path / "t"), "--policy", "sd:gamma=1,2", "--no-cache",
                       "--workers", "1")
    assert "sweep — topology one-device (as recorded)" in " ".join(text.split())


def test_timeline_and_frontier_titles_name_the_topology(tmp_path):
    from simlab.plots.frontier import frontier_figure
    from simlab.sim.timeline import read_chrome_trace
    from simlab.sweep import PolicyGrid, run_sweep

    trace = hand_trace([PATTERN], latency=latency_table(draft=0.25, corun=(2.0, 1.5)))
    trace.manifest.topology = "one-device"
    write_trace(trace, tmp_path / "t")
    simlab_text("simulate", "--trace", str(tmp_path / "t"), "--timeline", str(tmp_path / "tl.json"))
    assert read_chrome_trace(tmp_path / "tl.json")[0].endswith("one-device")
    table = run_sweep(trace, [PolicyGrid("sd", {"gamma": (1, 2)})], workers=1, cache=False, progress=False).table
    assert "one-device" in frontier_figure(table).axes[0].get_title()

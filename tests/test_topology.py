"""The one-device topology (simlab/sim/devices.py): while both models compute at once (a parallel
round) each forward takes its co-running time; serial rounds take solo times; without
co-running samples the solo times stand in and the run says so."""

import pytest

from simlab.sim.run import Simulator
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

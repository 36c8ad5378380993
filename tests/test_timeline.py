"""Timelines as Chrome trace JSON: what is written reads back the same, and a file written by
another tool (a live decode log) reads by its metadata events, in whatever order they come."""

import json

import pytest

from simlab.sim.devices import Slice
from simlab.sim.timeline import chrome_trace, kind_of, read_chrome_trace, seconds_by_kind, write_chrome_trace

SLICES = [Slice("target", "verify", 0.25, 1.25, {"tokens": 3, "accepted": 2}),
          Slice("draft", "draft", 0.0, 0.25, {"k": 2})]


def test_a_timeline_reads_back_as_written(tmp_path):
    title, back = read_chrome_trace(write_chrome_trace(SLICES, tmp_path / "tl.json", title="sd γ=2"))
    assert title == "sd γ=2"
    # in time order, each on its own device row, times kept to the microsecond
    assert [(s.device, s.name, s.args) for s in back] == [("draft", "draft", {"k": 2}),
                                                        ("target", "verify", {"tokens": 3, "accepted": 2})]
    assert [(s.start, s.end) for s in back] == [pytest.approx((0.0, 0.25)), pytest.approx((0.25, 1.25))]


def test_metadata_events_are_read_by_name_not_by_order(tmp_path):
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "gpu"}},
              {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "live decode"}},
              {"name": "step", "ph": "X", "pid": 0, "tid": 1, "ts": 1e6, "dur": 5e5},
              {"name": "step", "ph": "X", "pid": 0, "tid": 2, "ts": 2e6, "dur": 5e5}]
    (tmp_path / "log.json").write_text(json.dumps({"traceEvents": events}))
    title, back = read_chrome_trace(tmp_path / "log.json")
    assert title == "live decode"
    assert [(s.device, s.start, s.end) for s in back] == [("gpu", 1.0, 1.5), ("tid 2", 2.0, 2.5)]


def test_the_trace_asks_viewers_to_show_milliseconds():
    # the Trace Event Format's top-level key is displayTimeUnit, spelled so (the format names no
    # other spelling; a viewer ignores keys it does not know) and the trace holds nothing else
    trace = chrome_trace(SLICES)
    assert trace["displayTimeUnit"] == "ms"
    assert set(trace) == {"traceEvents", "displayTimeUnit"}


def test_device_seconds_add_up_per_kind_of_forward_without_the_prefill():
    # draft 0.25 + 0.5 = 0.75 s; verify (parallel) 1.0 s; the prefill's 2.0 s left out
    forwards = [(kind_of("draft x2"), 0.25), (kind_of("verify (parallel) x5"), 1.0), ("prefill", 2.0),
                (kind_of("draft x1"), 0.5)]
    assert seconds_by_kind(forwards) == {"draft": 0.75, "verify (parallel)": 1.0}


def test_every_event_is_on_the_one_process_with_a_named_thread_row_per_device():
    # Chrome draws an event on the (pid, tid) row it names: one process (0), and a thread row per
    # device whose thread_name metadata event names it
    events = chrome_trace(SLICES)["traceEvents"]
    assert {e["pid"] for e in events} == {0}
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {names[e["tid"]] for e in events if e["ph"] == "X"} == {"draft", "target"}

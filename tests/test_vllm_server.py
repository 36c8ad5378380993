"""``simlab vllm serve``'s mechanics without vLLM: the /metrics reading, the load generator's
times and tokens, the plan's arrivals, the comparison, and bad input refused in one line.

The load generator is checked against a small streaming HTTP server on loopback that answers
as vLLM's completions endpoint streams (``data:`` lines with ``token_ids``), at known moments, so
its clock can be checked to the tens of milliseconds. vLLM itself serving under a burst is in
tests/test_vllm_real.py.
"""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from simlab.common.errors import SimlabError
from simlab.engines.vllm import server as vserver
from simlab.engines.vllm.jobs import Engine
from simlab.live import vllm_serve
from simlab.serve.workload import poisson_arrivals

# the lines of a real vllm serve's /metrics that the reader uses, as vLLM 0.32 prints them (K = 3)
METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="simlab"} 12.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="simlab"} 36.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="simlab"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="simlab",position="0"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="simlab",position="1"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="simlab",position="2"} 8.0
vllm:generation_tokens_total{engine="0",model_name="simlab"} 52.0
vllm:num_requests_running{engine="0",model_name="simlab"} 0.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="simlab"} 1.7e+09
"""


def test_metrics_are_read_as_counters_summed_over_labels_with_the_positions_as_a_list():
    m = vserver.parse_metrics(METRICS)
    assert m["spec_decode_num_drafts"] == 12 and m["generation_tokens"] == 52
    assert m["spec_decode_num_accepted_tokens_per_pos"] == [12, 10, 8]
    assert "num_requests_running" not in m  # a gauge, not a counter
    assert not any(key.endswith("created") for key in m)


def test_counters_are_the_change_between_two_readings():
    before = vserver.parse_metrics(METRICS)
    after = vserver.parse_metrics(METRICS.replace("12.0", "15.0").replace(" 36.0", " 45.0").replace("30.0", "37.0")
                                  .replace('position="2"} 8.0', 'position="2"} 9.0'))
    got = vserver.counters(before, after)
    # 12 -> 15 drafts, 36 -> 45 draft tokens, 30 -> 37 accepted; per position 12->15, 10->10, 8->9
    assert got == {"num_drafts": 3, "num_draft_tokens": 9, "num_accepted_tokens": 7,
                   "num_accepted_tokens_per_pos": [3, 0, 1]}
    # a server's first reading has no spec-decode lines until it ran a step: absent is zero
    assert vserver.counters({}, before)["num_accepted_tokens_per_pos"] == [12, 10, 8]


def test_the_server_command_carries_the_limits_the_speculation_and_no_prefix_cache():
    engine = Engine("/m/target", "float32", 512, {"method": "draft_model", "model": "/m/draft",
                                                  "num_speculative_tokens": 3})
    cmd = vserver.command("py", engine, vserver.Limits(4, 1024), 8123)
    flag = {a: b for a, b in zip(cmd, cmd[1:])}
    assert flag["--max-num-seqs"] == "4" and flag["--max-num-batched-tokens"] == "1024"
    assert flag["--host"] == "127.0.0.1" and flag["--port"] == "8123" and flag["--max-model-len"] == "512"
    assert json.loads(flag["--speculative-config"])["num_speculative_tokens"] == 3
    assert "--no-enable-prefix-caching" in cmd
    assert "--speculative-config" not in vserver.command("py", Engine("/m/target"), vserver.Limits(), 8123)


def test_a_port_in_use_is_refused_in_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SimlabError, match=f"port {port} on 127.0.0.1 is in use"):
            vserver.check_port(port)
    with pytest.raises(SimlabError, match="must be >= 1"):
        vserver.Limits(0, 2048)


def test_a_port_whose_server_is_gone_is_free_though_its_connections_linger():
    """The second server of a run with --port binds the port the first one closed: the first's
    answered connections are in TIME_WAIT on the server's side, which the server's bind ignores."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server closes first: its side of the connection lingers in TIME_WAIT
        client.close()
    vserver.check_port(port)


class _Streamer(BaseHTTPRequestHandler):
    """Streams each request's prompt back as three chunks, DELAY seconds apart, after DELAY."""

    DELAY = 0.2

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        ids = body["prompt"]
        for chunk in ([ids[0]], ids[1:3], ids[3:]):
            time.sleep(self.DELAY)
            self.wfile.write(f"data: {json.dumps({'choices': [{'token_ids': chunk, 'finish_reason': None}]})}\n\n"
                             .encode())
            self.wfile.flush()
        self.wfile.write(b'data: {"choices": [{"token_ids": [], "finish_reason": "length"}]}\n\ndata: [DONE]\n\n')

    def log_message(self, *args):
        pass


@pytest.fixture()
def streamer():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Streamer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_load_generator_posts_on_schedule_and_times_the_first_and_last_token(streamer):
    d = _Streamer.DELAY
    answers = vserver.send(streamer, [[1, 2, 3, 4, 5], [6, 7, 8, 9]], 8, at=[0.0, 0.5])
    a, b = answers
    assert a.token_ids == [1, 2, 3, 4, 5] and b.token_ids == [6, 7, 8, 9]
    assert a.chunks == [1, 2, 2] and b.chunks == [1, 2, 1] and a.finish_reason == "length"
    assert a.sent == pytest.approx(0.0, abs=0.05) and b.sent == pytest.approx(0.5, abs=0.05)
    # first token one delay after the post, the last two more delays after it
    assert a.first - a.sent == pytest.approx(d, abs=0.08) and a.last - a.first == pytest.approx(2 * d, abs=0.08)
    assert b.first - b.sent == pytest.approx(d, abs=0.08)
    with pytest.raises(SimlabError, match="2 arrival times for 1 requests"):
        vserver.send(streamer, [[1]], 1, at=[0.0, 1.0])


def test_a_server_that_is_gone_is_one_line():
    port = vserver.free_port()  # nothing listens there
    with pytest.raises(SimlabError, match="stopped answering during request 0"):
        vserver.send(f"http://127.0.0.1:{port}", [[1, 2]], 2)


def _plan(rate=None, requests=5):
    return vllm_serve.Plan(3, 16, requests, rate, 7, vserver.Limits(4, 512), 1)


def test_the_plan_draws_the_arrivals_simlab_serve_draws_and_cycles_the_prompts():
    assert _plan(rate=2.0).arrivals() == poisson_arrivals(2.0, 5, 7)
    assert _plan().arrivals() == [0.0] * 5

    class _Trace:
        prompts = {"prompt_id": [4, 1, 9]}

    assert vllm_serve.request_prompts(_Trace(), 5) == [1, 4, 9, 1, 4]


def _answer(i, sent, first, last, n):
    return {"index": i, "sent": sent, "first": first, "last": last, "token_ids": list(range(n)), "chunks": [n],
            "finish_reason": "length"}


def test_the_comparison_reports_every_run_and_whether_its_counters_are_the_prediction():
    counters = {"num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 9,
                "num_accepted_tokens_per_pos": [4, 3, 2]}
    times = {"requests": [{"request_id": 0, "prompt_id": 0, "arrival_s": 0.0, "ttft_s": 1.0, "tpot_s": 0.5,
                           "e2e_s": 5.0, "tokens": 9}],
             "throughput_tokens_per_s": 1.8, "ttft_mean_s": 1.0, "ttft_median_s": 1.0, "tpot_mean_s": 0.5,
             "tpot_median_s": 0.5, "e2e_mean_s": 5.0, "e2e_median_s": 5.0}
    prediction = {"counters": counters, "request_prompts": [0], "times": {"speculative": times, "plain": times}}
    runs = {"speculative": [{"repeat": 0, "other_cpu": 0.1, "counters": counters,
                             "answers": [_answer(0, 0.0, 2.0, 6.0, 9)]},
                            {"repeat": 1, "other_cpu": 0.1, "counters": {**counters, "num_accepted_tokens": 8},
                             "answers": [_answer(0, 0.0, 2.0, 6.0, 9)]}],
            "plain": [{"repeat": 0, "other_cpu": 0.1, "counters": {}, "answers": [_answer(0, 0.0, 1.0, 9.0, 9)]},
                      {"repeat": 1, "other_cpu": 0.1, "counters": {}, "answers": [_answer(0, 0.0, 1.0, 9.0, 9)]}]}
    result = vllm_serve.compare(prediction, runs)
    s = result["summary"]
    assert [r["counters_equal_prediction"] for r in s["runs"] if r["kind"] == "speculative"] == [True, False]
    assert not s["counters_equal_in_every_run"]
    row = result["requests"].iloc[0]
    # TTFT 2 s measured against 1 s; TPOT (6 - 2) / 8 = 0.5 s; end to end 6 s
    assert (row["ttft_s_measured"], row["tpot_s_measured"], row["e2e_s_measured"]) == (2.0, 0.5, 6.0)
    # throughput: 9 tokens over 6 s (speculative) and 9 s (plain): 1.5 against 1.8 predicted
    spec = s["runs"][0]
    assert spec["throughput_tokens_per_s_measured"] == pytest.approx(1.5)
    assert s["speculative_throughput_tokens_per_s_error_median"] == pytest.approx(1.8 / 1.5 - 1, abs=1e-4)
    assert s["throughput_speedup_measured_median"] == pytest.approx(9 / 6, abs=1e-4)
    assert s["tokens_equal_plain"] == 2 and s["answers_compared_with_plain"] == 2


def test_a_bursts_first_request_is_predicted_alone_and_the_others_in_the_next_step():
    from simlab.common.locations import ROOT
    from simlab.trace.io import read_trace

    trace = read_trace(ROOT / "results" / "vllm" / "traces" / "smollm2-humaneval-vllm")
    p = vllm_serve.predict(trace, vllm_serve.Plan(4, 32, 4, None, 0, vserver.Limits(4, 2048), 1))
    for kind in ("speculative", "plain"):
        ttft = [r["ttft_s"] for r in p["times"][kind]["requests"]]
        # the first prompt's prefill is a step of its own; the other three are prefilled in the next
        # step, beside its first verification, so their first tokens come a step later
        assert ttft[0] < ttft[1] == pytest.approx(ttft[2]) == pytest.approx(ttft[3]), (kind, ttft)
    assert p["arrivals"][0] == 0.0 and p["arrivals"][1:] == [vllm_serve.BURST_LAG_S] * 3


def _smollm2():
    from simlab.common.locations import ROOT
    from simlab.trace.io import read_trace

    return read_trace(ROOT / "results" / "vllm" / "traces" / "smollm2-humaneval-vllm")


def test_a_table_of_one_k_is_predicted_as_the_fixed_k_server_counters_included():
    trace = _smollm2()
    p = vllm_serve.predict(trace, vllm_serve.Plan(4, 32, 4, None, 0, vserver.Limits(2, 2048), 1, table=((1, 4),)))
    assert list(p["times"]) == ["speculative", "table", "plain"]
    # the counters of the served run (simlab.serve) against those of the offline prediction (simlab.live.vllm)
    assert p["table_counters"] == p["counters"] and p["counters"]["num_drafts"] > 0
    assert p["times"]["table"]["throughput_tokens_per_s"] == p["times"]["speculative"]["throughput_tokens_per_s"]


def test_a_table_server_drafts_the_k_of_each_steps_batch_size_and_is_its_own_server():
    trace = _smollm2()
    plan = vllm_serve.Plan(4, 32, 4, None, 0, vserver.Limits(4, 2048), 1, table=((1, 4), (2, 0)))
    p = vllm_serve.predict(trace, plan)
    table, fixed = p["table_counters"], p["counters"]
    # no drafts while several run, K only alone: a verification with drafts has K of them, and
    # the steps without are no drafts of vLLM's counters
    assert 0 < table["num_draft_tokens"] < fixed["num_draft_tokens"]
    assert table["num_draft_tokens"] == 4 * table["num_drafts"]
    assert table["num_accepted_tokens_per_pos"][0] >= table["num_accepted_tokens_per_pos"][1]
    assert plan.kinds == ("speculative", "table", "plain") and plan.as_json()["table"] == [[1, 4], [2, 0]]
    servers = vllm_serve.Servers("python", "target", "draft", "float32", 512)
    config = servers.engine("table", 4, plan.table).speculative_config
    assert config["num_speculative_tokens"] == 4
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 2, 0]]
    assert servers.engine("speculative", 4).speculative_config == {k: v for k, v in config.items()
                                                            if k != "num_speculative_tokens_per_batch_size"}


def test_a_plan_without_a_table_reads_the_predictions_committed_before_tables_were_served():
    from simlab.common.locations import ROOT

    out = ROOT / "results" / "vllm" / "smollm2-serve-burst4"
    plan = vllm_serve.Plan(4, 128, 4, None, 0, vserver.Limits(4, 2048), 2)
    assert plan.kinds == ("speculative", "plain") and vllm_serve.read_prediction(out, plan) is not None


def test_a_stopped_server_is_gone_with_every_process_of_its_session(tmp_path):
    """The engine core outlives the API server by a moment and holds its port: stop waits for it to
    end by itself (it writes its file as it ends; killed, it would not)."""
    import subprocess
    import sys

    done = tmp_path / "done"
    child = (f"import pathlib, signal, time; signal.signal(signal.SIGTERM, lambda *a: None); time.sleep(1.5); "
             f"pathlib.Path({str(done)!r}).write_text('1')")
    leader = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", leader], start_new_session=True)
    time.sleep(0.5)  # the child is up
    assert vserver._session_alive(proc.pid)
    vserver.stop(proc)
    assert not vserver._session_alive(proc.pid) and done.exists()

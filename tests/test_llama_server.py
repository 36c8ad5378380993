"""llama-server against serve, the parts that need no server: the trace read as the server
decodes it, the prediction's counts by hand, and a burst's measured figures
(the real server: tests/test_llama_cpp_real.py)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from simlab.common.errors import SimlabError
from simlab.engines.llama_cpp.server import Answer, Drafting, send
from simlab.live.llama_server import (
    burst_figures,
    compare,
    first_divergence,
    greedy_paths,
    latency_figures,
    predict,
    prefill_ks,
    server_view,
    slot_context,
    speedups,
)
from tests.helpers import hand_trace, latency_table


def _llama(trace):
    return replace(trace, manifest=replace(trace.manifest, extra={**trace.manifest.extra, "engine": "llama.cpp"}))


def test_the_server_prefills_the_whole_prompt_so_positions_move_back_by_one():
    trace = _llama(hand_trace(["1101111111", "1111111111"]))
    view = server_view(trace, 6)
    assert view.prompts["prompt_len"].tolist() == [11, 11]  # the prompt's last token is the server's
    assert view.prompts["n_tokens"].tolist() == [6, 6]
    first = view.positions[view.positions["prompt_id"] == 0]
    assert first["pos"].tolist() == list(range(6))
    # position 2 of the trace (the rejected draft) is position 1 of the server's
    assert first["accept_prob"].tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_only_a_llama_cpp_trace_long_enough_is_served():
    with pytest.raises(SimlabError, match="llama-cpp record"):
        server_view(hand_trace(["1111"]), 2)
    with pytest.raises(SimlabError, match="at least 9 positions"):
        server_view(_llama(hand_trace(["1111"])), 8)


def test_the_prediction_follows_the_servers_budget_rule():
    # 10 tokens, draft-max 3, every draft accepted: the prefill's token, two rounds of 3 drafts + 1,
    # then one token left: n_remaining - 1 = 0 drafts, a plain target step
    view = server_view(_llama(hand_trace(["1" * 11, "1" * 11], latency=latency_table(draft=0.25, verify={
        1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}))), 10)
    rows, figures = predict(view, 2, Drafting(3))
    assert rows["predicted_tokens"].tolist() == [10, 10]
    assert rows["predicted_drafted"].tolist() == [6, 6] and rows["predicted_accepted"].tolist() == [6, 6]
    assert figures["tokens_per_s"] > 0 and "token-count rule" in figures["latency_rule"]
    assert slot_context(view, Drafting(3)) == 64  # 11 + 10 + 3 + 2 tokens, rounded up


def test_a_prompt_past_the_servers_batch_is_refused_in_its_own_terms():
    trace = _llama(hand_trace(["1" * 11, "1" * 11]))
    view = server_view(replace(trace, prompts=trace.prompts.assign(prompt_len=[2040, 30])), 10)
    predict(view, 1, Drafting(3))  # 2041 tokens (the prompt's last is the server's) fit in 2048
    with pytest.raises(SimlabError, match=r"llama-server's batch \(-b.* 2048 is too small: .*2041 tokens\) beside 8 .* needs 2049"):
        predict(view, 9, Drafting(3))


def test_the_baseline_server_is_predicted_by_ad_from_the_plain_steps():
    # the same 10 tokens with no draft model: nine plain steps of 0.6 s after the prefill's token
    lat = latency_table(draft=0.25, verify={1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}, plain=0.6)
    view = server_view(_llama(hand_trace(["1" * 11], latency=lat)), 10)
    rows, figures = predict(view, 1, None)
    assert rows["predicted_tokens"].tolist() == [10] and rows["predicted_drafted"].tolist() == [0]
    assert rows["predicted_decode_s"].tolist() == pytest.approx([9 * 0.6])
    assert figures["tokens_per_s"] == pytest.approx(9 / (9 * 0.6))
    assert slot_context(view, None) == 64  # 11 + 10 + 2 tokens, rounded up


def test_a_rounds_speedup_divides_its_speculative_burst_by_the_plain_one():
    bursts = [{"policy": "llama-cpp", "batch": 1, "repeat": 0, "measured_tokens_per_s": 6.0, "predicted_tokens_per_s": 6.6},
              {"policy": "ad", "batch": 1, "repeat": 0, "measured_tokens_per_s": 5.0, "predicted_tokens_per_s": 5.0},
              {"policy": "llama-cpp", "batch": 2, "repeat": 0, "measured_tokens_per_s": 9.0, "predicted_tokens_per_s": 9.0}]
    assert speedups(bursts) == [{"batch": 1, "repeat": 0, "measured_speedup": 1.2, "predicted_speedup": 1.32,
                                 "error_speedup": 0.1}]  # B = 2 had no plain burst: no speedup


def test_a_baseline_needs_latencies_with_the_plain_step(tmp_path, capsys):
    from simlab.cli import main
    from simlab.trace.io import write_trace

    path = write_trace(_llama(hand_trace(["1" * 40])), tmp_path / "old")
    with pytest.raises(SystemExit) as exit_:  # before anything is built
        main(["llama-cpp", "serve", "--trace", str(path), "--batch", "1", "-n", "8", "--baseline"])
    assert exit_.value.code == 2 and "no plain target step" in capsys.readouterr().err


def _answer(i, received, predicted_ms, n=10, drafted=6, accepted=6, tokens=()):
    return Answer(i, 0.0, received, n, predicted_ms, 11, 5.0, drafted, accepted, "limit", tokens)


def test_a_bursts_decode_phase_runs_from_the_first_first_token_to_the_last_answer():
    answers = [_answer(0, 3.0, 2000.0), _answer(1, 4.0, 2500.0)]  # first tokens at 1.0 and 1.5
    figures = burst_figures(answers)
    assert figures["tokens_per_s"] == pytest.approx(18 / 3.0)
    assert figures["first_token_spread_s"] == pytest.approx(0.5)


def test_measured_and_predicted_are_matched_request_by_request():
    view = server_view(_llama(hand_trace(["1" * 11, "1" * 11])), 10)
    rows, _ = predict(view, 2, Drafting(3))
    paths = greedy_paths(view)
    assert paths[1] == list(range(1101, 1111))  # the hand trace's target tokens, from its position 1
    off = tuple(paths[1][:4]) + (7,) + tuple(paths[1][5:])
    table = compare(rows, [_answer(1, 2.0, 1000.0, drafted=5, tokens=off), _answer(0, 2.0, 1000.0, tokens=tuple(paths[0]))],
                    paths)
    assert table["match_drafted"].tolist() == [True, False]
    assert table["match_tokens"].all() and table["match_accepted"].all()
    assert table["measured_decode_s"].tolist() == [1.0, 1.0]
    assert table["diverged_at"].tolist() == [-1, 4]


def test_a_path_cut_short_or_run_long_diverges_where_one_ends():
    assert first_divergence((1, 2, 3), [1, 2, 3]) == -1
    assert first_divergence((1, 2), [1, 2, 3]) == 2
    assert first_divergence((1, 2, 3, 4), [1, 2, 3]) == 3
    assert first_divergence((9, 2, 3), [1, 2, 3]) == 0


def test_a_request_arriving_while_another_decodes_is_prefilled_in_its_verification_by_hand():
    # server view: 11-token prompts, 10 tokens each, every draft accepted; draft step 0.25 s, a
    # k-token forward 1.0 + 0.5 (k - 1) s, a prefill that forward times 1.25 (the draft's too).
    # Request 0 (t = 0) is prefilled alone: first token at 6.0 * 1.25 = 7.5 s. Request 1 (t = 1)
    # joins the next step, where request 0 drafts 3 (0.75 s) and verifies 4 tokens (2.5 s), and
    # its prompt rides in that forward: prefill(11 + 4) - prefill(4) = (8.0 - 2.5) * 1.25 =
    # 6.875 s, so its first token comes at 7.5 + 0.75 + 2.5 + 6.875 = 17.625 s, 16.625 s after it arrived
    view = server_view(_llama(hand_trace(["1" * 11, "1" * 11], latency=latency_table(draft=0.25, verify={
        1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}))), 10)
    rows, _ = predict(view, 2, Drafting(3), arrivals=[0.0, 1.0])
    assert rows["predicted_ttft_s"].tolist() == [7.5, 16.625]
    assert rows["predicted_tokens"].tolist() == [10, 10]
    assert (rows["predicted_e2e_s"] > rows["predicted_ttft_s"]).all()
    # a burst is prefilled in its first step, before anyone decodes: the same for both schedulers
    burst, _ = predict(view, 2, Drafting(3))
    assert burst["predicted_ttft_s"].tolist() == [(1.0 + 0.5 * 21) * 1.25] * 2


def test_prefills_are_timed_at_powers_of_two_up_to_the_longest_prompt():
    view = server_view(_llama(hand_trace(["1" * 11])), 6)  # an 11-token prompt
    assert prefill_ks(view) == (16,)
    longer = replace(view, prompts=view.prompts.assign(prompt_len=[129]))
    assert prefill_ks(longer) == (16, 32, 64, 128, 256)


def test_a_runs_mean_latencies_and_their_errors():
    table = pd.DataFrame({"measured_ttft_s": [1.0, 3.0], "predicted_ttft_s": [1.5, 2.5],
                          "measured_e2e_s": [4.0, 6.0], "predicted_e2e_s": [5.0, 5.0]})
    assert latency_figures(table) == {"measured_ttft_mean_s": 2.0, "predicted_ttft_mean_s": 2.0, "error_ttft_mean": 0.0,
                                      "measured_e2e_mean_s": 5.0, "predicted_e2e_mean_s": 5.0, "error_e2e_mean": 0.0}
    table["predicted_ttft_s"] = [2.0, 3.0]
    assert latency_figures(table)["error_ttft_mean"] == 0.25


def test_the_load_generator_posts_each_request_at_its_arrival_time():
    # a stand-in server on loopback that notes when each request came and answers at once
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    came = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            came[body["prompt"]] = time.perf_counter()
            answer = json.dumps({"timings": {"predicted_n": 1, "predicted_ms": 0.0, "prompt_n": 1, "prompt_ms": 0.0},
                                 "tokens": [1]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        answers = send(f"http://127.0.0.1:{server.server_address[1]}", ["a", "b", "c"], 1, at=[0.3, 0.0, 0.6])
        server.shutdown()
    assert [a.index for a in answers] == [0, 1, 2]
    assert sorted(came, key=came.get) == ["b", "a", "c"]
    assert came["a"] - came["b"] >= 0.29 and came["c"] - came["a"] >= 0.29  # none early (timer slack: 10 ms)
    with pytest.raises(SimlabError, match="2 arrival times for 3 requests"):
        send("http://127.0.0.1:9", ["a", "b", "c"], 1, at=[0.0, 1.0])


def test_arrival_options_without_a_rate_are_refused(tmp_path, capsys):
    from simlab.cli import main
    from simlab.trace.io import write_trace

    path = write_trace(_llama(hand_trace(["1" * 40])), tmp_path / "t")
    with pytest.raises(SystemExit) as exit_:
        main(["llama-cpp", "serve", "--trace", str(path), "--batch", "1", "-n", "8", "--requests", "4"])
    assert exit_.value.code == 2 and "add --rate" in capsys.readouterr().err

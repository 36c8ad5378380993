"""vLLM's synthetic acceptance (``rejection_sample_method: "synthetic"``), predicted by simlab.

The profile is refused as vLLM 0.32.0 refuses it (``SpeculativeConfig._resolve_synthetic_acceptance_rates``),
before anything loads; the counters' expectation is exact (steps by recursion, acceptances by Wald's
identity) and agrees with simulated loads; the served prediction on an imposed profile of rates 1 is
the pair's own prediction of a trace that accepts everything (SmolLM2 drafting for itself), and of
rates 0 a verification per token; the CPU kernel simlab supplies is vLLM's Triton kernel's rule.
"""

import numpy as np
import pytest

from simlab.common.errors import SimlabError
from simlab.common.locations import ROOT
from simlab.engines.vllm import server as vserver
from simlab.engines.vllm import simlab_vllm_synthetic as shim
from simlab.live import vllm_serve
from simlab.policies.vllm import conditional_rates, speculative_config, synthetic_rates
from simlab.serve.synthetic import counter_moments, draw_accepted, simulate_counters, steps_moments
from tests.test_bad_inputs import run_cli

TRACE = ROOT / "results" / "vllm" / "traces" / "smollm2-humaneval-vllm-avx512"


@pytest.mark.parametrize(("rates", "length", "words"), [
    (None, None, "requires exactly one of synthetic_acceptance_rates or synthetic_acceptance_length"),
    ([0.9, 0.5, 0.2, 0.1], 2.0, "requires exactly one of"),
    ([0.9, 0.5, 0.2], None, "synthetic_acceptance_rates must have length 4, got [0.9, 0.5, 0.2]."),
    ([1.2, 0.5, 0.2, 0.1], None, "entries must be in [0, 1], got [1.2, 0.5, 0.2, 0.1]."),
    ([0.9, 0.5, -0.1, 0.0], None, "entries must be in [0, 1]"),
    ([0.9, float("nan"), 0.2, 0.1], None, "entries must be in [0, 1]"),
    ([0.5, 0.6, 0.2, 0.1], None, "synthetic_acceptance_rates must be non-increasing, got [0.5, 0.6, 0.2, 0.1]."),
    (None, 5.5, "synthetic_acceptance_length must be in [1, 5], got 5.5."),
    (None, 0.5, "synthetic_acceptance_length must be in [1, 5]"),
])
def test_a_profile_vllm_refuses_is_refused_in_its_words(rates, length, words):
    with pytest.raises(SimlabError) as exc:
        synthetic_rates(4, rates, length)
    assert str(exc.value).startswith("vLLM would refuse this: ") and words in str(exc.value)


def test_a_profile_resolves_as_vllm_resolves_it():
    assert synthetic_rates(4, [0.9, 0.9, 0.3, 0.0]) == [0.9, 0.9, 0.3, 0.0]  # equal neighbours are non-increasing
    # _acceptance_length_to_rates: the minimum-variance schedule
    assert synthetic_rates(4, length=2.5) == [1.0, 0.5, 0.0, 0.0]
    assert synthetic_rates(4, length=5.0) == [1.0, 1.0, 1.0, 1.0]
    assert synthetic_rates(4, length=1.0) == [0.0, 0.0, 0.0, 0.0]
    assert conditional_rates([0.9, 0.45, 0.0, 0.0]) == pytest.approx([0.9, 0.5, 0.0, 0.0])
    spec = speculative_config(4, "smollm2", [0.9, 0.45, 0.0, 0.0])
    assert spec == {"method": "draft_model", "model": "smollm2", "num_speculative_tokens": 4,
                    "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.45, 0.0, 0.0]}
    assert "rejection_sample_method" not in speculative_config(4, "smollm2")


@pytest.mark.parametrize("args", [
    ["--synthetic-acceptance-rates", "0.9,0.95,0.5,0.3"],
    ["--synthetic-acceptance-rates", "0.9,0.7,0.5"],
    ["--synthetic-acceptance-rates", "0.9,x"],
    ["--synthetic-acceptance-rates", "0.9,0.7,0.5,0.3", "--synthetic-acceptance-length", "2"],
    ["--synthetic-acceptance-length", "7"],
    ["--synthetic-acceptance-rates", "0.9,0.7,0.5,0.3", "--draws", "0"],
])
def test_the_command_refuses_a_bad_profile_in_one_line_before_anything_loads(capsys, tmp_path, args):
    code, _, err = run_cli(capsys, "vllm", "serve", "--trace", tmp_path / "no-trace", "--out", tmp_path / "out",
                           "--k", "4", *args)
    assert code == 2 and err.startswith("simlab: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_steps_accepted_count_has_the_profiles_distribution():
    rates = [0.9, 0.6, 0.3, 0.1]
    a = draw_accepted(rates, 200_000, np.random.default_rng(1))
    assert [float((a >= i).mean()) for i in range(1, 5)] == pytest.approx(rates, abs=0.004)


def test_the_steps_expectation_is_exact():
    # every draft accepted with K = 3: 4 tokens a step, so 127 tokens after the prefill take 32 steps
    assert steps_moments([1.0, 1.0, 1.0], 128) == (32.0, 0.0)
    assert steps_moments([0.0, 0.0, 0.0], 128) == (127.0, 0.0)  # a verification per token
    assert steps_moments([0.5], 1) == (0.0, 0.0)  # the prefill's token is the whole output
    # K = 1, p = 0.5, 3 tokens: 2 to go, 1 step if it accepts (2 tokens), else 2
    mean, var = steps_moments([0.5], 3)
    assert (mean, var) == pytest.approx((1.5, 0.25))


def test_the_counters_expectation_agrees_with_simulated_loads():
    rates, lengths = [0.8, 0.5, 0.3, 0.1], [64, 64, 40]
    m = counter_moments(rates, lengths, 4, draws=2000, seed=3)
    sim = simulate_counters(rates, lengths, 20_000, np.random.default_rng(4))
    assert sim["drafts"].mean() == pytest.approx(m["mean"]["num_drafts"], rel=0.005)
    assert sim["drafts"].std() == pytest.approx(m["sd"]["num_drafts"], rel=0.05)
    assert sim["per_pos"].mean(axis=0) == pytest.approx(m["mean"]["num_accepted_tokens_per_pos"], rel=0.01)
    assert m["mean"]["num_draft_tokens"] == 4 * m["mean"]["num_drafts"]
    assert m["mean"]["num_accepted_tokens"] == pytest.approx(sum(m["mean"]["num_accepted_tokens_per_pos"]))


def _plan(rates, max_tokens=32, draws=3):
    return vllm_serve.Plan(4, max_tokens, 4, None, 0, vserver.Limits(4, 2048), 1,
                           synthetic=None if rates is None else tuple(rates), draws=draws)


def test_rates_of_one_predict_what_the_pair_that_accepts_everything_predicts():
    """SmolLM2 drafting for itself accepts every draft, past each end too: its own prediction with
    speculation at max_tokens 32 (every prompt runs past 32) is the synthetic one of rates 1, step
    for step."""
    from simlab.trace.io import read_trace

    trace = read_trace(TRACE)
    assert (trace.prompts["n_tokens"] >= 32).all()
    own = vllm_serve.predict(trace, _plan(None))
    imposed = vllm_serve.predict(trace, _plan([1.0] * 4))
    assert own["counters"] == {k: (pytest.approx(v) if not isinstance(v, list) else pytest.approx(v))
                               for k, v in imposed["counters"].items()}
    assert imposed["counters_sd"]["num_drafts"] == 0.0
    for key in vllm_serve.FIGURES:
        assert imposed["times"]["speculative"][key] == pytest.approx(own["times"]["speculative"][key]), key
    assert imposed["times"]["speculative"]["steps"] == own["times"]["speculative"]["steps"]
    # the plain server runs every request to max_tokens too (own's runs each prompt to the trace's end)
    assert all(r["tokens"] == 32 for r in imposed["times"]["plain"]["requests"])
    assert imposed["plan"]["ignore_eos"] and "synthetic" not in own["plan"] and "draws" not in own["plan"]


def test_rates_of_zero_verify_one_token_a_step_and_lower_rates_serve_slower():
    from simlab.trace.io import read_trace

    trace = read_trace(TRACE)
    zero = vllm_serve.predict(trace, _plan([0.0] * 4))
    assert zero["counters"]["num_drafts"] == 4 * 31 and zero["counters"]["num_accepted_tokens"] == 0
    assert all(r["tokens"] == 32 for r in zero["times"]["speculative"]["requests"])
    high = vllm_serve.predict(trace, _plan([0.9, 0.8, 0.7, 0.6]))
    low = vllm_serve.predict(trace, _plan([0.5, 0.25, 0.1, 0.05]))
    speeds = [p["times"]["speculative"]["throughput_tokens_per_s"] for p in (high, low, zero)]
    assert speeds == sorted(speeds, reverse=True)
    d = high["times"]["speculative"]["draws"]["throughput_tokens_per_s"]
    assert d["min"] <= high["times"]["speculative"]["throughput_tokens_per_s"] <= d["max"]
    # the plain server does not depend on the profile
    assert high["times"]["plain"]["throughput_tokens_per_s"] == low["times"]["plain"]["throughput_tokens_per_s"]


def test_a_runs_counters_are_scored_against_their_expectation():
    prediction = {"counters": {"num_drafts": 100.0, "num_draft_tokens": 400.0, "num_accepted_tokens": 150.0,
                               "num_accepted_tokens_per_pos": [80.0, 50.0, 20.0, 0.0]},
                  "counters_sd": {"num_drafts": 5.0, "num_draft_tokens": 20.0, "num_accepted_tokens": 10.0,
                                  "num_accepted_tokens_per_pos": [4.0, 5.0, 4.0, 0.0]},
                  "synthetic": {"rates": [0.8, 0.5, 0.2, 0.0]}}
    measured = {"num_drafts": 110, "num_draft_tokens": 440, "num_accepted_tokens": 150,
                "num_accepted_tokens_per_pos": [88, 42, 20, 0]}
    e = vllm_serve.synthetic_counters(measured, prediction)
    assert e["z"]["num_drafts"] == pytest.approx(2.0) and e["z"]["num_accepted_tokens_per_pos"][3] == 0.0
    assert e["acceptance_rate_per_pos_measured"] == pytest.approx([0.8, 42 / 110, 20 / 110, 0.0])
    assert e["acceptance_rate_per_pos_z"][0] == pytest.approx(0.0)
    assert e["within"]
    measured["num_accepted_tokens_per_pos"][3] = 1  # an acceptance at a position of rate 0
    assert not vllm_serve.synthetic_counters(measured, prediction)["within"]


def test_the_cpu_kernel_is_vllms_synthetic_rule():
    torch = pytest.importorskip("torch")
    # two requests of 3 drafts: the first accepts two (0.1 < 0.9, 0.5 < 0.6) and rejects the third
    # (0.7 >= 0.5), so it keeps drafts 11, 12 and the target's 23; the second accepts all (its drafts
    # differ from the target's, which does not matter) and gets the bonus token
    out = torch.full((2, 4), -1, dtype=torch.int32)
    shim._synthetic_greedy(out, torch.tensor([3, 6]), torch.tensor([11, 12, 13, 14, 15, 16]),
                           torch.tensor([21, 22, 23, 24, 25, 26]), torch.tensor([[91], [92]]), None, 3,
                           torch.tensor([0.1, 0.5, 0.7, 0.0, 0.0, 0.0], dtype=torch.float64),
                           torch.tensor([0.9, 0.6, 0.5]))
    assert out.tolist() == [[11, 12, 23, -1], [14, 15, 16, 92]]
    # a padded draft (-1) is rejected whatever the draw, and a non-greedy request is left alone
    out = torch.full((2, 3), -1, dtype=torch.int32)
    shim._synthetic_greedy(out, torch.tensor([2, 4]), torch.tensor([-1, 12, 13, 14]), torch.tensor([21, 22, 23, 24]),
                           torch.tensor([91, 92]), torch.tensor([True, False]), 2,
                           torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 1.0]))
    assert out.tolist() == [[21, -1, -1], [-1, -1, -1]]
    calls = []

    def original(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
                 max_spec_len, uniform_probs=None, synthetic_conditional_rates=None, SYNTHETIC_MODE=False):  # noqa: N803
        calls.append(SYNTHETIC_MODE)

    shim.wrap(original)(*([None] * 7))  # a plain step is vLLM's own C++ kernel's
    assert calls == [False]
    with pytest.raises(RuntimeError, match="changed its signature"):
        shim.wrap(lambda a, b: None)


def test_a_synthetic_server_carries_the_profile_and_the_kernel():
    servers = vllm_serve.Servers("python", "/m/target", "/m/draft", "float32", 512)
    engine = servers.engine("speculative", 4, synthetic=(0.9, 0.5, 0.2, 0.1))
    cmd = vserver.command("python", engine, vserver.Limits(4, 2048), 18100)
    assert cmd[cmd.index("--worker-extension-cls") + 1] == "simlab_vllm_synthetic.SyntheticKernel"
    assert '"rejection_sample_method": "synthetic"' in cmd[cmd.index("--speculative-config") + 1]
    assert engine.pythonpath == (str(vllm_serve.SHIM.parent),) and vllm_serve.SHIM.exists()
    plain = vserver.command("python", servers.engine("plain", 4, synthetic=(0.9, 0.5, 0.2, 0.1)), vserver.Limits(4, 2048), 1)
    assert "--worker-extension-cls" not in plain and "--speculative-config" not in plain
    assert "--worker-extension-cls" not in vserver.command("python", servers.engine("speculative", 4),
                                                           vserver.Limits(4, 2048), 1)


def test_the_profile_trace_runs_each_prompt_to_max_tokens_and_k_past_it():
    from simlab.serve.run import ServeConfig, serve_once
    from simlab.serve.synthetic import impose, profile_trace
    from simlab.serve.vllm_scheduler import VllmScheduler
    from simlab.sim.run import Simulator
    from simlab.trace.io import read_trace

    trace = read_trace(TRACE)
    t = profile_trace(trace, 20, 3)
    assert (t.prompts["n_tokens"] == 20).all() and (t.positions.groupby("prompt_id").size() == 20).all()
    assert (t.past_end.groupby("prompt_id").size() == 3).all() and t.past_end["pos"].min() == 20
    assert t.latency is trace.latency and list(t.prompts["prompt_len"]) == list(trace.prompts["prompt_len"])
    # every draft accepted, the last step's past the end too: 19 tokens after the prefill, 4 a step,
    # so 5 steps of 3 accepted each
    sim = Simulator(t)
    params = {"num_speculative_tokens": 3, "max_tokens": 20}
    prompts = impose(sim.past_end_replay(3).prompts, [1.0, 1.0, 1.0], np.random.default_rng(0))
    run = serve_once(sim, [0.0], ServeConfig("vllm", params, VllmScheduler(4, 2048)), "vllm", params, prompts=prompts)
    r = run.requests[0]
    assert (r.counts.target_calls, r.counts.accepted, r.kept) == (5, 15, 20)

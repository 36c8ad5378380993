"""`simlab policies` and the policy flags of `simlab simulate`, as a user runs them."""

import json
import os
import re
import subprocess
import sys

import pytest

from simlab.cli.policy_options import declared, flag_help, flag_type
from simlab.policies import REGISTRY
from tests.test_cli import one_line_error, simlab, synthetic  # noqa: F401 (fixture)


def wide_help(*command):
    """``--help`` of a command, wide enough that Rich cuts no option name or default."""
    env = {**os.environ, "COLUMNS": "400", "TERM": "dumb"}
    proc = subprocess.run([sys.executable, "-m", "simlab", *command, "--help"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_policies_lists_every_policy_with_parameters_defaults_and_paper():
    text = simlab("policies").stdout
    for name, cls in REGISTRY.items():
        assert f"{name} (" in text
        for p in cls.params:
            assert f"--param {p.name}=" in text
    rows = json.loads(simlab("policies", "--json").stdout)
    assert [r["name"] for r in rows] == list(REGISTRY)
    spide = next(r for r in rows if r["name"] == "spide")
    assert {p["name"]: p["default"] for p in spide["params"]} == {"tau": 0.7, "window": None, "prior": 1.0}
    assert "Algorithm 1" in spide["paper"] and spide["schedule"] == "parallel" and spide["choices"]


def test_unknown_policy_is_one_line():
    one_line_error(simlab("policies", "nope", check=False), "unknown policy 'nope'")


@pytest.mark.parametrize("args", [("--policy", "spide", "--tau", "0.6", "--window", "3"),
                                  ("--policy", "pacer", "--block", "2", "--threshold", "0.6"),
                                  ("--policy", "ags", "--rejection-threshold", "0.5"),
                                  ("--policy", "svip", "--entropy-threshold", "0.4")])
def test_policy_flags_set_the_parameter_of_the_same_name(synthetic, args):  # noqa: F811
    out = json.loads(simlab("simulate", "--trace", synthetic, *args, "--json").stdout)
    flags = dict(zip(args[2::2], args[3::2]))
    for flag, value in flags.items():
        assert out["params"][flag.lstrip("-").replace("-", "_")] == pytest.approx(float(value))


@pytest.mark.parametrize("command", ["simulate", "live", "serve"])
def test_every_declared_parameter_and_alias_has_a_flag_and_no_flag_is_h(command):
    text = wide_help(command)
    names = {name for cls in REGISTRY.values() for p in cls.params for name in (p.name, *p.aliases)}
    flags = set(re.findall(r"--([a-z0-9-]+)", text))
    assert {n.replace("_", "-") for n in names} <= flags
    assert "h" not in flags  # -h is help; no parameter is called h any more


def test_a_parameter_name_has_one_type_across_policies():
    for name, uses in declared().items():
        flag_type(name, uses)  # raises on a name declared with two types


def test_a_flags_help_names_the_policies_it_sets_by_their_own_name_and_as_an_alias():
    """``--num-speculative-tokens`` is vllm's own parameter and an engine's name for pld's num_tokens."""
    uses = declared()["num_speculative_tokens"]
    text = flag_help("num_speculative_tokens", uses)
    own, _, aliased = text.partition(" Also, as Hugging Face or vLLM name it: ")
    assert own.startswith("For ") and "vllm" in own.removeprefix("For ").split(".")[0].split(", ")
    assert "pld num_tokens" in aliased and "vllm" not in aliased.split(".")[0]
    assert text.endswith(".") and " Values: " in text


def test_hugging_face_flags_match_the_parameters_they_alias(synthetic):  # noqa: F811
    by_hf = json.loads(simlab("simulate", "--trace", synthetic, "--policy", "hf-confidence",
                              "--assistant-confidence-threshold", "0.3", "--num-assistant-tokens", "7",
                              "--num-assistant-tokens-schedule", "heuristic", "--json").stdout)
    ours = json.loads(simlab("simulate", "--trace", synthetic, "--policy", "hf-confidence", "--threshold", "0.3",
                             "--max-draft", "7", "--schedule", "heuristic", "--json").stdout)
    assert by_hf == ours
    assert ours["params"] == {"policy": "hf-confidence", "threshold": 0.3, "max_draft": 7, "schedule": "heuristic",
                              "retune": False}


@pytest.mark.parametrize("args, message", [(("--policy", "sd", "--gamma", "0"), "gamma must be an integer >= 1"),
                                           (("--policy", "sd", "--param", "gama=3"), "has no parameter(s) ['gama']"),
                                           (("--policy", "hf-heuristic", "--schedule", "constant"), "schedule must be")])
def test_unknown_or_out_of_range_parameters_fail_in_one_line_with_status_2(synthetic, args, message):  # noqa: F811
    proc = simlab("simulate", "--trace", synthetic, *args, check=False)
    assert proc.returncode == 2
    one_line_error(proc, message)


def test_a_flag_the_policy_lacks_is_one_line(synthetic):  # noqa: F811
    one_line_error(simlab("simulate", "--trace", synthetic, "--policy", "sd", "--tau", "0.5", check=False),
                   "policy 'sd' has no parameter(s) ['tau']")


def test_bad_parameter_values_are_one_line(synthetic):  # noqa: F811
    one_line_error(simlab("simulate", "--trace", synthetic, "--policy", "spide", "--tau", "1.5", check=False),
                   "tau must be a number in [0, 1]")
    one_line_error(simlab("simulate", "--trace", synthetic, "--policy", "del", check=False), "early-exit signals")


def test_spide_timeline_shows_drafting_and_verification_overlap(synthetic, tmp_path):  # noqa: F811
    out = tmp_path / "spide.json"
    simlab("simulate", "--trace", synthetic, "--policy", "spide", "--timeline", out)
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    draft = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == 0 and "parallel" in e["name"]]
    target = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == 1 and "parallel" in e["name"]]
    assert draft and any(d0 < t1 and t0 < d1 for d0, d1 in draft for t0, t1 in target)

"""`simlab policies` and the policy flags of `simlab simulate`, as a user runs them."""

import json

import pytest

from simlab.policies import REGISTRY
from tests.test_cli import one_line_error, simlab, synthetic  # noqa: F401 (fixture)


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
                                  ("--policy", "ags", "--h", "0.5"), ("--policy", "svip", "--h", "0.4")])
def test_policy_flags_set_the_parameter_of_the_same_name(synthetic, args):  # noqa: F811
    out = json.loads(simlab("simulate", "--trace", synthetic, *args, "--json").stdout)
    flags = dict(zip(args[2::2], args[3::2]))
    for flag, value in flags.items():
        assert out["params"][flag.lstrip("-")] == pytest.approx(float(value))


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

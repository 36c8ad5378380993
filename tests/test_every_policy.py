"""Every policy under every command that takes ``--policy``, on a shipped trace that every policy
can replay (``smollm2-tree``: exit layers for DEL and LayerSkip, top-k candidates and EAGLE-2 trees
for the tree policies; REST's datastore is built from it): each runs to the end, or is refused in one
line before any work where the command cannot run it (``serve`` batches neither parallel rounds nor
lookup rounds). A valid input must never crash.

``simlab live`` runs every policy on real models in tests/test_live.py (the oracle, which sees the
future, is refused there: the fault table). The commands run in-process through
:func:`simlab.cli.main`, as tests/test_bad_inputs.py runs them.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simlab.common.locations import TRACES
from simlab.policies import REGISTRY
from tests.test_bad_inputs import run_cli

TRACE = TRACES / "smollm2-tree"
PARALLEL = sorted(name for name, cls in REGISTRY.items() if cls.parallel)
LOOKUP = sorted(name for name, cls in REGISTRY.items() if cls.looks_up and not cls.parallel)
SERIAL = [name for name in REGISTRY if name not in PARALLEL + LOOKUP]  # what serve batches
# why serve refuses a policy, in its one line
REFUSED = {**{name: f"serve does not batch parallel policies ({name})" for name in PARALLEL},
           **{name: f"serve does not batch lookup rounds yet ({name})" for name in LOOKUP}}


@pytest.fixture(scope="module")
def datastore(tmp_path_factory):
    """REST's datastore, of the trace's own outputs."""
    from simlab.cli import main

    out = tmp_path_factory.mktemp("datastore") / "store.npz"
    main(["datastore", "build", "--trace", str(TRACE), "--out", str(out)])
    return out


def spec(policy: str, datastore) -> str:
    """A sweep's grid entry of ``policy``."""
    return f"rest:datastore={datastore}" if policy == "rest" else policy


def options(policy: str, datastore) -> list[str]:
    """``simulate``'s and ``serve``'s options naming ``policy``."""
    return ["--policy", policy, *(["--param", f"datastore={datastore}"] if policy == "rest" else [])]


def test_every_policy_is_exercised_here():
    # a policy added to the registry joins every case below; the split must cover it
    assert sorted(PARALLEL + LOOKUP + SERIAL) == sorted(REGISTRY) and PARALLEL and LOOKUP and SERIAL


@pytest.mark.parametrize("policy", list(REGISTRY))
def test_simulate_runs_every_policy(policy, capsys, datastore):
    code, out, err = run_cli(capsys, "simulate", "--trace", TRACE, *options(policy, datastore), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["policy"] == policy and result["tokens"] > 0 and result["target_calls"] > 0


@pytest.mark.parametrize("rates", [None, "1,4"], ids=["one-rate", "rates"])
@pytest.mark.parametrize("policy", list(REGISTRY))
def test_serve_runs_every_serial_policy_and_refuses_the_others_in_one_line(policy, rates, capsys, datastore):
    args = ["serve", "--trace", TRACE, *options(policy, datastore), "--requests", "3", "--json"]
    code, out, err = run_cli(capsys, *args, *(["--rate", rates] if rates else []))
    if policy in REFUSED:
        assert code == 2 and err.count("\n") == 1 and REFUSED[policy] in err, err
        assert out == ""  # refused before any work
        return
    assert code == 0, err
    result = json.loads(out)
    # several rates: one row per rate and served policy (the baseline's too); one rate: one object
    rows = [r for r in result if r["label"] == policy] if rates else [result]
    assert len(rows) == (2 if rates else 1) and all(r["requests"] == 3 and r["tokens"] > 0 for r in rows), result


def test_sweep_runs_every_policy_in_one_grid(capsys, tmp_path, datastore):
    policies = [arg for name in REGISTRY for arg in ("--policy", spec(name, datastore))]
    code, out, err = run_cli(capsys, "sweep", "--trace", TRACE, *policies, "--workers", "1", "--no-cache",
                             "--out", tmp_path / "sweep.csv")
    assert code == 0, err
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert sorted(table["policy"]) == sorted(REGISTRY)
    assert (table["tokens"] > 0).all()


def test_sweep_over_rates_serves_every_serial_policy(capsys, tmp_path):
    policies = [arg for name in SERIAL for arg in ("--policy", name)]
    code, out, err = run_cli(capsys, "sweep", "--trace", TRACE, *policies, "--rate", "2", "--requests", "3",
                             "--workers", "1", "--no-cache", "--out", tmp_path / "rates.csv")
    assert code == 0, err
    served = set(pd.read_csv(tmp_path / "rates.csv")["policy"])
    assert set(SERIAL) <= served


@pytest.mark.parametrize("policy", PARALLEL + LOOKUP)
def test_sweep_over_rates_refuses_what_serve_does_not_batch_before_any_work(policy, capsys, tmp_path, datastore):
    code, out, err = run_cli(capsys, "sweep", "--trace", TRACE, "--policy", "sd", "--policy", spec(policy, datastore),
                             "--rate", "2",
                             "--requests", "3", "--workers", "1", "--no-cache", "--out", tmp_path / "rates.csv")
    assert code == 2 and err.count("\n") == 1 and f"({policy})" in err, err
    assert not (tmp_path / "rates.csv").exists()

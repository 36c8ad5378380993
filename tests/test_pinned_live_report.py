"""What `simlab live` prints about its errors, pinned by hand (issue 44, item 5): the sign of
every error column, which prompts the printout explains as outliers, and which forward it blames.

Conventions (docs/commands.md, the printout's caption): ``err`` = predicted / measured - 1, so
a prediction that was too optimistic (the live run slower than simulated) is positive; AD drift
= measured baseline / its price - 1, positive when the machine ran slower than its probe; a
forward's gap = measured / priced - 1, positive when it ran slower. The measured figures below
are the simulator's own per-prompt figures scaled by hand-chosen factors, so every expected
error follows from a factor by arithmetic.
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from simlab.common.metrics import PositionStats
from simlab.live.prediction import Prediction
from simlab.live.report import EXPLAIN, LiveReport
from simlab.sim.devices import Topology
from tests.helpers import hand_trace, latency_table
from tests.test_live_prediction import fake_setup, outcome

# three prompts of 7 positions (6 decoded tokens each, as outcome() counts them)
TRACE = ["1101111", "1111011", "1111111"]
# measured wall time / predicted wall time per prompt, the baselines measured at their price:
# speedup = AD / wall, so err = (AD / pw) / (AD / (f pw)) - 1 = f - 1: +25%, +5%, -20%
FACTORS = (1.25, 1.05, 0.80)


def live_run(forwards=None):
    """A report of sd γ=2 on TRACE (draft steps 0.1 s, 1 s forwards of any size, two devices)
    with each prompt's wall time its prediction's times FACTORS, and the live forwards of
    prompt 0 as given."""
    trace = hand_trace(TRACE, latency=latency_table(draft=0.1))
    trace.path = Path("hand")  # the report names the comparison trace
    setup = fake_setup(Topology.TWO_DEVICES)
    setup.cfg.temperature = 0.0
    prediction = Prediction(setup, trace, None)
    priced = prediction.simulated().per_prompt.set_index("prompt_id")
    outcomes = []
    for pid, f in enumerate(FACTORS):
        o = outcome(f"hand/{pid}", seconds=f * priced.loc[pid, "wall_time_s"],
                    ad_seconds=priced.loc[pid, "ad_wall_time_s"], forwards=(forwards or []) if pid == 0 else ())
        o.policy.positions = PositionStats()
        outcomes.append(o)
    setup.cfg.__dict__.update(target="target", probe=None, repeats=1)
    session = SimpleNamespace(cfg=setup.cfg, setup=SimpleNamespace(draft_name=lambda: "draft", hardware="cpu"),
                              topology=Topology.TWO_DEVICES, prediction=prediction, trace=trace)
    report = LiveReport(session, say=lambda _: None)
    report.outcomes = outcomes
    report.comparison = prediction.compare(outcomes)
    return report, priced


def test_every_error_column_is_positive_when_the_live_run_was_slower_than_predicted():
    report, priced = live_run()
    table = report.table()
    # speedup and tokens/s alike: err = f - 1 (6 tokens both sides, the same baselines)
    assert list(table["error_speedup"]) == pytest.approx([0.25, 0.05, -0.20])
    assert list(table["error_tokens_per_s"]) == pytest.approx([0.25, 0.05, -0.20])
    assert list(table["ad_drift"]) == pytest.approx([0.0, 0.0, 0.0])  # baselines at their price
    summary = report.summary()
    # overall: predicted ΣAD/Σpw against measured ΣAD/Σ(f pw), the same ΣAD: Σ(f pw)/Σpw - 1
    pw = [priced.loc[pid, "wall_time_s"] for pid in range(3)]
    overall = sum(f * w for f, w in zip(FACTORS, pw)) / sum(pw) - 1
    assert summary["error_speedup"] == pytest.approx(overall)
    assert summary["predicted_speedup"] > summary["measured_speedup"]  # overall > 0: too optimistic
    # the median of |+25%|, |+5%|, |-20%| is 20%, not the median signed error (+5%)
    assert summary["median_abs_error_speedup"] == pytest.approx(0.20)
    assert summary["median_abs_error_tokens_per_s"] == pytest.approx(0.20)


def test_the_printout_explains_each_prompt_whose_error_exceeds_ten_percent_either_way():
    # prompt 0's forwards (its prediction: 4 draft steps, 0.4 s, and 3 verifications, 3 s, as in
    # tests/test_live_prediction.py): drafts 0.2 s slow (+50%), verifications 0.5 s fast (-17%):
    # the one named is the furthest in seconds, the verification, with its gap's sign
    forwards = [SimpleNamespace(what=what, start=start, end=end) for what, start, end in
                [("prefill", 0.0, 5.0), ("draft", 5.0, 5.3), ("draft", 5.3, 5.6), ("verify", 5.6, 6.4),
                 ("verify", 6.4, 7.3), ("verify", 7.3, 8.1)]]
    report, _ = live_run(forwards)
    console = Console(record=True, width=400)
    report.print(console)
    text = console.export_text()
    explained = [line for line in text.splitlines() if line.startswith("  prompt ")]
    assert EXPLAIN == 0.10
    # +25% and -20% are past 10% (absolute), +5% is not
    assert [line.split(" (")[0] for line in explained] == ["  prompt 0", "  prompt 2"]
    assert explained[0] == ("  prompt 0 (speedup error +25.0%): furthest from its price: "
                            "verify 2.50 s vs 3.00 s priced (-17%)")
    assert explained[1].startswith("  prompt 2 (speedup error -20.0%): ")
    # the table's err column carries the same signs
    assert "+25.0%" in text and "-20.0%" in text and "+5.0%" in text

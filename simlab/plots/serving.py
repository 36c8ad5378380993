"""Serving against load: goodput and latency against the request rate, one line per served
policy, from the tables ``simlab serve --rate R1,R2,... --out`` writes (several tables, e.g. one
per policy, are drawn together).

Left: goodput (SLO-meeting requests per second); right: a latency (TPOT, TTFT or end-to-end),
p50 solid and p90 dashed, in the same colour per policy. Where several tables hold the same
series (the ``ad`` baseline of each), it is drawn once; the same series with other figures at a
rate (another max batch, other SLOs) is an error rather than a zig-zag.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from simlab.common.errors import SimlabError
from simlab.plots.table import require, setup_name

LATENCIES = {"tpot": ("TPOT", 1e3, "ms"), "ttft": ("TTFT", 1e3, "ms"), "e2e": ("end-to-end latency", 1.0, "s")}
WHAT = "a rate sweep from `simlab serve --rate R1,R2,... --out`"


def rates_figure(tables: list[pd.DataFrame], latency: str = "tpot", title: str | None = None) -> Figure:
    if latency not in LATENCIES:
        raise SimlabError(f"--latency must be one of {', '.join(LATENCIES)}, got {latency!r}")
    name, scale, unit = LATENCIES[latency]
    p50, p90 = f"{latency}_p50_s", f"{latency}_p90_s"
    for t in tables:
        require(t, ("label",), WHAT, {"rate_per_s": "> 0", "goodput_requests_per_s": ">= 0", p50: ">= 0", p90: ">= 0"})
    rows = pd.concat(tables, ignore_index=True).drop_duplicates(["label", "rate_per_s", "goodput_requests_per_s", p50, p90])
    clash = rows[rows.duplicated(["label", "rate_per_s"], keep=False)]
    if not clash.empty:
        raise SimlabError(f"{clash['label'].iat[0]} has different figures at rate {clash['rate_per_s'].iat[0]} in the "
                          "tables (served with other settings); plot them separately")
    fig = Figure(figsize=(11, 4.5))
    good, lat = fig.subplots(1, 2)
    for i, label in enumerate(rows["label"].unique()):
        s = rows[rows["label"] == label].sort_values("rate_per_s")
        color = f"C{i % 10}"
        good.plot(s["rate_per_s"], s["goodput_requests_per_s"], marker="o", color=color, label=label)
        lat.plot(s["rate_per_s"], s[p50] * scale, marker="o", color=color, label=f"{label} p50")
        lat.plot(s["rate_per_s"], s[p90] * scale, marker="^", linestyle="--", color=color, label=f"{label} p90")
    good.set_ylabel("goodput (requests/s meeting the SLOs)")
    lat.set_ylabel(f"{name} ({unit}); solid p50, dashed p90")
    for ax in (good, lat):
        ax.set_xscale("log")  # rates are swept over decades, from an idle server to an overloaded one
        ax.set_xlabel("arrival rate (requests/s, log scale)")
        ax.grid(True, alpha=0.3)
    good.legend(fontsize=7)
    lat.legend(fontsize=7)
    fig.suptitle(title or f"Serving against load: {setup_name(rows)}")
    fig.tight_layout()
    return fig

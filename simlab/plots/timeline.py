"""A per-device Gantt chart of a decode: one row per device, one bar per forward.

Input is the Chrome trace JSON that ``simlab simulate --timeline`` writes (and that live
decoding writes in the same format), read with :func:`simlab.sim.timeline.read_chrome_trace`.
Bars are coloured by what the forward did — the slice name without its ``xN`` token count:
``draft``, ``verify``, ``draft (parallel)``, ``verify (parallel)``, ``shadow`` (DEL's exit heads
on the target after a forward) — each in its colour of
:data:`KIND_COLORS` in every timeline, so serial draft-then-verify stretches and parallel overlap
are visible at a glance and a simulated and a live timeline compare colour for colour.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from simlab.common.errors import SimlabError
from simlab.sim.devices import Slice
from simlab.sim.timeline import DEVICES, kind_of

ROW_HEIGHT = 0.6
# One colour per kind of forward, the same in every timeline (simulated or live), so that two
# figures side by side read alike: draft work in greens, verification in blues, parallel darker.
KIND_COLORS = {
    "draft": "#74c476",
    "draft (parallel)": "#238b45",
    "verify": "#6baed6",
    "verify (parallel)": "#2171b5",
    "prefill": "#969696",
    "shadow": "#9e9ac8",
}
OTHER_COLOR = "#fd8d3c"  # a kind not listed above (none today)


def timeline_figure(slices: list[Slice], title: str = "timeline", start: float | None = None,
                    end: float | None = None) -> Figure:
    """Bars of the slices that overlap [start, end] seconds (default: all)."""
    lo = start if start is not None else float("-inf")
    hi = end if end is not None else float("inf")
    shown = [s for s in slices if s.end > lo and s.start < hi]
    if not shown:
        raise SimlabError("the timeline has no slices" + (f" between {start} s and {end} s" if slices else ""))
    devices = sorted({s.device for s in shown}, key=lambda d: (DEVICES.index(d) if d in DEVICES else len(DEVICES), d))
    kinds = sorted({kind_of(s.name) for s in shown}, key=lambda k: (list(KIND_COLORS).index(k)
                                                                     if k in KIND_COLORS else len(KIND_COLORS), k))
    fig = Figure(figsize=(11, 1.2 + 0.9 * len(devices)))
    ax = fig.add_subplot()
    for kind in kinds:
        for row, device in enumerate(devices):
            bars = [(1e3 * s.start, 1e3 * (s.end - s.start)) for s in shown
                    if s.device == device and kind_of(s.name) == kind]
            if bars:
                ax.broken_barh(bars, (row - ROW_HEIGHT / 2, ROW_HEIGHT), facecolor=KIND_COLORS.get(kind, OTHER_COLOR), edgecolor="white",
                               linewidth=0.5, label=kind)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(range(len(devices)), devices)
    ax.set_ylim(len(devices) - 0.5, -0.5)  # first device on top
    if start is not None or end is not None:
        ax.set_xlim(1e3 * max(lo, min(s.start for s in shown)), 1e3 * min(hi, max(s.end for s in shown)))
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("device")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return fig

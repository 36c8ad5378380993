"""Point labels that do not overlap, by a simple rule rather than an iterative solver.

Each label tries a few offsets around its point, nearest first, and takes the first whose text
box misses every label placed before it and every labelled point's marker; when none does, it
takes the offset that overlaps least. Boxes are measured with the figure's own renderer, so the
rule holds for the layout the figure is saved in (place labels after ``tight_layout``).
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.transforms import Bbox

# (dx, dy) in points, with the alignment that keeps the text on that side of its point.
OFFSETS = ((6, -2, "left", "top"), (6, 2, "left", "bottom"), (-6, -2, "right", "top"), (-6, 2, "right", "bottom"),
           (0, 7, "center", "bottom"), (0, -7, "center", "top"), (6, -12, "left", "top"), (6, 12, "left", "bottom"),
           (-6, -12, "right", "top"), (-6, 12, "right", "bottom"), (0, 17, "center", "bottom"),
           (0, -17, "center", "top"))
MARKER_PX = 4  # half the side of the box kept free around each labelled point


def _overlap(box: Bbox, others: list[Bbox]) -> float:
    total = 0.0
    for other in others:
        w = min(box.x1, other.x1) - max(box.x0, other.x0)
        h = min(box.y1, other.y1) - max(box.y0, other.y0)
        if w > 0 and h > 0:
            total += w * h
    return total


def place_labels(ax: Axes, points: list[tuple[float, float, str]], fontsize: float = 7) -> list:
    """Annotate each (x, y, text) of ``points`` on ``ax``; returns the annotations."""
    fig = ax.figure
    canvas = fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    to_px = ax.transData.transform
    taken = []
    for x, y, _ in points:
        px, py = to_px((x, y))
        taken.append(Bbox.from_extents(px - MARKER_PX, py - MARKER_PX, px + MARKER_PX, py + MARKER_PX))
    placed = []
    for x, y, text in points:
        best = None
        for dx, dy, ha, va in OFFSETS:
            note = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                               fontsize=fontsize)
            box = note.get_window_extent(renderer)
            cost = _overlap(box, taken)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, note, box)
            else:
                note.remove()
            if cost == 0:
                break
        taken.append(best[2])
        placed.append(best[1])
    return placed

"""What every figure module shares: an Agg Figure, an atomic PNG write, and label placement.

:func:`place_labels` is a greedy repel: each label takes the first candidate offset around its
point (rings of 16 directions, growing radius, a leader line from the second ring on) whose text
overlaps no placed label, no marker and no obstacle (:func:`obstacles`: error bars, markers, the
Pareto line) and stays inside the axes; when one does not fit it returns None and the caller
numbers the points instead (:func:`varbench.analysis.plots.speed_quality_figure`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np


def new_figure(w: float = 6.0, h: float = 4.0, dpi: int = 120):
    """A ``matplotlib.figure.Figure`` on its own Agg canvas (no display, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, out_path: str | Path) -> Path:
    """Write ``fig`` as a PNG; a crash mid-write never leaves a half file under the final name."""
    import io

    from varbench.core.jsonio import atomic_write_bytes

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(out_path, buf.getvalue())
    return out_path




# ---------------------------------------------------------------------------------------------
# label placement

def _overlap(a, b, pad: float = 1.0) -> bool:
    return not (a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0)


def place_labels(ax, xy: Sequence[tuple[float, float]], texts: Sequence[str], obstacles=(),
                 fontsize: float = 7.0, colors: Sequence | None = None) -> list | None:
    """Annotate each data point ``xy[i]`` with ``texts[i]`` at the first candidate offset (rings of
    16 directions, growing radius; a leader line from the second ring on) whose text box overlaps
    no placed label, no point marker, no ``obstacles`` (display-space Bboxes) and stays inside
    the axes, and whose leader line crosses no placed label and no other marker. Returns the
    annotations, or None (nothing drawn) when some label does not fit."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    pts = ax.transData.transform(np.asarray(xy, dtype=float)) if len(xy) else np.zeros((0, 2))
    axbox = ax.get_window_extent(renderer)
    markers = [Bbox.from_bounds(px - 5, py - 5, 10, 10) for px, py in pts]
    taken = markers + list(obstacles)   # what a label's text may not cover
    boxes: list = []                    # placed label texts: what a leader line may not cross either
    # 16 directions (diagonals first: the text then sits clear of the marker), growing radius
    angles = [45, -45, 135, -135, 0, 180, 90, -90, 22.5, -22.5, 157.5, -157.5, 67.5, -67.5, 112.5, -112.5]
    dirs = [(round(math.cos(math.radians(a)), 3), round(math.sin(math.radians(a)), 3)) for a in angles]
    placed = []
    for i, (text, (px, py)) in enumerate(zip(texts, pts)):
        done = False
        for ring, r in enumerate((7, 16, 28, 42, 58, 76, 96, 120)):
            for dx, dy in dirs:
                ha = "left" if dx > 0.3 else ("right" if dx < -0.3 else "center")
                va = "bottom" if dy > 0.3 else ("top" if dy < -0.3 else "center")
                off = (dx * r, dy * r)
                ann = ax.annotate(text, xy[i], xytext=off, textcoords="offset pixels", fontsize=fontsize,
                                  ha=ha, va=va, color=(colors[i] if colors is not None else "black"),
                                  arrowprops=(dict(arrowstyle="-", lw=0.5, color="0.5", shrinkA=0, shrinkB=3)
                                              if ring >= 1 else None))
                ann.update_positions(renderer)
                box = Text.get_window_extent(ann, renderer)   # the text only, not its leader line
                inside = (box.x0 >= axbox.x0 + 2 and box.x1 <= axbox.x1 - 2
                          and box.y0 >= axbox.y0 + 2 and box.y1 <= axbox.y1 - 2)
                # the leader line, as points every few pixels from the marker's edge to the text
                lead = []
                if ring >= 1:
                    n = max(2, int(r / 4))
                    lead = [(px + dx * r * t, py + dy * r * t) for t in np.linspace(7.0 / r, 1.0, n)]
                if (inside and not any(_overlap(box, t) for t in taken)
                        and not any(t.contains(qx, qy) for t in boxes + markers[:i] + markers[i + 1:]
                                    for qx, qy in lead)):
                    boxes.append(box)
                    taken.append(box)
                    taken += [Bbox.from_bounds(qx - 1, qy - 1, 2, 2) for qx, qy in lead]
                    placed.append(ann)
                    done = True
                    break
                ann.remove()
            if done:
                break
        if not done:
            for a in placed:
                a.remove()
            return None
    return placed




def obstacles(ax) -> list:
    """Display-space boxes labels must not cover: markers, error-bar caps and error bars (not the
    frontier or the full-height/width reference lines)."""
    from matplotlib.transforms import Bbox

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    axw = ax.get_window_extent(renderer)
    for line in ax.get_lines():
        if line.get_gid() == "pareto":   # the frontier: small boxes every few pixels along it
            d = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float))
            for a, b in zip(d[:-1], d[1:]):
                n = max(2, int(np.hypot(*(b - a)) / 4))
                out += [Bbox.from_bounds(qx - 1.5, qy - 1.5, 3, 3) for qx, qy in np.linspace(a, b, n)]
            continue
        bb = line.get_window_extent(renderer)
        if np.isfinite([bb.x0, bb.x1, bb.y0, bb.y1]).all() and bb.width < 0.9 * axw.width and bb.height < 0.9 * axw.height:
            out.append(Bbox.from_extents(bb.x0 - 1, bb.y0 - 1, bb.x1 + 1, bb.y1 + 1))
    for coll in ax.collections:   # error bars: one box per segment
        for seg in getattr(coll, "get_segments", lambda: [])():
            d = ax.transData.transform(np.asarray(seg, dtype=float))
            if np.isfinite(d).all():
                out.append(Bbox.from_extents(d[:, 0].min() - 1.5, d[:, 1].min() - 1.5,
                                             d[:, 0].max() + 1.5, d[:, 1].max() + 1.5))
    return out


def label_points(fig, ax, pts, names, colours, blockers=lambda: [], max_labels: int = 14, wrap: int = 26,
                 widen=None, key_xy: tuple[float, float] = (0.80, 0.90)) -> str:
    """Name each point in ``pts`` (data coordinates) by :func:`place_labels` (long names wrapped at
    ``wrap`` characters; ``blockers()``: display-space boxes to keep clear, called after every
    layout change); when the names do not fit (or there are more than ``max_labels``), number the
    points instead and list ``number  name`` in a key at figure coordinates ``key_xy`` (top left),
    after ``widen()`` (a callback that makes room for the key). Artists get gids ``"label"`` or
    ``"label-number"`` and ``"label-key"``. Returns ``"names"`` or ``"numbers"``."""
    import textwrap

    wrapped = [textwrap.fill(n, wrap, break_long_words=False) for n in names]
    placed = None
    if len(pts) <= max_labels:   # names at the usual size, then a size smaller, before numbers
        for size in (7.0, 6.0):
            placed = place_labels(ax, pts, wrapped, blockers(), fontsize=size, colors=colours)
            if placed is not None:
                break
    if placed is not None:
        for a in placed:
            a.set_gid("label")
        return "names"
    if widen is not None:
        widen()
    nums = [str(k + 1) for k in range(len(pts))]
    placed = place_labels(ax, pts, nums, blockers(), fontsize=7, colors=colours)
    if placed is None:  # even numbers do not fit: put them on the points, small
        placed = [ax.annotate(n, p, xytext=(4, 4), textcoords="offset pixels", fontsize=6) for n, p in zip(nums, pts)]
    for a in placed:
        a.set_gid("label-number")
    key = "\n".join(textwrap.fill(f"{n}  {name}", 40, subsequent_indent="     ") for n, name in zip(nums, names))
    fig.text(key_xy[0], key_xy[1], key, va="top", ha="left", fontsize=6.5, gid="label-key")
    return "numbers"

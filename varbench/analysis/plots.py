"""Figures for aggregated results (matplotlib, Agg canvas, PNG files).

Usage::

    from varbench.analysis.plots import write_figures, speed_quality_figure, pareto_front, keep_ratio_heatmap
    write_figures(paired, "results/toy_table")        # everything below, for a paired frame
    speed_quality_scatter(paired, "results/nova_sweep")                 # one PNG per metric (and group)
    keep_ratio_heatmap(entry.read_traces(), "keep_fastvar.png", title="fastvar")
    entropy_curves({"baseline": base_traces, "nova": nova_traces}, "entropy_vs_scale.png")
    wandb_figures(paired, out)     # {"figures/<name>": Path}: the PNGs keyed for W&B logging

Speed vs quality (``speed_vs_<metric>[__<group>].png``, one per metric and model/resolution/
benchmark/device group): x is the speed-up over the baseline (``paired_speedup``, the in-job
interleaved ratio, when the frame has it, else ``speedup``), with the 95% interval from
``<speed>_ci_low``/``<speed>_ci_high`` as horizontal error bars when present; a row with
``speedup_reliable == False`` is drawn hollow. y is the metric with ``<metric>_err`` (standard
error) as vertical bars. The baseline is a black star at 1.0x (for metrics that compare with the
baseline's own image, e.g. PSNR, only the 1.0x line: its self-comparison is no data point).
Colours are the method family's, markers the preset's (:mod:`varbench.analysis.colours`: the
same in every figure); point names are the table's (:func:`varbench.analysis.names.display_names`).
The dashed line joins the Pareto frontier (:func:`pareto_front`: no other point is at least as
fast and at least as good, better in one) over the reliable points only: a hollow point is
never on it (the legend says so). Rows whose images are bit-identical to the baseline's
(``identical_images``: their PSNR is the evaluator's 100 dB cap, or infinite) are drawn in a
grey band above the measured values with the tick ``∞``, so the cap never stretches the axis.
Labels are placed by a greedy repel (:func:`varbench.analysis.canvas.place_labels`: candidate
offsets around the point, first one that overlaps no label, marker, error bar or axes edge);
when one does not fit, every point is numbered and the names move to a key beside the axes.
The cost figures (``speedup_vs_flops.png``, ``latency_vs_batch.png``) are
:mod:`varbench.analysis.cost_figures`.

Trace rows follow :class:`varbench.harness.schema.TraceRow` (``scales[*].keep_frac`` per layer, ``ran``,
``entropy_mean``). Conventions for :func:`keep_matrix` (scales x layers, mean over images):
a scale that ran with ``keep_frac: null`` kept everything (1.0 on every layer); a scale that
did not run (``ran: false``) kept nothing (0.0). The heatmap uses :func:`keep_summary` instead,
which averages over the images where the scale ran and reports how often it was skipped: a
scale skipped in every image is drawn grey and hatched ("skipped"), never as a colour of the
scale. Rows are labelled by scale index and token grid (``3: 8×8``), columns by layer
(``stats.layer_labels`` when the traces carry them). Figures are drawn on
``matplotlib.figure.Figure`` with the Agg canvas (:mod:`varbench.analysis.canvas`), so no display
or global backend switch is needed.
"""
from __future__ import annotations

import math
import textwrap
import warnings
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from varbench.analysis.canvas import label_points, new_figure, obstacles, save_figure
from varbench.analysis.colours import family_colour, family_name, preset_markers, row_style
from varbench.analysis.cost_figures import write_cost_figures
from varbench.analysis.frame import METRIC_WORDS, frame_directions, higher_is_better, plot_metrics, relative_metric
from varbench.analysis.groups import baseline_mask, groups, is_missing, slug, speed_column, speed_values, speed_words
from varbench.analysis.names import display_names


# ---------------------------------------------------------------------------------------------
# metric vocabulary

def metric_words(metric: str, recorded: Mapping[str, bool] | None = None) -> str:
    """Axis title for a metric: words, unit, direction (:func:`varbench.analysis.frame.higher_is_better`,
    ``recorded``: the records' directions), and what the bars are."""
    words, unit = METRIC_WORDS.get(metric, (None, None))
    if words is None:
        ev, _, name = metric.partition("/")
        words, unit = f"{ev} {name.replace('_', ' ')}".strip(), ""
    arrow = "higher is better" if higher_is_better(metric, recorded) else "lower is better"
    return f"{words}\n({unit + '; ' if unit else ''}{arrow}; mean ± s.e.)"


# ---------------------------------------------------------------------------------------------
# Pareto frontier

def pareto_front(x: Sequence[float], y: Sequence[float], higher_is_better: bool = True) -> list[int]:
    """Indices of the non-dominated points, sorted by x: point i is dominated when another point
    is at least as fast (x) and at least as good (y, in the metric's direction) and strictly
    better in one. Points with a NaN coordinate are never on the front."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float) * (1.0 if higher_is_better else -1.0)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    front = []
    for i in ok:
        dominated = any((x[j] >= x[i] and y[j] >= y[i]) and (x[j] > x[i] or y[j] > y[i]) for j in ok if j != i)
        if not dominated:
            front.append(int(i))
    return sorted(front, key=lambda i: (x[i], y[i]))


# ---------------------------------------------------------------------------------------------
# speed vs quality


_WIDE = (0.125, 0.22, 0.85, 0.68)      # axes rect; the legend sits below it
_NARROW = (0.125, 0.22, 0.62, 0.68)    # when the names go to a numbered key on the right


def identical_rows(frame, metric: str) -> np.ndarray:
    """Rows whose ``metric`` is a bit-identical image's value rather than a measurement: PSNR of a
    row whose every image equals the baseline's (``identical_images``; the evaluator's mean caps
    each identical pair at 100 dB) and any infinite value. They are drawn in a band marked ∞ above
    the axis' data range, never at the cap."""
    vals = frame[metric].astype(float).to_numpy() if metric in frame.columns else np.full(len(frame), np.nan)
    out = np.isinf(vals)
    if metric.rsplit("/", 1)[-1] == "psnr" and "identical_images" in frame.columns:
        out |= np.array([(not is_missing(v)) and bool(v) is True and str(v).lower() not in ("false", "0")
                         for v in frame["identical_images"]])
    return out


def _nice_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick positions and labels inside [lo, hi] (the finite part of an axis with an ∞ band)."""
    from matplotlib.ticker import MaxNLocator

    ticks = [t for t in MaxNLocator(nbins=6).tick_values(lo, hi) if lo <= t <= hi]
    step = (ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    dec = max(0, -int(math.floor(math.log10(step)))) if step > 0 else 0
    return ticks, [f"{t:.{dec}f}" for t in ticks]


def speed_quality_figure(frame, metric: str, baseline: str = "baseline", speed_col: str | None = None,
                         title: str = "", max_labels: int = 14):
    """The speed-vs-quality Figure for one metric over ``frame``'s rows (one group). Artists carry
    gids: ``"baseline"`` (the star), ``"point:<name>"`` (each row's marker), ``"pareto"`` (the
    frontier line, its data = the frontier points), ``"identical-band"`` (the line under the ∞
    band), ``"label"`` (each name annotation) / ``"label-number"`` and ``"label-key"`` when the
    names are numbered into a key. ``fig.varbench_front`` lists the frontier rows' names,
    ``fig.varbench_identical`` the rows drawn in the ∞ band, ``fig.varbench_infinity_y`` its height."""
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    frame = frame.reset_index(drop=True)
    x, lo, hi, reliable, col = speed_values(frame, baseline, speed_col)
    y = frame[metric].astype(float).to_numpy()
    yerr = frame[f"{metric}_err"].astype(float).to_numpy() if f"{metric}_err" in frame.columns else np.full(len(frame), np.nan)
    base = baseline_mask(frame, baseline).to_numpy()
    relative = relative_metric(metric)
    up = higher_is_better(metric, frame_directions(frame))
    ident = identical_rows(frame, metric) & up        # the best a (higher-is-better) fidelity score can be
    keep = np.isfinite(x) & (np.isfinite(y) | ident) & ~(base & relative)
    real = keep & ~ident                               # rows with a measured value on the y axis
    labels = display_names(frame)
    if "method_effect" in frame.columns:   # a method that changed nothing is not a result (varbench.engine.effect)
        labels = [f"{lab} (no effect)" if eff == "none" else lab for lab, eff in zip(labels, frame["method_effect"])]
    methods = [str(v) for v in frame.get("method", frame.get("method_label", frame.index)).tolist()]
    markers = preset_markers(frame)
    has_ci = bool(np.isfinite(lo[keep]).any() or np.isfinite(hi[keep]).any())

    fig = new_figure(8.0, 5.4)
    ax = fig.add_axes(_WIDE)
    families = list(dict.fromkeys(m for m, k, b in zip(methods, keep, base) if k and not b))
    idx = np.flatnonzero(keep)

    # limits first (the ∞ band's height depends on them): measured values only, 1.0x in view
    xs = np.concatenate([x[keep], lo[keep][np.isfinite(lo[keep])], hi[keep][np.isfinite(hi[keep])], [1.0]])
    if xs.size:
        span = max(xs.max() - xs.min(), 0.1)
        ax.set_xlim(xs.min() - 0.18 * span, xs.max() + 0.30 * span)
    ylo = y[real] - np.nan_to_num(yerr[real])
    yhi = y[real] + np.nan_to_num(yerr[real])
    if ylo.size:
        span = max(float(yhi.max() - ylo.min()), 1e-3 * max(abs(float(yhi.max())), 1e-6), 1e-9)
        y0, y1 = float(ylo.min() - 0.22 * span), float(yhi.max() + 0.22 * span)
    else:
        y0, y1 = 0.0, 1.0
    y_inf = float("nan")
    if ident[keep].any():   # a band above the measured range, its own tick "∞"
        h = y1 - y0
        sep, y_inf, top = y1 + 0.04 * h, y1 + 0.16 * h, y1 + 0.30 * h
        ax.set_ylim(y0, top)
        ticks, texts = _nice_ticks(y0, y1) if ylo.size else ([], [])
        ax.set_yticks(ticks + [y_inf], labels=texts + ["∞"])
        ax.axhline(sep, color="0.55", lw=0.8, ls=(0, (5, 3)), zorder=1, gid="identical-band")
        ax.axhspan(sep, top, color="0.94", lw=0, zorder=0)
    else:
        ax.set_ylim(y0, y1)
    yy = np.where(ident, y_inf, y)     # where each point is drawn

    colours = {}
    for i in idx:
        if base[i]:
            colours[i] = "black"
            ax.errorbar([x[i]], [yy[i]], yerr=None if is_missing(yerr[i]) else [[yerr[i]], [yerr[i]]], fmt="none",
                        ecolor="black", elinewidth=0.9, capsize=3, zorder=4)
            ax.plot([x[i]], [yy[i]], marker="*", ms=15, color="black", mec="white", mew=0.6, ls="none",
                    zorder=5, gid="baseline")
            continue
        c, mk = row_style(frame.iloc[i], markers)
        colours[i] = c
        xe = None
        if np.isfinite(lo[i]) and np.isfinite(hi[i]):
            xe = [[max(x[i] - lo[i], 0.0)], [max(hi[i] - x[i], 0.0)]]
        ye = None if (ident[i] or is_missing(yerr[i])) else [[yerr[i]], [yerr[i]]]
        ax.errorbar([x[i]], [yy[i]], xerr=xe, yerr=ye, fmt="none", ecolor=c, elinewidth=0.9, capsize=2.5,
                    alpha=0.85, zorder=3)
        ax.plot([x[i]], [yy[i]], marker=mk, ms=7, ls="none", color=c, mec=c, mew=1.4,
                mfc=(c if reliable[i] else "white"), zorder=4, gid=f"point:{labels[i]}")
    ax.axvline(1.0, color="0.45", lw=0.8, ls=":", zorder=1)
    if base.any() and not relative:
        by = y[base & np.isfinite(y)]
        if by.size:
            ax.axhline(float(by[0]), color="0.45", lw=0.8, ls=":", zorder=1)
    # the frontier over reliable points only: a speed-up flagged unreliable cannot dominate anything
    on = keep & reliable
    front = pareto_front(np.where(on, x, np.nan), np.where(on, yy, np.nan), up)
    if len(front) >= 2:
        ax.plot(x[front], yy[front], ls="--", lw=1.3, color="0.25", marker="none", zorder=2, gid="pareto")
    fig.varbench_front = [labels[i] for i in front]
    fig.varbench_identical = [labels[i] for i in idx if ident[i]]
    fig.varbench_infinity_y = y_inf

    ax.set_xlabel(speed_words(col, has_ci))
    ax.set_ylabel(metric_words(metric, frame_directions(frame)), fontsize=8.5)
    ax.grid(alpha=0.25)
    ax.set_title(title or f"Speed vs {METRIC_WORDS.get(metric, (metric, ''))[0]}", fontsize=10)
    notes = []
    if ident[keep].any():   # say what the band is, on the side its points leave free
        ax_x = ax.transAxes.inverted().transform(ax.transData.transform(
            np.column_stack([x[keep & ident], np.full(int((keep & ident).sum()), y_inf)])))[:, 0]
        right = float(np.mean(ax_x)) < 0.5
        note = ax.text(0.99 if right else 0.01, y_inf, "identical to the baseline's images\n(PSNR ∞, not the 100 dB cap)",
                       transform=blended_transform_factory(ax.transAxes, ax.transData), ha="right" if right else "left",
                       va="center", fontsize=6.5, color="0.35", style="italic", gid="identical-note")
        notes.append(note)

    # legend below the axes
    handles = []
    if (base & keep).any():
        handles.append(Line2D([], [], marker="*", ms=12, color="black", ls="none", label="baseline (1.0×)"))
    elif base.any() and relative:
        handles.append(Line2D([], [], color="0.45", ls=":", label="baseline (1.0×; self-comparison not plotted)"))
    handles += [Line2D([], [], marker="o", ms=6, color=family_colour(m), ls="none", label=family_name(m))
                for m in families]
    if len(front) >= 2:
        handles.append(Line2D([], [], ls="--", color="0.25", label="Pareto frontier (reliable points only)"))
    if (~reliable & keep).any():
        handles.append(Line2D([], [], marker="o", ms=6, color="0.3", mfc="white", ls="none",
                              label="hollow: speed-up flagged unreliable, not on the frontier"))
    ncol = 4 if max((len(h.get_label()) for h in handles), default=0) <= 28 else 3
    rows = -(-len(handles) // ncol)
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.02, 0.005), ncol=ncol, fontsize=7.5,
               frameon=False, columnspacing=1.2, handletextpad=0.4)
    bottom = 0.13 + 0.034 * rows            # the legend's rows, then the x tick labels and title
    ax.set_position((_WIDE[0], bottom, _WIDE[2], _WIDE[1] + _WIDE[3] - bottom))

    # labels: repel (long names wrapped on two lines), else numbered points with a key on the right
    pts = [(x[i], yy[i]) for i in idx]

    def blocked():
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        return obstacles(ax) + [t.get_window_extent(r) for t in notes]

    right = 0.125 + 0.62 * 8.0 / 10.0

    def widen():   # room for the key on the right
        fig.set_size_inches(10.0, fig.get_size_inches()[1])
        ax.set_position((0.10, bottom, right - 0.10, _WIDE[1] + _WIDE[3] - bottom))

    label_points(fig, ax, pts, [labels[i] for i in idx], [colours[i] for i in idx], blocked, max_labels,
                 widen=widen, key_xy=(right + 0.02, _WIDE[1] + _WIDE[3]))
    return fig


def speed_quality_scatter(frame, out_dir: str | Path, metrics: Sequence[str] | None = None,
                          speed_col: str | None = None, baseline: str = "baseline") -> list[Path]:
    """One PNG per metric and group (``speed_vs_<metric>.png``; ``__<group>`` appended when the
    frame holds several model/resolution/benchmark/device groups); see the module docstring."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = list(metrics) if metrics is not None else plot_metrics(frame)
    parts = groups(frame)
    paths = []
    for key, g in parts:
        col = speed_col or speed_column(g, baseline)
        for m in metrics:
            if m not in g.columns:
                continue
            x = speed_values(g, baseline, col)[0]
            if not (np.isfinite(x) & g[m].astype(float).notna().to_numpy()).any():
                continue
            n = g["n_images"].dropna() if "n_images" in g.columns else []
            sub = " · ".join(str(k) for k in key if not is_missing(k) and str(k))
            if len(n):
                sub += f" · {int(n.iloc[0])} images"
            words = METRIC_WORDS.get(m, (m, ""))[0]
            fig = speed_quality_figure(g, m, baseline=baseline, speed_col=col,
                                       title=f"Speed vs {words}" + (f"\n{sub}" if sub else ""))
            name = f"speed_vs_{slug(m)}" + (f"__{slug('_'.join(str(k) for k in key))}" if len(parts) > 1 else "")
            paths.append(save_figure(fig, out_dir / f"{name}.png"))
    return paths


# ---------------------------------------------------------------------------------------------
# keep ratios and entropy

def keep_matrix(traces: Iterable[Mapping]) -> np.ndarray:
    """Mean keep fraction, shape (n_scales, n_layers), over all trace rows (see conventions)."""
    traces = list(traces)
    n_scales, n_layers = 0, 0
    for t in traces:
        for s in t.get("scales", []):
            n_scales = max(n_scales, int(s["si"]) + 1)
            if s.get("keep_frac"):
                n_layers = max(n_layers, len(s["keep_frac"]))
    n_layers = max(n_layers, 1)
    total = np.zeros((n_scales, n_layers))
    count = np.zeros((n_scales, 1))
    for t in traces:
        for s in t.get("scales", []):
            si = int(s["si"])
            if not s.get("ran", True):
                row = np.zeros(n_layers)
            elif s.get("keep_frac") is None:
                row = np.ones(n_layers)
            else:
                kf = np.asarray(s["keep_frac"], dtype=float)
                row = np.ones(n_layers)
                row[: len(kf)] = kf
            total[si] += row
            count[si] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def keep_summary(traces: Iterable[Mapping]) -> dict:
    """What the heatmap draws: ``keep`` (n_scales, n_layers): mean keep fraction over the images
    where the scale ran (NaN where it never ran); ``skipped`` (n_scales,): fraction of images in
    which the scale did not run; ``sizes``: ``(h, w)`` per scale (None if unknown);
    ``layer_labels``; ``pruned``: True if any layer kept less than everything."""
    traces = list(traces)
    n_scales, n_layers = 0, 0
    labels = None
    for t in traces:
        labels = labels or (t.get("stats") or {}).get("layer_labels")
        for s in t.get("scales", []):
            n_scales = max(n_scales, int(s["si"]) + 1)
            if s.get("keep_frac"):
                n_layers = max(n_layers, len(s["keep_frac"]))
    if labels and n_layers in (0, len(labels)):
        n_layers = len(labels)
    else:
        labels = None
    n_layers = max(n_layers, 1)
    total = np.zeros((n_scales, n_layers))
    ran = np.zeros(n_scales)
    seen = np.zeros(n_scales)
    sizes: list = [None] * n_scales
    for t in traces:
        for s in t.get("scales", []):
            si = int(s["si"])
            seen[si] += 1
            if sizes[si] is None and s.get("h") is not None and s.get("w") is not None:
                sizes[si] = (int(s["h"]), int(s["w"]))
            if not s.get("ran", True):
                continue
            ran[si] += 1
            row = np.ones(n_layers)
            if s.get("keep_frac") is not None:
                kf = np.asarray(s["keep_frac"], dtype=float)
                row[: len(kf)] = kf
            total[si] += row
    with np.errstate(invalid="ignore", divide="ignore"):
        keep = np.where(ran[:, None] > 0, total / np.maximum(ran, 1)[:, None], np.nan)
        skipped = np.where(seen > 0, 1.0 - ran / np.maximum(seen, 1), np.nan)
    return {"keep": keep, "skipped": skipped, "sizes": sizes, "layer_labels": labels,
            "pruned": bool(np.nanmin(keep, initial=1.0) < 1.0) if keep.size else False}


def scale_labels(summary: Mapping) -> list[str]:
    """Row labels ``"<si>: <h>×<w>"`` plus ``" (skipped in N%)"`` for partly skipped scales."""
    out = []
    for si, (size, sk) in enumerate(zip(summary["sizes"], summary["skipped"])):
        text = f"{si}: {size[0]}×{size[1]}" if size else f"{si}"
        if np.isfinite(sk) and 0.0 < sk < 1.0:
            text += f" (skipped in {100 * sk:.0f}%)"
        out.append(text)
    return out


def keep_ratio_heatmap(traces: Iterable[Mapping], out_path: str | Path, title: str = "",
                       layer_labels: Sequence[str] | None = None) -> Path:
    """Heatmap of :func:`keep_summary` (rows: scale ``si: h×w``, columns: layer); scales skipped
    in every image are grey and hatched, with a legend entry; a method that never prunes a layer
    shows one column "all layers"."""
    fig = keep_ratio_figure(traces, title=title, layer_labels=layer_labels)
    return save_figure(fig, out_path)


def keep_ratio_figure(traces: Iterable[Mapping], title: str = "", layer_labels: Sequence[str] | None = None):
    """The Figure behind :func:`keep_ratio_heatmap`; ``fig.varbench_skipped`` lists the scale
    indices drawn as skipped, ``fig.varbench_keep`` the matrix drawn."""
    from matplotlib.patches import Patch, Rectangle

    summ = keep_summary(traces)
    keep, skipped = summ["keep"], summ["skipped"]
    labels = list(layer_labels) if layer_labels is not None and len(layer_labels) == keep.shape[1] else summ["layer_labels"]
    n_s, n_l = keep.shape
    all_full = n_l == 1 and labels is None
    fig = new_figure(max(4.8, 0.2 * n_l + 3.6), max(3.2, 0.32 * n_s + 1.9))
    ax = fig.add_subplot(1, 1, 1)
    cmap = __import__("matplotlib").colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))
    im = ax.imshow(np.ma.masked_invalid(keep), vmin=0.0, vmax=1.0, cmap=cmap, aspect="auto",
                   interpolation="nearest")
    if n_l <= 24 and n_s <= 24:   # the value in every cell that kept less than everything
        for si, li in zip(*np.nonzero(np.nan_to_num(keep, nan=1.0) < 0.995)):
            v = keep[si, li]
            ax.text(li, si, f"{v:.2f}", ha="center", va="center", fontsize=6.5,
                    color="white" if v < 0.6 else "black")
    full_skip = [si for si in range(n_s) if np.isfinite(skipped[si]) and skipped[si] >= 1.0]
    never = [si for si in range(n_s) if not np.isfinite(skipped[si])]
    for si in full_skip:
        ax.add_patch(Rectangle((-0.5, si - 0.5), n_l, 1.0, facecolor="0.82", edgecolor="0.45", hatch="///",
                               lw=0.0, gid="skipped"))
    partial = [si for si in range(n_s) if np.isfinite(skipped[si]) and 0.0 < skipped[si] < 1.0]
    for si in partial:   # ran in some images only: the mean over those, under a light hatch
        ax.add_patch(Rectangle((-0.5, si - 0.5), n_l, 1.0, facecolor="none", edgecolor="0.35", hatch="\\\\",
                               lw=0.0, alpha=0.7, gid="partly-skipped"))
    for si in never:
        ax.add_patch(Rectangle((-0.5, si - 0.5), n_l, 1.0, facecolor="white", edgecolor="0.6", hatch="..",
                               lw=0.0, gid="no-trace"))
    ax.set_yticks(range(n_s), labels=scale_labels(summ), fontsize=7)
    ax.set_ylabel("scale (index: token grid h×w)")
    if all_full:
        ax.set_xticks([0], labels=["all layers"])
        ax.set_xlabel("layer (no layer prunes tokens)")
    else:
        if labels is not None:
            long = max(len(str(v)) for v in labels) > 3
            ax.set_xticks(range(n_l), labels=[str(v) for v in labels], rotation=90 if long else 0,
                          fontsize=6 if long else 7)
        else:
            step = max(1, n_l // 16)
            ax.set_xticks(range(0, n_l, step))
        ax.set_xlabel("layer (transformer block)")
    ax.set_title(textwrap.fill(f"Fraction of tokens kept{(' · ' + title) if title else ''}", 46) + "\n"
                 "(per layer; mean over the images in which the scale ran)", fontsize=9)
    fig.colorbar(im, ax=ax, label="kept token fraction", fraction=0.06)
    handles = []
    if full_skip:
        handles.append(Patch(facecolor="0.82", edgecolor="0.45", hatch="///", label="scale skipped (not run)"))
    if partial:
        handles.append(Patch(facecolor="none", edgecolor="0.35", hatch="\\\\",
                             label="scale skipped in some images (share in its row label)"))
    if never:
        handles.append(Patch(facecolor="white", edgecolor="0.6", hatch="..", label="no trace for this scale"))
    if handles:
        fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.01, 0.0), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.01 + 0.05 * len(handles) if handles else 0, 1, 1))
    fig.varbench_skipped = full_skip
    fig.varbench_keep = keep
    return fig


def entropy_by_scale(traces: Iterable[Mapping]) -> np.ndarray:
    """Mean of ``entropy_mean`` per scale over trace rows (NaN where never reported)."""
    sums: dict[int, list[float]] = {}
    for t in traces:
        for s in t.get("scales", []):
            e = s.get("entropy_mean")
            if e is not None and not (isinstance(e, float) and math.isnan(e)):
                sums.setdefault(int(s["si"]), []).append(float(e))
    if not sums:
        return np.zeros(0)
    out = np.full(max(sums) + 1, np.nan)
    for si, vals in sums.items():
        out[si] = float(np.mean(vals))
    return out


def entropy_curves(series: Mapping[str, Iterable[Mapping]], out_path: str | Path, title: str = "",
                   styles: Mapping[str, tuple[str, str]] | None = None) -> Path:
    """Mean predictive entropy vs scale, one line per label (x ticks: ``si`` and ``h×w``).
    ``styles``: ``{label: (colour, marker)}`` (:func:`varbench.analysis.colours.row_style`: the
    family's colour, the preset's marker); labels without one get matplotlib's cycle. Lines of one
    family differ by marker and dash, so a curve equal to the baseline's (drawn first, black and
    wider) still shows."""
    fig = new_figure(9.0, 4.6)
    ax = fig.add_subplot(1, 1, 1)
    sizes: dict[int, tuple] = {}
    n = 0
    dashes = ["-", (0, (5, 2)), (0, (2, 1.5)), (0, (6, 2, 1.5, 2)), (0, (1, 1.2))]
    seen: dict[str, int] = {}
    for label, traces in series.items():
        traces = list(traces)
        for t in traces:
            for s in t.get("scales", []):
                if s.get("h") is not None:
                    sizes.setdefault(int(s["si"]), (s["h"], s["w"]))
        curve = entropy_by_scale(traces)
        if curve.size:
            n = max(n, curve.size)
            style = (styles or {}).get(label)
            kw: dict = {"marker": "o", "ms": 3, "lw": 1.1}
            if style is not None:
                colour, marker = style
                k = seen.get(colour, 0)
                seen[colour] = k + 1
                black = colour in ("black", "#000000")
                kw = {"color": colour, "marker": marker, "ms": 4, "lw": 2.4 if black else 1.2,
                      "ls": "-" if black else dashes[k % len(dashes)], "zorder": 2 if black else 3,
                      "alpha": 0.6 if black else 0.95}
            ax.plot(np.arange(curve.size), curve, label=str(label), gid=f"entropy:{label}", **kw)
    if n:
        ax.set_xticks(range(n), labels=[f"{i}\n{sizes[i][0]}×{sizes[i][1]}" if i in sizes else str(i)
                                        for i in range(n)], fontsize=7 if n <= 10 else 6)
    ax.set_xlabel("scale (index, token grid h×w)")
    ax.set_ylabel("mean predictive entropy (nats)")
    ax.set_title(f"Predictive entropy per scale{(' · ' + title) if title else ''}", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6.5, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, handlelength=3.0)
    fig.tight_layout()
    return save_figure(fig, out_path)


# ---------------------------------------------------------------------------------------------
# everything for a paired frame

def write_figures(paired, out: Path, baseline: str = "baseline", image_grids: bool = True,
                  grid_rows: int = 4, grid_diff: bool = True) -> list[Path]:
    """Speed/quality scatter per metric; speed-up vs FLOPs and latency vs batch size
    (:func:`varbench.analysis.cost_figures.write_cost_figures`); keep-ratio heatmaps and entropy curves from traces; the
    qualitative image grid per group (:func:`varbench.analysis.image_grid.write_image_grids`, skipped with a
    warning when the images cannot be read). Figures an earlier call wrote into ``out`` that this
    one did not (a group or method no longer in the records) are removed, so the folder shows only
    what the current table shows; files varbench did not write are never touched."""
    out = Path(out)
    written = _all_figures(paired, out, baseline, image_grids, grid_rows, grid_diff)
    _forget_stale_figures(out, written)
    return written


FIGURES_MANIFEST = ".figures.json"


def _forget_stale_figures(out: Path, written: list[Path]) -> None:
    """Delete the files the previous call listed in ``out/.figures.json`` that ``written`` lacks,
    then list ``written`` there."""
    import json

    from varbench.core.jsonio import atomic_write_bytes

    manifest = out / FIGURES_MANIFEST
    try:
        before = set(json.loads(manifest.read_text())) if manifest.is_file() else set()
    except (OSError, ValueError):
        before = set()
    now = {Path(p).name for p in written if p}
    for name in sorted(before - now):
        if "/" not in name and not name.startswith("."):   # only plain files of this folder
            (out / name).unlink(missing_ok=True)
    atomic_write_bytes(manifest, json.dumps(sorted(now), indent=1).encode())


def _all_figures(paired, out: Path, baseline: str, image_grids: bool, grid_rows: int, grid_diff: bool) -> list[Path]:
    from varbench.harness.records import RunEntry

    written = speed_quality_scatter(paired, out, baseline=baseline)
    written += write_cost_figures(paired, out, baseline=baseline)
    group = [k for k in ("model", "resolution", "benchmark") if k in paired.columns]
    for key, g in (paired.groupby(group, dropna=False) if group else [((), paired)]):
        key = key if isinstance(key, tuple) else (key,)
        g = g.reset_index(drop=True)
        names, markers = display_names(g), preset_markers(g)
        base = baseline_mask(g, baseline).to_numpy()
        series, styles = {}, {}
        for i, r in g.iterrows():
            if not isinstance(r.get("path"), str) or not r.get("path"):
                continue
            traces = RunEntry.from_dir(r["path"]).read_traces()
            if not traces:
                continue
            label = names[i] + (" (no effect)" if r.get("method_effect") == "none" else "")
            label = label if label not in series else f"{label} [{str(r['entry_id'])[:6]}]"
            series[label] = traces
            styles[label] = ("black", "o") if base[i] else row_style(r, markers)
            summ = keep_summary(traces)
            if summ["keep"].size and (summ["pruned"] or np.nanmax(summ["skipped"], initial=0.0) > 0):
                written.append(keep_ratio_heatmap(
                    traces, out / f"keep_{slug(names[i])}_{str(r['entry_id'])[:8]}.png", title=names[i]))
        if any(entropy_by_scale(t).size for t in series.values()):
            name = slug("_".join(str(k) for k in key)) if key else "all"
            # the baseline first: drawn under the others, first in the legend
            series = dict(sorted(series.items(), key=lambda kv: styles[kv[0]][0] != "black"))
            written.append(entropy_curves(series, out / f"entropy_vs_scale_{name}.png",
                                          title=" · ".join(str(k) for k in key), styles=styles))
    if image_grids:
        from varbench.analysis.image_grid import write_image_grids

        try:
            written += write_image_grids(paired, out, baseline=baseline, n_rows=grid_rows, diff=grid_diff)
        except Exception as e:  # noqa: BLE001 - a figure must not sink the table; say why it is missing
            warnings.warn(f"qualitative image grid not written: {type(e).__name__}: {e}", stacklevel=2)
    return written


def wandb_figures(paired, out: Path, baseline: str = "baseline", **kw) -> dict[str, Path]:
    """Write every figure (:func:`write_figures`) and return them keyed for W&B logging:
    ``{"figures/<file stem>": path}`` (e.g. ``figures/speed_vs_hpsv2_score``,
    ``figures/image_grid``); log each with ``wandb.Image(str(path))``."""
    return {f"figures/{p.stem}": p for p in write_figures(paired, out, baseline=baseline, **kw)}

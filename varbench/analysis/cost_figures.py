"""What a method's savings cost in time: speed-up against FLOPs, latency against batch size.

Usage::

    from varbench.analysis.cost_figures import write_cost_figures, speedup_vs_flops_figure, latency_vs_batch_figure
    write_cost_figures(paired, "results/nova_sweep/toy-64px")   # speedup_vs_flops.png, speedup_vs_memory.png, latency_vs_batch.png

``speedup_vs_flops.png``: x is the transformer's FLOPs reduction (``flops_x`` = baseline FLOPs /
method FLOPs, what the method removes), y the measured speed-up of the AR loop (the paired in-job
ratio when the frame has it, with its 95% interval as vertical bars; hollow: flagged unreliable).
Both axes share one range, so the dashed line y = x is "the speed-up the FLOPs predict" and a
point's distance below it (the dotted drop) is time the saved FLOPs did not buy back: small
kernels, gather/scatter, Python overhead, memory traffic. ``nova_toy``'s 2.21× fewer FLOPs at
0.95× speed sits far below the line; a point above it gains more than its FLOPs (e.g. a skipped
scale also skips its cache and sampling work).

``latency_vs_batch.png``: from each record's ``timing.by_batch`` (read from its entry folder, as
the keep heatmaps read traces): AR-loop milliseconds per image (the batch's median over timed
prompts divided by the batch size; bars: p10-p90 over the prompts) against the batch size, one
line per row, and, when the records carry paired ratios at several batch sizes, a second panel
with the paired speed-up per batch size. Written only when some record was timed at two or more
batch sizes (``timing.batch_sizes``); otherwise there is nothing to draw a line through.

``speedup_vs_memory.png``: x is the KV-cache reduction (``memory_x`` = baseline KV allocated / method
KV allocated, per image at the record's batch), y the paired speed-up with its interval, colour the
quality metric's Δ against the baseline (:func:`quality_delta_column`: the first table metric with a
Δ, e.g. toy GenEval overall; a diverging scale centred on 0, so red is worse and blue better for a
higher-is-better metric, reversed for a lower-is-better one), marker shape and edge the method
family's. The composition matrix's figure: memory methods move points right, compute methods up,
and the colour says what either cost. Written when some non-baseline row has both ratios.

Colours are the method family's (:mod:`varbench.analysis.colours`), markers the preset's, names
the table's (:func:`varbench.analysis.names.display_names`).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Mapping

import numpy as np

from varbench.analysis.canvas import label_points, new_figure, obstacles, save_figure
from varbench.analysis.colours import family_colour, family_name, preset_markers, row_style
from varbench.analysis.frame import frame_directions, higher_is_better
from varbench.analysis.groups import baseline_mask, groups, is_missing, slug, speed_values, speed_words
from varbench.analysis.names import display_names
from varbench.analysis.tables import metric_header, table_metrics
from varbench.policies.cards import method_marker

FLOPS_WORDS = "FLOPs reduction (×, transformer: baseline FLOPs / method FLOPs per image, analytic)"


def _no_effect(names, frame) -> list[str]:
    if "method_effect" not in frame.columns:
        return list(names)
    return [f"{n} (no effect)" if e == "none" else n for n, e in zip(names, frame["method_effect"])]


def _family_legend(ax_or_fig, families, extra=(), **kw):
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", ms=6, color=family_colour(m), ls="none", label=family_name(m))
               for m in families] + list(extra)
    return ax_or_fig.legend(handles=handles, **kw)


# ---------------------------------------------------------------------------------------------
# speed-up vs FLOPs

def speedup_vs_flops_figure(frame, baseline: str = "baseline", speed_col: str | None = None, title: str = "",
                            max_labels: int = 14):
    """The speed-up-vs-FLOPs Figure of one group (see the module docstring), or None when no
    non-baseline row has both a FLOPs ratio and a speed-up. Artists carry gids ``"baseline"``,
    ``"point:<name>"``, ``"gap:<name>"`` (the drop from the y = x line), ``"flops-predict"`` (the
    line) and the label gids of :func:`varbench.analysis.canvas.label_points`; ``fig.varbench_rows``
    is ``[(name, flops_x, speed-up)]`` of the points drawn."""
    from matplotlib.lines import Line2D

    frame = frame.reset_index(drop=True)
    if "flops_x" not in frame.columns:
        return None
    x, lo, hi, reliable, col = speed_values(frame, baseline, speed_col)
    fx = frame["flops_x"].astype(float).to_numpy()
    base = baseline_mask(frame, baseline).to_numpy()
    fx = np.where(base, 1.0, fx)
    keep = np.isfinite(fx) & np.isfinite(x) & (fx > 0) & (x > 0)
    if not (keep & ~base).any():
        return None
    names = _no_effect(display_names(frame), frame)
    markers = preset_markers(frame)
    idx = np.flatnonzero(keep)

    fig = new_figure(7.6, 7.0)
    rect = (0.12, 0.24, 0.80, 0.66)
    ax = fig.add_axes(rect)
    vals = np.concatenate([fx[keep], x[keep], lo[keep][np.isfinite(lo[keep])], hi[keep][np.isfinite(hi[keep])], [1.0]])
    span = max(float(vals.max() - vals.min()), 0.2)
    lim = (max(0.0, float(vals.min()) - 0.12 * span), float(vals.max()) + 0.18 * span)
    ax.set_xlim(*lim)
    ax.set_ylim(*lim)          # one range on both axes: y = x is the diagonal, a gap reads as a gap
    ax.set_aspect("equal", adjustable="box")
    ax.plot(lim, lim, ls="--", lw=1.2, color="0.35", zorder=1, gid="flops-predict")
    ax.axhline(1.0, color="0.6", lw=0.8, ls=":", zorder=1)
    ax.axvline(1.0, color="0.6", lw=0.8, ls=":", zorder=1)
    colours, rows = [], []
    for i in idx:
        if base[i]:
            ax.plot([1.0], [1.0], marker="*", ms=15, color="black", mec="white", mew=0.6, ls="none", zorder=5,
                    gid="baseline")
            colours.append("black")
            continue
        c, mk = row_style(frame.iloc[i], markers)
        colours.append(c)
        ax.plot([fx[i], fx[i]], [x[i], fx[i]], ls=(0, (1, 2)), lw=1.1, color=c, alpha=0.7, zorder=2,
                gid=f"gap:{names[i]}")
        ye = None
        if np.isfinite(lo[i]) and np.isfinite(hi[i]):
            ye = [[max(x[i] - lo[i], 0.0)], [max(hi[i] - x[i], 0.0)]]
        ax.errorbar([fx[i]], [x[i]], yerr=ye, fmt="none", ecolor=c, elinewidth=0.9, capsize=2.5, zorder=3)
        ax.plot([fx[i]], [x[i]], marker=mk, ms=7, ls="none", color=c, mec=c, mew=1.4,
                mfc=c if reliable[i] else "white", zorder=4, gid=f"point:{names[i]}")
        rows.append((names[i], float(fx[i]), float(x[i])))
    fig.varbench_rows = rows
    has_ci = bool(np.isfinite(lo[keep]).any())
    ax.set_xlabel(FLOPS_WORDS, fontsize=8.5)
    ax.set_ylabel(speed_words(col, has_ci).replace(" (×, ", "\n(×, "), fontsize=8.5)
    ax.grid(alpha=0.25)
    ax.set_title(title or "Measured speed-up vs FLOPs saved", fontsize=10)
    families = list(dict.fromkeys(str(m) for m, k, b in zip(frame["method"], keep, base) if k and not b))
    extra = []
    if base[keep].any():
        extra.append(Line2D([], [], marker="*", ms=12, color="black", ls="none", label="baseline (1×, 1×)"))
    extra.append(Line2D([], [], ls="--", color="0.35", label="speed-up the FLOPs predict (y = x)"))
    extra.append(Line2D([], [], ls=(0, (1, 2)), color="0.35", label="drop: time the saved FLOPs did not buy"))
    if (~reliable & keep).any():
        extra.append(Line2D([], [], marker="o", ms=6, color="0.3", mfc="white", ls="none",
                            label="hollow: speed-up flagged unreliable"))
    leg = _family_legend(fig, families, extra, loc="lower left", bbox_to_anchor=(0.02, 0.005), ncol=3, fontsize=7.5,
                         frameon=False, columnspacing=1.2, handletextpad=0.4)
    rows_n = -(-len(leg.legend_handles) // 3)
    bottom = 0.10 + 0.034 * rows_n
    ax.set_position((rect[0], bottom, rect[2], rect[1] + rect[3] - bottom))
    # the line's name beside its upper end, in the (usually empty) half above it, clear of markers
    note = ax.text(0, 0, "speed-up the FLOPs predict (y = x) ", ha="right", va="bottom", fontsize=7.5,
                   color="0.3", gid="flops-predict-note")
    clear = obstacles(ax)          # (draws the canvas: the axes are where they stay)
    for frac in (0.92, 0.78, 0.64, 0.5, 0.36, 0.92):
        t = lim[0] + frac * (lim[1] - lim[0])
        note.set_position((t, t))
        box = note.get_window_extent(fig.canvas.get_renderer())
        if not any(box.overlaps(b) for b in clear):
            break

    def blocked():
        fig.canvas.draw()
        return obstacles(ax) + [note.get_window_extent(fig.canvas.get_renderer())]

    def widen():
        fig.set_size_inches(10.0, fig.get_size_inches()[1])
        ax.set_position((0.09, bottom, 0.62, rect[1] + rect[3] - bottom))

    label_points(fig, ax, [(fx[i], x[i]) for i in idx], [names[i] for i in idx], colours, blocked, max_labels,
                 widen=widen, key_xy=(0.72, rect[1] + rect[3]))
    return fig


# ---------------------------------------------------------------------------------------------
# speed-up vs memory

MEMORY_WORDS = "KV-cache reduction (×: baseline KV allocated / method KV allocated, per image)"
def family_marker(family) -> str:
    """A family's one marker in the memory figure (colour is taken by the quality Δ there): its card's
    (`varbench.engine.policy.MethodCard.marker`), else the default for an unmarked method."""
    return method_marker(str(family))


def quality_delta_column(frame) -> str | None:
    """The metric the memory figure colours by: the first main-table metric (an evaluator's overall,
    else its first) that has a ``_delta`` column with a value; None when no row has one."""
    for m in table_metrics(frame):
        col = f"{m}_delta"
        if col in frame.columns and np.isfinite(frame[col].astype(float).to_numpy()).any():
            return m
    return None


def speedup_vs_memory_points(frame, baseline: str = "baseline", speed_col: str | None = None) -> list[dict]:
    """The memory figure's data: per drawable row ``{"name", "family", "memory_x", "speedup", "ci_low",
    "ci_high", "reliable", "delta", "is_baseline"}`` (baseline at (1, 1), Δ 0); rows without a
    memory ratio or a speed-up are left out."""
    frame = frame.reset_index(drop=True)
    if "memory_x" not in frame.columns:
        return []
    x, lo, hi, reliable, _ = speed_values(frame, baseline, speed_col)
    mx = frame["memory_x"].astype(float).to_numpy()
    base = baseline_mask(frame, baseline).to_numpy()
    mx = np.where(base, 1.0, mx)
    metric = quality_delta_column(frame)
    delta = frame[f"{metric}_delta"].astype(float).to_numpy() if metric else np.full(len(frame), np.nan)
    delta = np.where(base, 0.0, delta)
    names = _no_effect(display_names(frame), frame)
    out = []
    for i in range(len(frame)):
        if not (np.isfinite(mx[i]) and np.isfinite(x[i]) and mx[i] > 0 and x[i] > 0):
            continue
        out.append({"name": names[i], "family": str(frame["method"].iloc[i]), "memory_x": float(mx[i]),
                    "speedup": float(x[i]), "ci_low": float(lo[i]), "ci_high": float(hi[i]),
                    "reliable": bool(reliable[i]), "delta": float(delta[i]), "is_baseline": bool(base[i])})
    return out


def _member_family(frame, i: int) -> str:
    """A composition's marker: its compute member's family (FastVAR + ScaleKV is drawn as FastVAR's
    shape, the ScaleKV part shows on the x axis); the policy's own family otherwise."""
    fam = str(frame["method"].iloc[i])
    if fam != "compose":
        return fam
    label = str(frame["method_label"].iloc[i]) if "method_label" in frame.columns else ""
    for f in ("fastvar", "nova", "skipvar", "toprovar"):
        if label.lower().startswith(f):
            return f
    return fam


def speedup_vs_memory_figure(frame, baseline: str = "baseline", speed_col: str | None = None, title: str = "",
                             max_labels: int = 14):
    """The speed-up-vs-memory Figure of one group (see the module docstring), or None when no
    non-baseline row has a memory ratio and a speed-up. ``fig.varbench_points`` is
    :func:`speedup_vs_memory_points`; points carry gids ``"point:<name>"``."""
    import matplotlib as mpl
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.lines import Line2D

    frame = frame.reset_index(drop=True)
    pts = speedup_vs_memory_points(frame, baseline, speed_col)
    if not any(not p["is_baseline"] for p in pts):
        return None
    names = _no_effect(display_names(frame), frame)
    rows = {n: i for i, n in enumerate(names)}
    metric = quality_delta_column(frame)
    _, _, _, _, col = speed_values(frame, baseline, speed_col)
    fig = new_figure(8.4, 6.6)
    ax = fig.add_axes((0.105, 0.27, 0.67, 0.63))
    cax = fig.add_axes((0.80, 0.27, 0.022, 0.63))
    deltas = np.array([p["delta"] for p in pts])
    span = float(np.nanmax(np.abs(deltas))) if np.isfinite(deltas).any() else 0.0
    span = span if span > 0 else 1e-3
    up = metric is None or higher_is_better(metric, frame_directions(frame))
    cmap = mpl.colormaps["RdBu" if up else "RdBu_r"]     # better = blue, worse = red, whichever way the metric points
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-span, vmax=span)
    colours, xy, labels = [], [], []
    for p in pts:
        i = rows[p["name"]]
        fam = "baseline" if p["is_baseline"] else _member_family(frame, i)
        face = "0.75" if not np.isfinite(p["delta"]) else cmap(norm(p["delta"]))
        edge = family_colour(str(frame["method"].iloc[i]) if fam == "baseline" else fam)
        if p["is_baseline"]:
            ax.plot([1.0], [1.0], marker="*", ms=16, color="black", mfc=face, mec="black", mew=1.0, ls="none",
                    zorder=5, gid="baseline")
        else:
            if np.isfinite(p["ci_low"]) and np.isfinite(p["ci_high"]):
                ax.errorbar([p["memory_x"]], [p["speedup"]], fmt="none", ecolor=edge, elinewidth=0.9, capsize=2.5,
                            zorder=3, yerr=[[max(p["speedup"] - p["ci_low"], 0.0)], [max(p["ci_high"] - p["speedup"], 0.0)]])
            # the fill is the quality Δ, so an unreliable speed-up is marked in its name (†), not by a hollow marker
            ax.plot([p["memory_x"]], [p["speedup"]], marker=family_marker(fam), ms=10, ls="none",
                    mfc=face, mec=edge, mew=1.8, zorder=4, gid=f"point:{p['name']}")
        colours.append(edge)
        xy.append((p["memory_x"], p["speedup"]))
        labels.append(p["name"] + ("" if p["reliable"] else " †"))
    fig.varbench_points = pts
    xs = np.array([q[0] for q in xy] + [1.0])
    ys = np.concatenate([[q[1] for q in xy], [p["ci_low"] for p in pts if np.isfinite(p["ci_low"])],
                         [p["ci_high"] for p in pts if np.isfinite(p["ci_high"])], [1.0]])
    for lim, v in ((ax.set_xlim, xs), (ax.set_ylim, ys)):
        sp = max(float(v.max() - v.min()), 0.2)
        lim(max(0.0, float(v.min()) - 0.12 * sp), float(v.max()) + 0.18 * sp)
    ax.axhline(1.0, color="0.6", lw=0.8, ls=":", zorder=1)
    ax.axvline(1.0, color="0.6", lw=0.8, ls=":", zorder=1)
    ax.grid(alpha=0.25)
    ax.set_xlabel(MEMORY_WORDS, fontsize=8.5)
    has_ci = any(np.isfinite(p["ci_low"]) for p in pts)
    ax.set_ylabel(speed_words(col, has_ci).replace(" (×, ", "\n(×, "), fontsize=8.5)
    ax.set_title(title or "Speed-up vs KV-cache memory saved", fontsize=10)
    sm = mpl.cm.ScalarMappable(norm=norm, cmap=cmap)
    cb = fig.colorbar(sm, cax=cax)
    cb.set_label(f"Δ {metric_header(metric, frame_directions(frame))} vs baseline" if metric else "no quality Δ recorded",
                 fontsize=8.5)
    fams = list(dict.fromkeys(_member_family(frame, rows[p["name"]]) for p in pts if not p["is_baseline"]))
    handles = [Line2D([], [], marker="*", ms=11, color="black", mfc="white", ls="none", label="baseline (1×, 1×)")]
    handles += [Line2D([], [], marker=family_marker(f), ms=8, ls="none", mfc="white", mec=family_colour(f), mew=1.8,
                       label=family_name(f) if f != "scalekv" else "ScaleKV alone") for f in fams]
    handles.append(Line2D([], [], ls="none", label="fill: quality Δ (colour bar); † after a name: speed-up unreliable"))
    if any(str(m) == "compose" for m in frame["method"]):
        handles.append(Line2D([], [], ls="none", label="a composition: its compute member's shape"))
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.02, 0.005), ncol=3, fontsize=7.5, frameon=False,
               columnspacing=1.2, handletextpad=0.4)

    def blocked():
        fig.canvas.draw()
        return obstacles(ax)

    def widen():   # room on the right for the numbered key when the names do not fit beside the points
        fig.set_size_inches(10.6, fig.get_size_inches()[1])
        ax.set_position((0.085, 0.27, 0.53, 0.63))
        cax.set_position((0.635, 0.27, 0.018, 0.63))

    label_points(fig, ax, xy, labels, colours, blocked, max_labels, widen=widen, key_xy=(0.73, 0.90))
    return fig


# ---------------------------------------------------------------------------------------------
# latency vs batch size

def _read_record(path) -> Mapping | None:
    """The record of an entry folder (its seal checked for record.json only), None if unreadable."""
    from varbench.harness.records import RunEntry

    if not isinstance(path, str) or not path:
        return None
    try:
        entry = RunEntry.from_dir(path)
        entry.verify([entry.record_path.name])
        return json.loads(entry.record_path.read_bytes())
    except (OSError, ValueError) as e:
        warnings.warn(f"latency vs batch size: record {path} not read ({type(e).__name__}: {e})", stacklevel=3)
        return None


def batch_latencies(record: Mapping) -> dict[int, dict]:
    """``{batch size: {"ms", "p10", "p90", "speedup", "ci_low", "ci_high"}}`` from a record's
    ``timing.by_batch``: AR ms per image (the batch's medians over timed prompts / batch size) and
    the paired AR speed-up with its interval (NaN where absent)."""
    nan = float("nan")
    out = {}
    for bs, block in (((record or {}).get("timing") or {}).get("by_batch") or {}).items():
        try:
            b = int(bs)
        except (TypeError, ValueError):
            continue
        ar = block.get("ar_ms") if isinstance(block, Mapping) else None
        ar = ar if isinstance(ar, Mapping) else {"median": ar}
        med = ar.get("median")
        if med is None or b < 1:
            continue
        p = block.get("paired") or {}

        def num(v):
            return float(v) if v is not None else nan
        out[b] = {"ms": float(med) / b, "p10": num(ar.get("p10")) / b, "p90": num(ar.get("p90")) / b,
                  "speedup": num(p.get("ar_speedup")), "ci_low": num(p.get("ar_ci_low")),
                  "ci_high": num(p.get("ar_ci_high"))}
    return out


def latency_vs_batch_figure(frame, baseline: str = "baseline", title: str = "",
                            records: Mapping[int, Mapping] | None = None):
    """AR ms per image vs batch size for one group (see the module docstring); None when no record
    was timed at two or more batch sizes. ``records``: ``{row position: record}`` (default: read
    from each row's ``path``). ``fig.varbench_series`` is ``{name: {batch size: ms per image}}``."""
    from matplotlib.lines import Line2D

    frame = frame.reset_index(drop=True)
    names = _no_effect(display_names(frame), frame)
    if records is None:
        records = {i: _read_record(p) for i, p in enumerate(frame.get("path", [None] * len(frame)))}
    series = {i: batch_latencies(records.get(i) or {}) for i in range(len(frame))}
    sizes = sorted({b for s in series.values() for b in s})
    if len(sizes) < 2 or not any(len(s) >= 2 for s in series.values()):
        return None
    base = baseline_mask(frame, baseline).to_numpy()
    markers = preset_markers(frame)
    paired = any(sum(np.isfinite(v["speedup"]) for v in s.values()) >= 2 for s in series.values())
    fig = new_figure(11.0 if paired else 8.6, 5.2)
    axes = [fig.add_axes((0.08, 0.12, 0.36, 0.70)), fig.add_axes((0.52, 0.12, 0.21, 0.70))] if paired \
        else [fig.add_axes((0.10, 0.12, 0.57, 0.70))]
    ax = axes[0]
    order = [i for i in range(len(frame)) if base[i]] + [i for i in range(len(frame)) if not base[i]]
    shown = [i for i in order if series[i]]
    # a small sideways shift per series (log2 units), so the bars of close lines stay apart
    dodge = {i: 2.0 ** (0.12 * (k - (len(shown) - 1) / 2) / max(len(shown) - 1, 1)) for k, i in enumerate(shown)}
    handles, drawn = [], {}
    for i in order:
        s = series[i]
        if not s:
            continue
        bs = sorted(s)
        if base[i]:
            c, mk, lw, z = "black", "*", 1.8, 5
        else:
            (c, mk), lw, z = row_style(frame.iloc[i], markers), 1.2, 4
        ms = np.array([s[b]["ms"] for b in bs])
        p10 = np.array([s[b]["p10"] for b in bs])
        p90 = np.array([s[b]["p90"] for b in bs])
        err = None
        if np.isfinite(p10).all() and np.isfinite(p90).all():
            err = [np.maximum(ms - p10, 0), np.maximum(p90 - ms, 0)]
        ax.errorbar(np.array(bs) * dodge[i], ms, yerr=err, color=c, marker=mk, ms=8 if mk == "*" else 5, lw=lw, capsize=2, zorder=z,
                    gid=f"latency:{names[i]}")
        drawn[names[i]] = {b: s[b]["ms"] for b in bs}
        handles.append(Line2D([], [], color=c, marker=mk, lw=lw, label=names[i]))
        if paired and not base[i]:
            sp = np.array([s[b]["speedup"] for b in bs])
            ok = np.isfinite(sp)
            lo = np.array([s[b]["ci_low"] for b in bs])[ok]
            hi = np.array([s[b]["ci_high"] for b in bs])[ok]
            e2 = [np.maximum(sp[ok] - lo, 0), np.maximum(hi - sp[ok], 0)] if np.isfinite(lo).all() and np.isfinite(hi).all() else None
            axes[1].errorbar(np.array(bs)[ok] * dodge[i], sp[ok], yerr=e2, color=c, marker=mk, ms=5, lw=lw, capsize=2,
                             zorder=z, gid=f"speedup:{names[i]}")
    fig.varbench_series = drawn
    for a in axes:
        a.set_xscale("log", base=2)
        a.set_xticks(sizes, labels=[str(b) for b in sizes])
        a.minorticks_off()
        a.set_xlabel("batch size (images per generate call)")
        a.grid(alpha=0.25)
    ax.set_ylabel("AR loop ms per image\n(median over timed prompts ÷ batch size; bars p10–p90)", fontsize=8.5)
    fig.suptitle(title or "Latency vs batch size", fontsize=10)
    ax.set_title("AR loop latency per image", fontsize=9)
    if paired:
        axes[1].axhline(1.0, color="0.45", lw=0.8, ls=":")
        axes[1].set_ylabel("paired speed-up AR (×, 95% CI)", fontsize=8.5)
        axes[1].set_title("speed-up per batch size", fontsize=9)
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.75 if paired else 0.69, 0.82), fontsize=7,
               frameon=False, handlelength=2.2)
    return fig


# ---------------------------------------------------------------------------------------------
# files

def write_cost_figures(paired, out: str | Path, baseline: str = "baseline") -> list[Path]:
    """``speedup_vs_flops.png``, ``speedup_vs_memory.png`` and ``latency_vs_batch.png`` per group of ``paired``
    (``__<group>`` appended when it holds several; each written only when it has data)."""
    out = Path(out)
    parts = groups(paired)
    paths = []
    for key, g in parts:
        suffix = f"__{slug('_'.join(str(k) for k in key))}" if len(parts) > 1 else ""
        sub = " · ".join(str(k) for k in key if not is_missing(k) and str(k))
        fig = speedup_vs_flops_figure(g, baseline, title="Measured speed-up vs FLOPs saved" + (f"\n{sub}" if sub else ""))
        if fig is not None:
            paths.append(save_figure(fig, out / f"speedup_vs_flops{suffix}.png"))
        fig = speedup_vs_memory_figure(g, baseline, title="Speed-up vs KV-cache memory saved" + (f"\n{sub}" if sub else ""))
        if fig is not None:
            paths.append(save_figure(fig, out / f"speedup_vs_memory{suffix}.png"))
        fig = latency_vs_batch_figure(g, baseline, title="Latency vs batch size" + (f"\n{sub}" if sub else ""))
        if fig is not None:
            paths.append(save_figure(fig, out / f"latency_vs_batch{suffix}.png"))
    return paths

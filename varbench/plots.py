"""Figures for aggregated results (matplotlib, Agg canvas, PNG files).

Usage::

    from varbench.plots import speed_quality_scatter, keep_ratio_heatmap, entropy_curves
    speed_quality_scatter(paired_frame, "results/nova_sweep")          # one PNG per metric
    keep_ratio_heatmap(entry.read_traces(), "keep_fastvar.png", title="fastvar")
    entropy_curves({"baseline": base_traces, "nova": nova_traces}, "entropy_vs_scale.png")

Trace rows follow ``varbench.records`` (``scales[*].keep_frac`` per layer, ``ran``,
``entropy_mean``). Conventions for the keep-ratio matrix (scales x layers, mean over images):
a scale that ran with ``keep_frac: null`` kept everything (1.0 on every layer); a scale that
did not run (``ran: false``) kept nothing (0.0). Figures are drawn on ``matplotlib.figure.Figure``
with the Agg canvas, so no display or global backend switch is needed.
"""
from __future__ import annotations


import math
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np


def _figure(w: float = 6.0, h: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def slug(text: str) -> str:
    """File-name-safe version of a label."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", str(text)).strip("_") or "x"


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


def keep_ratio_heatmap(traces: Iterable[Mapping], out_path: str | Path, title: str = "",
                       layer_labels: Sequence[str] | None = None) -> Path:
    """Heatmap of :func:`keep_matrix` (rows: scale index, columns: layer)."""
    mat = keep_matrix(traces)
    fig = _figure(max(4.0, 0.18 * mat.shape[1] + 2.5), max(3.0, 0.3 * mat.shape[0] + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(mat, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", interpolation="nearest")
    ax.set_xlabel("layer")
    ax.set_ylabel("scale index")
    ax.set_yticks(range(mat.shape[0]))
    if layer_labels is not None and len(layer_labels) == mat.shape[1]:
        ax.set_xticks(range(mat.shape[1]), labels=list(layer_labels), rotation=90, fontsize=6)
    ax.set_title(f"kept token fraction{chr(10) + title if title else ''}", fontsize=9)
    fig.colorbar(im, ax=ax, label="keep fraction")
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format="png")
    return out_path


def entropy_curves(series: Mapping[str, Iterable[Mapping]], out_path: str | Path, title: str = "") -> Path:
    """Mean predictive entropy vs scale index, one line per label."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    for label, traces in series.items():
        curve = entropy_by_scale(traces)
        if curve.size:
            ax.plot(np.arange(curve.size), curve, marker="o", ms=3, label=str(label))
    ax.set_xlabel("scale index")
    ax.set_ylabel("mean predictive entropy (nats)")
    ax.set_title(title or "entropy vs scale")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format="png")
    return out_path


def speed_quality_scatter(frame, out_dir: str | Path, metrics: Sequence[str] | None = None,
                          speed_col: str = "speedup") -> list[Path]:
    """One PNG per metric: ``speed_col`` (x) vs the metric (y, with ± error bars), one point per
    row, labelled by ``method_label``; colours separate model/resolution/benchmark groups."""
    from varbench.records import metric_columns

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = list(metrics) if metrics is not None else [
        m for m in metric_columns(frame) if not m.rsplit("/", 1)[-1].startswith("n_")]  # counts are not quality
    group_cols = [c for c in ("model", "resolution", "benchmark") if c in frame.columns]
    paths = []
    for m in metrics:
        sub = frame[frame[m].notna() & frame[speed_col].notna()] if speed_col in frame.columns else frame.iloc[0:0]
        if sub.empty:
            continue
        fig = _figure()
        ax = fig.add_subplot(1, 1, 1)
        groups = sub.groupby(group_cols, dropna=False) if group_cols else [("all", sub)]
        for key, g in groups:
            err = g[f"{m}_err"] if f"{m}_err" in g.columns else None
            name = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
            ax.errorbar(g[speed_col], g[m], yerr=err, fmt="o", ms=4, capsize=2, label=name)
            for _, r in g.iterrows():
                ax.annotate(str(r.get("method_label", "")), (r[speed_col], r[m]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"{speed_col} (x, vs baseline)")
        ax.set_ylabel(m)
        ax.set_title(f"speed vs {m}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        fig.tight_layout()
        path = out_dir / f"speed_vs_{slug(m)}.png"
        fig.savefig(path, format="png")
        paths.append(path)
    return paths


def write_figures(paired, out: Path) -> list[Path]:
    """Speed/quality scatter per metric; keep-ratio heatmaps and entropy curves from traces."""
    from varbench.records import RunEntry

    # the in-process interleaved ratio when the records have it: separately timed jobs drift (2x on a CPU)
    speed = "paired_speedup" if "paired_speedup" in paired.columns and paired["paired_speedup"].notna().any() else "speedup"
    written = speed_quality_scatter(paired, out, speed_col=speed)
    group = [k for k in ("model", "resolution", "benchmark") if k in paired.columns]
    for key, g in (paired.groupby(group, dropna=False) if group else [((), paired)]):
        key = key if isinstance(key, tuple) else (key,)
        series = {}
        for _, r in g.iterrows():
            if not r.get("path"):
                continue
            traces = RunEntry.from_dir(r["path"]).read_traces()
            if not traces:
                continue
            label = str(r["method_label"])
            series[label if label not in series else f"{label} [{r['entry_id'][:6]}]"] = traces
            mat = keep_matrix(traces)
            if mat.size and not (mat == 1.0).all():
                labels = (traces[0].get("stats") or {}).get("layer_labels")
                written.append(keep_ratio_heatmap(
                    traces, out / f"keep_{slug(label)}_{str(r['entry_id'])[:8]}.png",
                    title=label, layer_labels=labels))
        if any(entropy_by_scale(t).size for t in series.values()):
            name = slug("_".join(str(k) for k in key)) if key else "all"
            written.append(entropy_curves(series, out / f"entropy_vs_scale_{name}.png",
                                                title=" · ".join(str(k) for k in key)))
    return written

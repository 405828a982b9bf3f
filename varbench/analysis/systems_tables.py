"""The systems experiments' tables: the batch-size sweep and the systems ladder, one table and one
figure each, written beside a group's usual tables by :func:`varbench.analysis.aggregate.aggregate`
when the group holds records of ``batch_sweep`` or ``systems_ladder`` (varbench/conf/experiment/).

    write_systems_tables(sub, folder)   # batch_sweep.{csv,md,png} and/or systems_ladder.{csv,md,png}

``batch_sweep``: one row per (method, timed batch size) from each record's ``timing.by_batch``:
AR ms per image (the batch's median over the timed prompts / batch size), images/s end to end, the
paired AR speed-up against the baseline timed interleaved at that batch size, and the timed pass's
peak memory (CUDA allocated / reserved / NVML; the CPU has none). Figure: AR ms per image against
the batch size, one line per method (what batching buys each method: a method that prunes tokens
gains less from a bigger batch once the GPU is busy).

``systems_ladder``: one row per (method, runtime knobs) cell, the ladder's rungs first (baseline ->
method -> +compile -> +quantisation, the cumulative path), the sweep's other cells after. Columns:
the knobs, AR ms per image at the first timed batch size, the speed-up against the ladder's first
rung (baseline, eager, unquantised: separate jobs on the same machine, so machine drift between
jobs is in it; each job's own paired ratio is against a baseline with the *same* knobs and says what
the method adds on top of them), the compile time (the compiling generations' wall time, which the
warm-up absorbed, apart from the steady state), weight bytes, the fidelity of each cell's images to
the first rung's (PSNR in dB over the images both stores hold: what compile / quantisation cost in
pixels; inf = identical) and the quality metric's value. Figure: speed-up against the first rung per
rung (bars), fidelity PSNR as a line.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Mapping, Sequence

EXPERIMENTS = ("batch_sweep", "systems_ladder")
KNOBS = ("compile", "quant", "attn_backend")
_DEFAULT = {"compile": "off", "quant": "none", "attn_backend": "auto"}


def _record(path) -> Mapping | None:
    try:
        return json.loads((Path(path) / "record.json").read_text())
    except (OSError, ValueError, TypeError) as e:
        warnings.warn(f"systems table: record under {path} not read ({type(e).__name__}: {e})", stacklevel=3)
        return None


def _knobs(rec: Mapping) -> dict:
    rt = ((rec.get("config") or {}).get("runtime") or {})
    return {k: str(rt.get(k, _DEFAULT[k])) for k in KNOBS}


def _label(rec: Mapping) -> str:
    knobs = _knobs(rec)
    extra = [f"{k}={v}" for k, v in knobs.items() if v != _DEFAULT[k]]
    name = str((rec.get("method") or {}).get("label") or (rec.get("method") or {}).get("name"))
    return name + ("" if not extra else " + " + ", ".join(extra))


def _gib(v) -> float:
    return float(v) / 2**30 if v is not None else math.nan


def batch_rows(records: Sequence[Mapping]) -> list[dict]:
    rows = []
    for rec in records:
        for bs, b in sorted(((int(k), v) for k, v in ((rec.get("timing") or {}).get("by_batch") or {}).items()),
                            key=lambda kv: kv[0]):
            ar = (b.get("ar_ms") or {}).get("median")
            paired = b.get("paired") or {}
            rows.append({"method": _label(rec), "batch": bs,
                         "ar_ms_per_image": ar / bs if ar is not None else math.nan,
                         "images_per_s": b.get("images_per_s") if b.get("images_per_s") is not None else math.nan,
                         "paired_ar_speedup": paired.get("ar_speedup", math.nan),
                         "peak_alloc_gib": _gib(b.get("peak_mem_bytes")), "peak_reserved_gib": _gib(b.get("peak_reserved_bytes")),
                         "nvml_gib": _gib(b.get("nvml_bytes"))})
    return rows


def _psnr(store_a: Path, store_b: Path) -> float:
    """PSNR (dB) of the images both stores hold (same prompt and sample index), pooled MSE; NaN when none."""
    import numpy as np
    from PIL import Image

    se, n = 0.0, 0
    for pa in sorted(store_a.glob("*/samples/*.png")):
        pb = store_b / pa.relative_to(store_a)
        if not pb.exists():
            continue
        a = np.asarray(Image.open(pa), dtype=np.float64)
        b = np.asarray(Image.open(pb), dtype=np.float64)
        se, n = se + float(((a - b) ** 2).sum()), n + a.size
    if not n:
        return math.nan
    mse = se / n
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _images_dir(entry_path: Path, rec: Mapping) -> Path:
    """The image store folder of a record: <store>/images/<generation_id> (entries live in
    <store>/<experiment>/entries/<entry_id>)."""
    return Path(entry_path).parents[2] / "images" / str(rec.get("generation_id"))


def ladder_rows(records: Sequence[Mapping], paths: Sequence[Path], metric: str | None = None) -> list[dict]:
    """Rows of the ladder table (module docstring), rungs first; ``metric``: a quality column to show."""
    cells = list(zip(records, paths))

    def key(item):
        rec = item[0]
        knobs = _knobs(rec)
        is_base = (rec.get("method") or {}).get("name") == "baseline"
        # rung order: baseline eager; method eager; method + compile; method + compile + quant
        rung = {(True, "off", "none"): 0, (False, "off", "none"): 1, (False, "on", "none"): 2, (False, "on", "q"): 3}.get(
            (is_base, "off" if knobs["compile"] == "off" else "on", "none" if knobs["quant"] == "none" else "q"))
        return (rung if rung is not None else 9, _label(rec))

    cells.sort(key=key)
    first = cells[0] if cells and key(cells[0])[0] == 0 else None
    first_ms = _ar_ms(first[0]) if first else math.nan
    rows = []
    for rec, path in cells:
        rung = key((rec, path))[0]
        log = ((rec.get("timing") or {}).get("runtime") or {}).get("compile_log") or {}
        weights = ((rec.get("memory") or {}).get("weights_bytes") or {}).get("transformer")
        ms = _ar_ms(rec)
        row = {"rung": rung if rung < 9 else None, "cell": _label(rec), **_knobs(rec),
               "ar_ms_per_image": ms, "speedup_vs_first": (first_ms / ms) if first and ms else math.nan,
               "compile_s": log.get("compiling_s", math.nan) if log else math.nan,
               "transformer_weights_mib": weights / 2**20 if weights is not None else math.nan,
               "psnr_vs_first_db": _psnr(_images_dir(path, rec), _images_dir(first[1], first[0])) if first else math.nan}
        if metric:
            row[metric] = (rec.get("metrics") or {}).get(metric, math.nan)
        rows.append(row)
    return rows


def _ar_ms(rec: Mapping) -> float:
    by = (rec.get("timing") or {}).get("by_batch") or {}
    if not by:
        return math.nan
    bs = min(by, key=int)
    med = (by[bs].get("ar_ms") or {}).get("median")
    return med / int(bs) if med is not None else math.nan


def _markdown(rows: list[dict], title: str, notes: Sequence[str]) -> str:
    if not rows:
        return f"# {title}\n\n(no rows)\n"
    cols = list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return "—" if math.isnan(v) else ("∞" if math.isinf(v) else f"{v:.3g}")
        return "—" if v is None else str(v)
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n"


def _write(folder: Path, name: str, rows: list[dict], title: str, notes: Sequence[str]) -> None:
    import pandas as pd

    from varbench.core.jsonio import atomic_write_bytes

    atomic_write_bytes(folder / f"{name}.csv", pd.DataFrame(rows).to_csv(index=False).encode("utf-8"))
    atomic_write_bytes(folder / f"{name}.md", _markdown(rows, title, notes).encode("utf-8"))


def _batch_figure(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["method"] for r in rows):
        pts = [(r["batch"], r["ar_ms_per_image"]) for r in rows if r["method"] == name]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    sizes = sorted({r["batch"] for r in rows})
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(b) for b in sizes])
    ax.set_xlabel("batch size (images per generation call)")
    ax.set_ylabel("AR loop ms per image (median over timed prompts)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ladder_figure(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["cell"] for r in rows]
    ax.bar(range(len(rows)), [r["speedup_vs_first"] for r in rows], color=["C0" if r["rung"] is not None else "0.7" for r in rows])
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_ylabel("AR speed-up vs the first rung (×)")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    psnr = [min(r["psnr_vs_first_db"], 99.0) for r in rows]
    ax2 = ax.twinx()
    ax2.plot(range(len(rows)), psnr, "o-", color="C3")
    ax2.set_ylabel("PSNR vs rung 0 (dB; 99 = same)", color="C3")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_systems_tables(sub, folder: Path, device: str | None = None) -> list[Path]:
    """Write the systems experiments' tables and figures for the records of group ``sub`` (a paired
    frame with ``experiment`` and ``path`` columns) into ``folder``; returns the files written."""
    folder = Path(folder)
    written = []
    if "experiment" not in sub.columns or "path" not in sub.columns:
        return written
    device = device or (str(sub["device"].dropna().iloc[0]) if "device" in sub.columns and sub["device"].notna().any() else "")
    for exp in EXPERIMENTS:
        part = sub[sub["experiment"].astype(str) == exp]
        if part.empty:
            continue
        paths = [Path(p) for p in part["path"]]
        recs = [_record(p) for p in paths]
        keep = [(r, p) for r, p in zip(recs, paths) if r is not None]
        title = f"{exp}: {device}"
        if exp == "batch_sweep":
            rows = batch_rows([r for r, _ in keep])
            notes = ["AR ms per image: the timed pass's median over its prompts at that batch size / batch size.",
                     "Paired speed-up: against the baseline timed interleaved in the same job at that batch size.",
                     "Memory: CUDA only (allocated / reserved / NVML); the CPU has none."]
            _write(folder, exp, rows, title, notes)
            if rows:
                _batch_figure(rows, folder / f"{exp}.png", title)
        else:
            metrics = [c for c in sub.columns if "/" in c and not c.endswith(("_err", "_delta", "n_images"))
                       and not c.startswith("version/")]
            # the quality column: a benchmark's overall score first (toy GenEval, GenEval), else the first metric
            metrics.sort(key=lambda c: (not c.endswith("/overall"), c.startswith("fidelity/")))
            rows = ladder_rows([r for r, _ in keep], [p for _, p in keep], metrics[0] if metrics else None)
            notes = ["Rungs 0-3: baseline -> method -> + compile -> + quantisation (cumulative); unnumbered rows: the "
                     "sweep's other cells.",
                     "Speed-up vs the first rung: AR ms per image at the first timed batch size, separate jobs on one machine.",
                     "compile_s: wall time of the generations that compiled (compile + one run), apart from the steady state.",
                     "PSNR vs the first rung: the same prompts and seeds; inf = bit-identical images."]
            _write(folder, exp, rows, title, notes)
            if rows:
                _ladder_figure(rows, folder / f"{exp}.png", title)
        written += [folder / f"{exp}.{ext}" for ext in ("csv", "md", "png") if (folder / f"{exp}.{ext}").exists()]
    return written

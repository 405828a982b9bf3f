"""The qualitative figure: one image grid per sweep, read from the image store.

Usage::

    from varbench.analysis.image_grid import image_grid, write_image_grids, grids_for_wandb
    image_grid(paired, "results/toy_table/image_grid.png", n_rows=4, diff=True)   # -> the PNG path
    write_image_grids(paired, "results/toy_table")   # one per model/resolution/benchmark/device group
    grids_for_wandb(paired, out)                     # {"qualitative/image_grid": Path}, for wandb.Image

Layout: rows are the same (prompt, sample) pairs, i.e. the same prompts and seeds, under every
method; columns are the methods, the baseline first, then the others by speed-up (slowest
first). Each column is headed by its name (the table's: :func:`varbench.analysis.names.display_name`,
in its method family's colour, :mod:`varbench.analysis.colours`), its speed-up over the baseline (the frame's
``paired_speedup`` with its 95% interval when present, else ``speedup``; ``†`` marks a speed-up
flagged unreliable) and its primary quality metric (:func:`varbench.analysis.frame.primary_metric`) with
the difference to the baseline. With ``diff=True`` every image row is followed by a difference
row: per pixel ``|method - baseline|`` averaged over RGB, drawn with the magma colour map from
0 to ``diff_vmax`` (of 255), and the mean absolute difference printed in the cell.

Images: a frame row's ``path`` is its entry folder ``<store>/<experiment>/entries/<hash>/``;
its ``record.json`` names the image store folder (``generation_id``). The store root is taken
as the entry folder's ``parents[2]`` (so a moved result tree still works), else the record's
``config.paths.store_dir``. Images smaller than ``cell`` pixels are enlarged by a whole factor
with nearest-neighbour sampling, so every grid cell is the stored image's pixels exactly
(``layout["scale"]``); larger images are shrunk to ``cell`` (Lanczos). Composition is done with
PIL (text in matplotlib's bundled DejaVu Sans), so cell positions are exact: :func:`compose_grid`
returns them in ``layout["cells"][(row, col)] = (x0, y0, x1, y1)``.
"""
from __future__ import annotations

import json
import textwrap
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from varbench.analysis.colours import family_colour
from varbench.analysis.frame import METRIC_WORDS, primary_metric
from varbench.analysis.groups import baseline_mask, groups, is_missing, slug, speed_values
from varbench.analysis.names import display_name


class GridError(ValueError):
    """The grid cannot be drawn (no baseline, no stored images in common)."""


# ---------------------------------------------------------------------------------------------
# finding the images

def entry_store(row: Mapping):
    """The :class:`varbench.harness.store.ImageStore` that holds a frame row's images."""
    from varbench.harness.store import ImageStore

    entry_dir = Path(str(row["path"]))
    rec = json.loads((entry_dir / "record.json").read_text(encoding="utf-8"))
    gen = rec.get("generation_id") or row.get("generation_id")
    if not gen:
        raise GridError(f"record {entry_dir} names no generation_id (image store folder)")
    roots = []
    if len(entry_dir.parents) > 2:
        roots.append(entry_dir.parents[2])
    store_dir = (((rec.get("config") or {}).get("paths") or {}).get("store_dir"))
    if store_dir:
        roots.append(Path(store_dir))
    for root in roots:
        if (root / "images" / gen).is_dir():
            return ImageStore(root, gen)
    raise GridError(f"no image folder images/{gen} under {', '.join(str(r) for r in roots)} "
                    f"(record {entry_dir}; were the images saved? runtime.save_images)")


def column_order(frame, baseline: str = "baseline", methods: Sequence[str] | None = None):
    """Rows of ``frame`` in column order: baseline row(s) first, then by speed-up (slowest first,
    rows without one last, ties by label). ``methods`` (labels or names) selects and orders the
    non-baseline columns instead."""
    frame = frame.reset_index(drop=True)
    x = speed_values(frame, baseline)[0]
    base = baseline_mask(frame, baseline).to_numpy()
    labels = frame["method_label"].astype(str).tolist()
    names = frame["method"].astype(str).tolist() if "method" in frame.columns else labels
    order = [i for i in range(len(frame)) if base[i]]
    rest = [i for i in range(len(frame)) if not base[i]]
    if methods is not None:
        want = [str(m) for m in methods]
        rest = [i for m in want for i in rest if labels[i] == m or names[i] == m]
        rest = list(dict.fromkeys(rest))
    else:
        rest.sort(key=lambda i: (not np.isfinite(x[i]), x[i] if np.isfinite(x[i]) else 0.0, labels[i]))
    return frame.iloc[order + rest].reset_index(drop=True)


def common_items(stores: Sequence, n_rows: int) -> list[tuple[int, int]]:
    """``n_rows`` (prompt_index, sample_index) pairs stored under every store: distinct prompts
    spread evenly over the benchmark (sample 0 where possible), in prompt order."""
    keys = None
    for st in stores:
        k = set(st.index())
        keys = k if keys is None else keys & k
    if not keys:
        raise GridError("the methods' image stores have no (prompt, sample) in common")
    by_prompt: dict[int, int] = {}
    for p, s in sorted(keys):
        by_prompt.setdefault(p, s)
    prompts = sorted(by_prompt)
    if len(prompts) > n_rows:
        picks = np.linspace(0, len(prompts) - 1, n_rows).round().astype(int)
        prompts = [prompts[i] for i in dict.fromkeys(picks.tolist())]
    return [(p, by_prompt[p]) for p in prompts]


# ---------------------------------------------------------------------------------------------
# headers

def _fmt(v: float) -> str:
    a = abs(v)
    return f"{v:.3f}" if a < 10 else (f"{v:.2f}" if a < 100 else f"{v:.1f}")


def column_header(row: Mapping, is_base: bool, metric: str | None, baseline: str = "baseline",
                  speed: tuple | None = None) -> list[str]:
    """Header lines of a column: label, speed-up, quality (see the module docstring)."""
    lines = [display_name(row) + (" (no effect)" if row.get("method_effect") == "none" else "")]
    x, lo, hi, reliable = speed if speed is not None else (float("nan"),) * 3 + (True,)
    if is_base:
        lines.append("1.00× (reference)")
    elif np.isfinite(x):
        s = f"speed-up {x:.2f}×"
        if np.isfinite(lo) and np.isfinite(hi):
            s += f" [{lo:.2f}, {hi:.2f}]"
        if not reliable:
            s += " †"
        if x < 1.0:
            s += " (slower)"
        lines.append(s)
    else:
        lines.append("speed-up: not timed")
    if metric:
        name = METRIC_WORDS.get(metric, (metric.replace("/", " ").replace("_", " "), ""))[0]
        name = name.replace(" overall score", "").replace(" human-preference score", "")
        v = row.get(metric)
        if is_missing(v):
            lines.append(f"{name}: –")
        else:
            q = f"{name}: {_fmt(float(v))}"
            err = row.get(f"{metric}_err")
            if not is_missing(err) and float(err) > 0:
                q += f" ± {_fmt(float(err))}"
            lines.append(q)
            d = row.get(f"{metric}_delta")
            if not is_base and not is_missing(d):
                lines.append(f"Δ {'+' if float(d) >= 0 else '−'}{_fmt(abs(float(d)))} vs baseline")
    return lines


# ---------------------------------------------------------------------------------------------
# composition

def _font(size: int, bold: bool = False):
    from PIL import ImageFont

    try:
        from matplotlib import font_manager

        path = font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans",
                                                                 weight="bold" if bold else "normal"))
        return ImageFont.truetype(path, size)
    except Exception:  # noqa: BLE001 - no matplotlib/FreeType: PIL's own font
        try:
            return ImageFont.load_default(size)
        except TypeError:
            return ImageFont.load_default()


def _wrap(text: str, font, width: int) -> list[str]:
    out = []
    for para in str(text).split("\n"):
        words = para.split(" ")
        line = ""
        for w in words:
            cand = (line + " " + w).strip()
            if font.getlength(cand) <= width or not line:
                line = cand
            else:
                out.append(line)
                line = w
        out.append(line)
    # a single word longer than the width: cut it
    fixed = []
    for line in out:
        while font.getlength(line) > width and len(line) > 1:
            cut = len(line)
            while cut > 1 and font.getlength(line[:cut] + "…") > width:
                cut -= 1
            fixed.append(line[:cut] + "…") if cut < len(line) else None
            line = "" if cut >= len(line) else line[cut:]
            if len(fixed) > 6:
                break
        if line:
            fixed.append(line)
    return fixed


def _fit(img, cell: int):
    """(image resized for a cell, scale): whole-factor nearest enlargement, or Lanczos shrink."""
    from PIL import Image

    w, h = img.size
    if max(w, h) <= cell:
        k = max(1, cell // max(w, h))
        return (img.resize((w * k, h * k), Image.NEAREST) if k > 1 else img), float(k)
    k = cell / max(w, h)
    return img.resize((max(1, round(w * k)), max(1, round(h * k))), Image.LANCZOS), k


def diff_image(img, ref, vmax: float = 96.0):
    """(magma-coloured |img - ref| as RGB PIL image, mean absolute difference in 0..255)."""
    from matplotlib import colormaps
    from PIL import Image

    a = np.asarray(img.convert("RGB"), dtype=np.float32)
    b = np.asarray(ref.convert("RGB"), dtype=np.float32)
    if a.shape != b.shape:
        b = np.asarray(ref.convert("RGB").resize(img.size, Image.BILINEAR), dtype=np.float32)
    d = np.abs(a - b).mean(axis=2)
    rgb = (colormaps["magma"](np.clip(d / vmax, 0.0, 1.0))[..., :3] * 255).round().astype(np.uint8)
    return Image.fromarray(rgb, "RGB"), float(d.mean())


def compose_grid(columns: Sequence[Mapping], items: Sequence[tuple[int, int]], row_labels: Sequence[str],
                 cell: int = 192, diff: bool = False, diff_vmax: float = 96.0, title: str = "",
                 footer: str = ""):
    """Draw the grid. ``columns[c]``: ``{"store": ImageStore, "header": [lines], "colour": the first
    line's}`` (column 0 is the baseline); ``items[r]``: (prompt_index, sample_index). Returns ``(PIL.Image, layout)`` with
    ``layout["cells"][(r, c)]`` the box of image row r / column c, ``layout["diff_cells"]`` the
    same for difference rows (columns 1..), ``layout["scale"]``, ``layout["mean_abs_diff"]``."""
    from PIL import Image, ImageDraw

    f_head, f_bold, f_row, f_small, f_title = _font(13), _font(14, bold=True), _font(13), _font(11), _font(16, bold=True)
    images = [[col["store"].load(p, s) for (p, s) in items] for col in columns]
    fitted = [[_fit(im, cell) for im in col] for col in images]
    cw = max(im.size[0] for col in fitted for im, _ in col)
    ch = max(im.size[1] for col in fitted for im, _ in col)
    gap, pad = 6, 10
    label_w = 190
    wrapped_heads = []
    for col in columns:
        lines = []
        for k, line in enumerate(col["header"]):
            lines += [(seg, k == 0) for seg in _wrap(line, f_bold if k == 0 else f_head, cw)]
        wrapped_heads.append(lines)
    line_h = 17
    head_h = max(len(h) for h in wrapped_heads) * line_h + 8
    title_lines = _wrap(title, f_title, label_w + len(columns) * (cw + gap) - gap) if title else []
    title_h = 20 * len(title_lines) + 8 if title else 0
    n_rows = len(items) * (2 if diff else 1)
    footer_lines = _wrap(footer, f_small, label_w + len(columns) * (cw + gap)) if footer else []
    W = pad + label_w + len(columns) * (cw + gap) - gap + pad
    H = pad + title_h + head_h + n_rows * (ch + gap) - gap + pad + (len(footer_lines) * 15 + 6 if footer_lines else 0)
    canvas = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(canvas)
    if title:
        for k, line in enumerate(title_lines):
            draw.text((pad, pad + k * 20), line, fill="black", font=f_title)
    x0s = [pad + label_w + c * (cw + gap) for c in range(len(columns))]
    top = pad + title_h
    for c, lines in enumerate(wrapped_heads):
        for k, (text, bold) in enumerate(lines):
            tw = (f_bold if bold else f_head).getlength(text)
            draw.text((x0s[c] + (cw - tw) / 2, top + k * line_h), text,
                      fill=columns[c].get("colour", "black") if bold else "#333333",
                      font=f_bold if bold else f_head)
    layout = {"cells": {}, "diff_cells": {}, "scale": fitted[0][0][1], "mean_abs_diff": {},
              "columns": [col["header"][0] for col in columns], "items": list(items),
              "colours": [col.get("colour", "black") for col in columns]}
    y = top + head_h
    for r, (p, s) in enumerate(items):
        for k, line in enumerate(_wrap(row_labels[r], f_row, label_w - 12)[:8]):
            draw.text((pad, y + 2 + k * 16), line, fill="black", font=f_row)
        for c in range(len(columns)):
            im, _ = fitted[c][r]
            canvas.paste(im, (x0s[c], y))
            layout["cells"][(r, c)] = (x0s[c], y, x0s[c] + im.size[0], y + im.size[1])
        y += ch + gap
        if diff:
            draw.text((pad, y + 2), "|difference| to baseline", fill="#333333", font=f_small)
            draw.text((x0s[0] + 4, y + ch / 2 - 7), "(reference)", fill="#777777", font=f_small)
            for c in range(1, len(columns)):
                dimg, mad = diff_image(images[c][r], images[0][r], diff_vmax)
                dimg, _ = _fit(dimg, cell)
                canvas.paste(dimg, (x0s[c], y))
                layout["diff_cells"][(r, c)] = (x0s[c], y, x0s[c] + dimg.size[0], y + dimg.size[1])
                layout["mean_abs_diff"][(r, c)] = mad
                text = f"mean |Δ| {mad:.1f}/255"
                tw = f_small.getlength(text)
                draw.rectangle((x0s[c] + 2, y + 2, x0s[c] + 8 + tw, y + 17), fill="white")
                draw.text((x0s[c] + 5, y + 3), text, fill="black", font=f_small)
            y += ch + gap
    for k, line in enumerate(footer_lines):
        draw.text((pad, y + 4 + k * 15), line, fill="#444444", font=f_small)
    return canvas, layout


# ---------------------------------------------------------------------------------------------
# from a paired frame

def grid_figure(paired, baseline: str = "baseline", n_rows: int = 4, items: Sequence[tuple[int, int]] | None = None,
                methods: Sequence[str] | None = None, diff: bool = False, cell: int = 256, metric: str | None = None,
                diff_vmax: float = 96.0, title: str = ""):
    """(PIL image, layout, ordered frame) for one group of ``paired`` (see :func:`image_grid`)."""
    frame = column_order(paired, baseline, methods)
    base = baseline_mask(frame, baseline).to_numpy()
    if not base.any():
        raise GridError(f"no {baseline!r} row to put in the first column")
    frame = frame.iloc[[int(np.flatnonzero(base)[0])] + [i for i in range(len(frame)) if not base[i]]].reset_index(drop=True)
    base = baseline_mask(frame, baseline).to_numpy()
    stores, keep = [], []
    for i, row in frame.iterrows():
        try:
            stores.append(entry_store(row))
            keep.append(i)
        except (GridError, OSError, KeyError, TypeError, ValueError) as e:
            if i == 0:
                raise GridError(f"baseline images not found: {e}") from e
            warnings.warn(f"image grid: column {row.get('method_label')!r} left out: {e}", stacklevel=2)
    frame = frame.iloc[keep].reset_index(drop=True)
    base = base[keep]
    items = list(items) if items is not None else common_items(stores, n_rows)
    metric = metric if metric is not None else primary_metric(frame)
    x, lo, hi, rel, _ = speed_values(frame, baseline)
    columns = [{"store": st, "header": column_header(row, bool(base[i]), metric, baseline, (x[i], lo[i], hi[i], rel[i])),
                "colour": "black" if base[i] else family_colour(row.get("method"))}
               for (i, row), st in zip(frame.iterrows(), stores)]
    row_labels = []
    for p, s in items:
        try:
            prompt = stores[0].read_metadata(p).get("prompt", "")
        except (OSError, ValueError):
            prompt = ""
        row_labels.append(f"“{textwrap.shorten(prompt, 90, placeholder='…')}”\nprompt {p}, sample {s}")
    seeds = str(frame["seeds"].iloc[0]) if "seeds" in frame.columns and not is_missing(frame["seeds"].iloc[0]) else ""
    seeds = "" if seeds.startswith("sha:") else seeds   # a hash says nothing to a reader
    footer = ("Rows: the same prompt and seed under every method" + (f" (seeds {seeds})" if seeds else "")
              + ". Speed-up: over the baseline" + (", [95% interval], † = flagged unreliable (see the table notes)"
                                                  if "speedup_reliable" in frame.columns else "")
              + "." + (f" Difference rows: per-pixel |method − baseline| (RGB mean), magma, 0 to "
                       f"{diff_vmax:.0f}/255 and above." if diff else ""))
    img, layout = compose_grid(columns, items, row_labels, cell=cell, diff=diff, diff_vmax=diff_vmax,
                               title=title, footer=footer)
    layout["metric"] = metric
    return img, layout, frame


def image_grid(paired, out_path: str | Path, baseline: str = "baseline", n_rows: int = 4,
               items: Sequence[tuple[int, int]] | None = None, methods: Sequence[str] | None = None,
               diff: bool = False, cell: int = 256, metric: str | None = None, diff_vmax: float = 96.0,
               title: str = "") -> Path:
    """Write the qualitative grid of ``paired`` (rows of ONE model/resolution/benchmark group, with
    its baseline) as a PNG and return its path. ``items``: explicit (prompt_index, sample_index)
    rows (default: ``n_rows`` prompts spread over the benchmark, stored by every method);
    ``methods``: labels or names of the columns after the baseline, in order (default: all, by
    speed-up); ``diff``: add difference rows; ``metric``: the quality shown in the headers."""
    img, _, _ = grid_figure(paired, baseline=baseline, n_rows=n_rows, items=items, methods=methods,
                            diff=diff, cell=cell, metric=metric, diff_vmax=diff_vmax, title=title)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    img.save(out_path, format="PNG")
    return out_path


def write_image_grids(paired, out: str | Path, baseline: str = "baseline", n_rows: int = 4,
                      diff: bool = True, **kw) -> list[Path]:
    """One grid per model/resolution/benchmark/device group of ``paired`` that has a baseline:
    ``image_grid.png`` (``image_grid__<group>.png`` when there are several groups)."""
    with_base = [(k, g) for k, g in groups(paired) if baseline_mask(g, baseline).any()]
    if "path" not in paired.columns:
        return []
    out = Path(out)
    paths = []
    for key, g in with_base:
        name = "image_grid" + (f"__{slug('_'.join(str(k) for k in key))}" if len(with_base) > 1 else "")
        title = " · ".join(str(k) for k in key if not is_missing(k) and str(k))
        paths.append(image_grid(g, out / f"{name}.png", baseline=baseline, n_rows=n_rows, diff=diff,
                                title=f"Qualitative comparison{(' · ' + title) if title else ''}", **kw))
    return paths


def grids_for_wandb(paired, out: str | Path, baseline: str = "baseline", **kw) -> dict[str, Path]:
    """Write the grids (:func:`write_image_grids`) and key them for W&B:
    ``{"qualitative/<file stem>": path}``; log each with ``wandb.Image(str(path))``."""
    return {f"qualitative/{p.stem}": p for p in write_image_grids(paired, out, baseline=baseline, **kw)}

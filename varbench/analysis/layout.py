"""Where aggregated results go: one folder per (model, resolution) of the records.

::

    results/<experiment>/<group>/      table.md, table.tex, table.csv, tidy.csv, figures (PNG),
                                       image_grid*.png, .figures.json     (one per model and resolution)
    results/<experiment>/tidy.csv      every record, all groups (one ``pd.read_csv`` for pandas users)
    results/<experiment>/.groups.json  the group folders the last aggregation wrote
    results/<experiment>/report.html   the report of all groups (varbench.analysis.html_report)

``<group>`` is :func:`group_dir_name` (``toy-64px``, ``infinity_2b-1024px``, ``tiny-512x640px``):
runs of different models or resolutions never write into one folder, so none overwrites or renames
another's files, and a figure's name inside a group folder does not depend on what else the
experiment holds.

Nothing stale is left looking current (:func:`clear_stale`): a group folder that the last
aggregation wrote but whose records are gone loses the files varbench wrote there (files you added
stay, and so does the folder then), and a folder written in the old flat layout (``table.md``
directly in ``results/<experiment>/``) loses its flat tables and the figures its ``.figures.json``
listed (or that carry varbench's figure names): they are regenerated, per group, from the store.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable

from varbench.analysis.groups import slug
from varbench.core.errors import FixableError

#: the columns that split a frame into result folders
SPLIT_KEYS: tuple[str, ...] = ("model", "resolution")
#: the index of group folders in ``results/<experiment>/``
GROUPS_MANIFEST = ".groups.json"
#: what aggregation writes into each group folder besides the figures (those are in its .figures.json)
GROUP_FILES: tuple[str, ...] = ("table.md", "table.tex", "table.csv", "tidy.csv")
#: the tables of the old flat layout (directly in results/<experiment>/); tidy.csv stays there, current
FLAT_TABLES: tuple[str, ...] = ("table.md", "table.tex", "table.csv")
#: the names varbench gave its figures in the flat layout (a folder aggregated with W&B listed no grid)
FLAT_FIGURE = re.compile(r"^(speed_vs_|keep_|entropy_vs_scale_|image_grid).*\.png$")


class LayoutError(FixableError, ValueError):
    """Two (model, resolution) groups would share one folder name."""


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def resolution_name(resolution) -> str:
    """``64px`` for a square resolution (``64``, ``"64x64"``, ``[64, 64]``), ``512x640px`` otherwise;
    ``res_unknown`` when the record has none."""
    if _missing(resolution) or resolution == "":
        return "res_unknown"
    if isinstance(resolution, (list, tuple)) and len(resolution) == 2:
        resolution = f"{resolution[0]}x{resolution[1]}"
    text = str(resolution).strip()
    m = re.fullmatch(r"(\d+)\s*[xX×]\s*(\d+)", text)
    if m:
        a, b = m.groups()
        text = a if a == b else f"{a}x{b}"
    if isinstance(resolution, float) and resolution.is_integer():
        text = str(int(resolution))
    text = slug(text)
    return text if text.endswith("px") else f"{text}px"


def group_dir_name(model, resolution) -> str:
    """The folder name of a (model, resolution) group: ``toy-64px``, ``infinity_2b-1024px``
    (file-name safe: anything but letters, digits and ``._=-`` becomes ``_``)."""
    name = "model_unknown" if _missing(model) or str(model) == "" else slug(str(model))
    return f"{name}-{resolution_name(resolution)}"


def split_groups(frame) -> dict[str, object]:
    """``{group_dir_name: sub-frame}`` of a tidy or paired frame by (model, resolution), sorted by
    name; rows keep their columns and order. A frame without those columns is one group named
    after what it has. Raises :class:`LayoutError` when two groups would share a name."""
    keys = [k for k in SPLIT_KEYS if k in frame.columns]
    if frame.empty:
        return {}
    if not keys:
        return {group_dir_name(None, None): frame}
    out: dict[str, object] = {}
    seen: dict[str, tuple] = {}
    for key, sub in frame.groupby(keys, dropna=False, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        values = dict(zip(keys, key))
        name = group_dir_name(values.get("model"), values.get("resolution"))
        if name in seen and seen[name] != key:
            raise LayoutError(f"(model, resolution) {seen[name]} and {key} would both be written to the results "
                              f"folder {name!r}; rename one model (model.name) so their names differ")
        seen[name] = key
        out[name] = sub
    return dict(sorted(out.items()))


def _safe_name(name) -> bool:
    """A plain file or folder name inside the results folder (never a path out of it)."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def _listed(manifest: Path) -> list[str]:
    try:
        names = json.loads(manifest.read_text()) if manifest.is_file() else []
    except (OSError, ValueError):
        return []
    if isinstance(names, dict):
        names = names.get("groups", [])
    return [n for n in names if _safe_name(n)] if isinstance(names, list) else []


def group_dirs(out: str | Path) -> list[Path]:
    """The group folders of a results folder, in order: those its ``.groups.json`` lists (that
    still exist), else every sub-folder holding a ``table.md`` (a folder copied without the index)."""
    out = Path(out)
    listed = [out / n for n in _listed(out / GROUPS_MANIFEST) if (out / n).is_dir()]
    if listed or (out / GROUPS_MANIFEST).is_file():
        return listed
    return sorted(p for p in out.iterdir() if p.is_dir() and (p / "table.md").is_file()) if out.is_dir() else []


def is_results_folder(path: str | Path) -> bool:
    """``path`` holds aggregated tables (either layout), not records."""
    path = Path(path)
    return (path / "table.md").is_file() or (path / GROUPS_MANIFEST).is_file() or bool(group_dirs(path))


def _figures_manifest() -> str:
    from varbench.analysis.plots import FIGURES_MANIFEST   # the figures' own index (plots keeps it current)

    return FIGURES_MANIFEST


def _remove(folder: Path, names: Iterable[str], removed: list[Path]) -> None:
    for name in sorted(set(names)):
        p = folder / name
        if _safe_name(name) and p.is_file():
            p.unlink()
            removed.append(p)


def clear_stale(out: str | Path, current: Iterable[str]) -> list[Path]:
    """Remove what varbench wrote into ``out`` that the groups ``current`` no longer hold (see the
    module docstring), then list ``current`` in ``out/.groups.json``; the paths removed.

    * the old flat layout: ``table.md``/``.tex``/``.csv`` directly in ``out``, the figures of
      ``out/.figures.json`` and files with varbench's figure names (only when the folder shows that
      layout: a flat table or figure index is there) and that index itself;
    * a group folder the previous index listed and ``current`` lacks: its tables, tidy.csv, the
      figures of its ``.figures.json`` and that index; the folder itself when nothing else is in it.
    """
    from varbench.core.jsonio import atomic_write_bytes

    out = Path(out)
    current = [str(c) for c in current]
    removed: list[Path] = []
    manifest = _figures_manifest()
    if any((out / n).is_file() for n in (*FLAT_TABLES, manifest)):
        figures = _listed(out / manifest) + [p.name for p in out.glob("*.png") if FLAT_FIGURE.match(p.name)]
        _remove(out, [*FLAT_TABLES, *figures], removed)
        if (out / manifest).is_file():
            (out / manifest).unlink()
            removed.append(out / manifest)
    for name in _listed(out / GROUPS_MANIFEST):
        folder = out / name
        if name in current or not folder.is_dir():
            continue
        _remove(folder, [*GROUP_FILES, *_listed(folder / manifest)], removed)
        if (folder / manifest).is_file():
            (folder / manifest).unlink()
            removed.append(folder / manifest)
        if not any(folder.iterdir()):
            folder.rmdir()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / GROUPS_MANIFEST, json.dumps({"groups": current}, indent=1).encode())
    return removed

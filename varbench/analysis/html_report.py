"""One self-contained HTML page of an experiment's results: ``results/<experiment>/report.html``.

Usage::

    from varbench.analysis.html_report import ReportGroup, write_html_report
    group = ReportGroup("toy-64px", Path("results/nova_sweep/toy-64px"), paired, notes=missing)
    write_html_report(Path("results/nova_sweep/report.html"), "nova_sweep", [group],
                      provenance={"store": "store/nova_sweep"})

The page opens in any browser from a copied folder, a mail attachment or an air-gapped node: the CSS
is inline, every figure is embedded as a base64 ``data:`` URI, nothing is fetched and no script runs.
The cost is size (the PNGs grow by a third in base64; an image grid is the bulk of it), which a
results folder affords.

Content: the title, when it was written and what it covers (experiments, records, entries, groups),
a table of contents, then per group (one model and resolution, ``varbench.analysis.layout``):

* the tables of ``table.md`` (:func:`varbench.analysis.tables.build_sections`, the same cells in the same
  order; wide tables scroll sideways instead of squeezing the page);
* the notes: the tables' footnotes (what ``±`` and the intervals mean, unreliable cells) and the
  group's own (failed jobs, unfinished entries);
* the figures the aggregate wrote into the group's folder: the PNGs listed in its
  ``.figures.json`` (:data:`varbench.analysis.plots.FIGURES_MANIFEST`), image grids first, scaled to
  the page width;
* the provenance of its records: what every record shares (code version, device, torch, dtype,
  seeds, weight files' sha256, prompt file, evaluator versions) once, and per record what differs.

All text is HTML-escaped: method labels and prompts are user input.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from varbench.analysis.groups import GROUP_KEYS
from varbench.analysis.plots import FIGURES_MANIFEST
from varbench.analysis.tables import Section, build_sections, footnotes, is_nan
from varbench.core.errors import FixableError
from varbench.core.jsonio import atomic_write_bytes
from varbench.harness.provenance import code_version
from varbench.harness.records import RunEntry


class ReportError(FixableError, ValueError):
    """The report cannot be written honestly (no group, a figure listed but missing)."""


@dataclass
class ReportGroup:
    """One (model, resolution) group of an experiment: its folder (tables and figures written by the
    aggregate), its paired frame (:func:`varbench.analysis.aggregate.pair_with_baseline`), extra notes
    (e.g. :func:`varbench.analysis.aggregate.incompleteness_notes`) and the baseline's method name."""
    name: str
    folder: Path
    paired: Any                      # pandas.DataFrame (pandas is imported lazily by the analysis layer)
    notes: list[str] = field(default_factory=list)
    baseline: str = "baseline"


# ------------------------------------------------------------------------------------------------
# rows in table order

def ordered_rows(paired, baseline: str = "baseline"):
    """The frame in ``table.md``'s row order: by model/resolution/benchmark/device, prompts, image
    count and the baseline each row pairs with, the baseline first, then by preset and label.

    The same sort as ``varbench.analysis.aggregate``'s table order (the aggregate imports this module,
    so importing it back would be a circle); ``tests/analysis/test_html_report.py`` checks the rows
    against ``table.md``."""
    group = [k for k in GROUP_KEYS if k in paired.columns]
    extra = [k for k in ("prompts_sha256", "n_images", "baseline_entry") if k in paired.columns]
    name = "method_preset" if "method_preset" in paired.columns else "method_label"
    keys = group + extra + ["_not_base", name] + (["method_label"] if "method_label" in paired.columns else [])
    out = (paired.assign(_not_base=(paired["method"] != baseline).astype(int))
           .sort_values(keys, kind="stable", na_position="last").drop(columns="_not_base").reset_index(drop=True))
    out.attrs = dict(paired.attrs)   # the records' metric directions (arrows in the headers)
    return out


# ------------------------------------------------------------------------------------------------
# small HTML pieces

def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _anchor(name: str, taken: set[str]) -> str:
    """An id for ``name`` that is unique on the page (two groups may share a display name)."""
    base = "g-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "group")
    anchor, i = base, 2
    while anchor in taken:
        anchor, i = f"{base}-{i}", i + 1
    taken.add(anchor)
    return anchor


def _n_left(header: Sequence[str]) -> int:
    """Text columns aligned left (method, and label when present), numbers right (as table.md)."""
    return 2 if len(header) > 1 and header[1] == "label" else 1


def section_html(sec: Section, level: int = 3) -> str:
    """One :class:`Section` (and its breakdown tables) as escaped HTML tables in a sideways scroller."""
    left = min(_n_left(sec.header), len(sec.header))

    def cls(i: int) -> str:
        return ' class="t"' if i < left else ""

    head = "".join(f"<th{cls(i)}>{_e(h)}</th>" for i, h in enumerate(sec.header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{_e(c)}</td>" for i, c in enumerate(row)) + "</tr>\n"
                   for row in sec.rows)
    parts = [f"<h{level} class=\"sec\">{_e(sec.title)}</h{level}>",
             f'<div class="scroll"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody></table></div>']
    parts += [section_html(sub, min(level + 1, 6)) for sub in sec.subtables]
    return "\n".join(parts)


def _kv_table(pairs: Sequence[tuple[str, Any]], cls: str = "kv") -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>\n" for k, v in pairs)
    return f'<div class="scroll"><table class="{cls}">\n<tbody>\n{rows}</tbody></table></div>'


def _flatten(tree: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``{"a": {"b": 1}}`` -> ``[("a.b", "1")]``; lists and scalars as compact text."""
    if isinstance(tree, Mapping) and tree:
        return [kv for k, v in tree.items() for kv in _flatten(v, f"{prefix}{k}.")]
    if isinstance(tree, (list, tuple)):
        tree = ", ".join(str(x) for x in tree)
    return [(prefix[:-1] or "value", "—" if tree is None else str(tree))]


# ------------------------------------------------------------------------------------------------
# figures

#: figure kinds in page order (file-name prefix, heading); anything else comes last under "More figures"
FIGURE_KINDS: tuple[tuple[str, str], ...] = (
    ("image_grid", "Image grid"), ("speed_vs_", "Speed-up vs quality"), ("keep_", "Kept tokens per scale"),
    ("entropy_vs_scale", "Entropy per scale"))
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}
_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff", "image/webp": b"RIFF"}


def figure_names(folder: Path) -> list[str]:
    """The figures listed in ``folder/.figures.json`` (the manifest ``write_figures`` keeps), in page
    order; ``[]`` when the folder has no manifest (the aggregate ran with ``--no-figures``)."""
    manifest = Path(folder) / FIGURES_MANIFEST
    if not manifest.is_file():
        return []
    try:
        names = json.loads(manifest.read_text())
    except (OSError, ValueError) as err:
        raise ReportError(f"{manifest} does not parse ({err}); rerun the aggregate "
                          "(python -m varbench.aggregate STORE/EXPERIMENT), which rewrites it") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ReportError(f"{manifest} is not a list of file names; rerun the aggregate, which rewrites it")

    def rank(name: str) -> tuple[int, str]:
        return next((i for i, (p, _) in enumerate(FIGURE_KINDS) if name.startswith(p)), len(FIGURE_KINDS)), name

    return sorted(names, key=rank)


def data_uri(path: Path) -> str:
    """``data:image/png;base64,...`` of an image file, refusing a file that is not the image its
    suffix says (a half-written or foreign file would show as a broken image)."""
    mime = _MIME.get(path.suffix.lower())
    if mime is None:
        raise ReportError(f"{path} is not an image the report embeds ({', '.join(_MIME)}); remove it from "
                          f"{FIGURES_MANIFEST} or rerun the aggregate")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ReportError(f"figure {path} is listed in {path.parent / FIGURES_MANIFEST} but cannot be read "
                          f"({err.strerror or err}); rerun the aggregate, which redraws its figures") from None
    if not data.startswith(_MAGIC[mime]):
        raise ReportError(f"figure {path} is not a {mime} file (truncated or overwritten?); rerun the aggregate")
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def figures_html(folder: Path) -> str:
    names = figure_names(folder)
    if not names:
        return '<p class="muted">No figures in this group\'s folder (the aggregate ran without figures).</p>'
    out, heading = [], None
    for name in names:
        kind = next((h for p, h in FIGURE_KINDS if name.startswith(p)), "More figures")
        if kind != heading:
            out.append(f"<h4>{_e(kind)}</h4>")
            heading = kind
        out.append(f'<figure><img src="{data_uri(Path(folder) / name)}" alt="{_e(name)}">'
                   f"<figcaption>{_e(name)}</figcaption></figure>")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# provenance

def _short(h: Any, n: int = 12) -> str:
    return f"{h[:n]}…" if isinstance(h, str) and len(h) > n else ("—" if h is None else str(h))


_VERSIONISH = re.compile(r"^v?\d+(\.\d+)+")


def _evaluator_versions(rec: Mapping, row: Mapping) -> str:
    """``fidelity 1a2b3c4d (torchmetrics 1.9.0)``: each evaluator's version_info hash (what pairing
    compares) and the package versions it names."""
    parts = []
    for ev, info in sorted((rec.get("evaluators") or {}).items()):
        h = row.get(f"version/{ev}")
        named = []
        if isinstance(info, Mapping):
            named = [f"{k} {v}" for k, v in info.items() if isinstance(v, str) and _VERSIONISH.match(v)]
        parts.append(f"{ev} {_short(h, 8) if not is_nan(h) else ''}".strip()
                     + (f" ({', '.join(named)})" if named else ""))
    return "; ".join(parts) or "—"


def record_facts(row: Mapping, rec: Mapping | None) -> dict[str, str]:
    """What produced one record, as text: from the frame row, and from its record when readable."""
    rec = rec or {}
    prov = rec.get("provenance") if isinstance(rec.get("provenance"), Mapping) else {}
    torch = prov.get("torch") if isinstance(prov.get("torch"), Mapping) else {}
    packages = prov.get("packages") if isinstance(prov.get("packages"), Mapping) else {}
    model = rec.get("model") if isinstance(rec.get("model"), Mapping) else {}
    bench = rec.get("benchmark") if isinstance(rec.get("benchmark"), Mapping) else {}
    timing = rec.get("timing") if isinstance(rec.get("timing"), Mapping) else {}
    weights = model.get("weights") if isinstance(model.get("weights"), Mapping) else None

    def val(v: Any) -> str:
        return "—" if is_nan(v) else str(v)

    facts = {
        "code version": code_version(row) if "git_sha" in row else code_version(rec),
        "varbench": val(packages.get("varbench")),
        "device": val(row.get("device")),
        "torch": val(torch.get("version") or packages.get("torch")),
        "python": val(prov.get("python")),
        "dtype": val(row.get("dtype")),
        "model": f"{val(row.get('model'))} {val(row.get('resolution'))}",
        "weights sha256": ("; ".join(f"{n} {_short(h)}" for n, h in sorted(weights.items())) or "no weight files"
                           if weights is not None else "—"),
        "prompt file": f"{val(row.get('benchmark'))} sha256 {_short(row.get('benchmark_sha256'))}",
        # the record's seed block (base and rule) reads better than the frame's compacted hash of it
        "seeds": ("; ".join(f"{k} {v}" for k, v in _flatten(bench["seeds"])) if isinstance(bench.get("seeds"), Mapping)
                  else val(row.get("seeds"))),
        "evaluators": _evaluator_versions(rec, row) if rec else val(row.get("evaluator_versions")),
    }
    if timing:
        facts["timing"] = f"warmup {timing.get('warmup')}, repeats {timing.get('repeats')}"
    if not rec:
        facts["record"] = "not readable (no entry folder): facts from the table only"
    return facts


def _read_record(row: Mapping) -> Mapping | None:
    path = row.get("path")
    if not isinstance(path, str) or not path:
        return None
    try:
        return RunEntry.from_dir(path).read(verify=False)   # sealing is the aggregate's job, not the page's
    except (OSError, ValueError):
        return None


def provenance_html(table) -> str:
    """The facts every record of the group shares (once), then per record the ones that differ."""
    rows = [r for _, r in table.iterrows()]
    facts = [record_facts(r, _read_record(r)) for r in rows]
    keys = list(dict.fromkeys(k for f in facts for k in f))
    shared = [k for k in keys if len({f.get(k, "—") for f in facts}) == 1]
    differ = [k for k in keys if k not in shared]
    out = [f"<p>Shared by all {len(rows)} record{'s' if len(rows) != 1 else ''}:</p>",
           _kv_table([(k, facts[0].get(k, "—")) for k in shared])]
    header = ["method", "label", "entry", "created", *differ]
    body = []
    for r, f in zip(rows, facts):
        preset = r.get("method_preset") if not is_nan(r.get("method_preset")) else r.get("method")
        cells = [preset, r.get("method_label"), r.get("entry_id"), r.get("created"), *(f.get(k, "—") for k in differ)]
        body.append("<tr>" + "".join(f"<td class=\"t\">{_e('—' if is_nan(c) else c)}</td>" for c in cells) + "</tr>")
    out.append("<p>Per record" + (f" (what differs: {_e(', '.join(differ))})" if differ else "") + ":</p>")
    out.append('<div class="scroll"><table><thead><tr>' + "".join(f'<th class="t">{_e(h)}</th>' for h in header)
               + "</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table></div>")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# the page

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1b1f24;
 margin:0 auto;padding:1.2em 2em 4em;max-width:1600px;background:#fff}
h1{font-size:1.6em;margin:.2em 0 .3em} h2{font-size:1.3em;margin-top:2.2em;border-bottom:2px solid #d0d7de;
 padding-bottom:.2em} h3{font-size:1.05em;margin:1.4em 0 .4em} h4{font-size:.98em;margin:1.2em 0 .4em}
.meta{color:#57606a;margin:.2em 0} .muted{color:#6e7781}
.scroll{overflow-x:auto;width:fit-content;max-width:100%;margin:.3em 0 .8em;border:1px solid #d0d7de;border-radius:4px}
table{border-collapse:collapse;font-size:12.5px;font-variant-numeric:tabular-nums}
th,td{padding:4px 9px;border-bottom:1px solid #e6e9ec;text-align:right;white-space:nowrap;vertical-align:top}
th{background:#f3f5f7;font-weight:600} th.t,td.t{text-align:left}
tbody tr:nth-child(even){background:#fafbfc}
table.kv th{text-align:left;width:12em} table.kv td{text-align:left;white-space:normal;word-break:break-word}
ol.notes{font-size:13px;max-width:110em} ol.notes li{margin:.25em 0}
figure{margin:1em 0 1.6em} figure img{display:block;max-width:100%;height:auto;border:1px solid #e6e9ec}
figcaption{color:#57606a;font-size:12px;margin-top:.2em}
nav ul{margin:.3em 0} nav li{margin:.15em 0}
a{color:#0969da}
"""


def _when_what(groups: Sequence[ReportGroup]) -> list[str]:
    frames = [g.paired for g in groups]
    n_rec = sum(len(f) for f in frames)
    ids = {str(v) for f in frames if "entry_id" in f.columns for v in f["entry_id"] if not is_nan(v)}
    exps = sorted({str(v) for f in frames if "experiment" in f.columns for v in f["experiment"] if not is_nan(v)})
    created = sorted(str(v) for f in frames if "created" in f.columns for v in f["created"] if not is_nan(v))
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"Written {now} · experiment{'s' if len(exps) != 1 else ''}: {', '.join(exps) or '—'} · "
             f"{n_rec} record{'s' if n_rec != 1 else ''} in {len(ids)} entr{'y' if len(ids) == 1 else 'ies'} · "
             f"{len(groups)} group{'s' if len(groups) != 1 else ''}"]
    if created:
        lines.append(f"Records created {created[0]} … {created[-1]}")
    return lines


def _data_links(folder: Path, page_dir: Path) -> str:
    """Relative links to the group's files next to the page (they open when the folder travels whole)."""
    links = []
    for name in ("table.md", "table.csv", "tidy.csv", "table.tex"):
        if (Path(folder) / name).is_file():
            rel = os.path.relpath(Path(folder) / name, page_dir).replace(os.sep, "/")
            links.append(f'<a href="{_e(rel)}">{_e(name)}</a>')
    return f'<p class="meta">Files: {" · ".join(links)}</p>' if links else ""


def group_html(group: ReportGroup, anchor: str, page_dir: Path) -> str:
    table = ordered_rows(group.paired, group.baseline)
    sections = build_sections(table, group.baseline)
    notes = footnotes(table, group.baseline) + [str(n) for n in group.notes]
    parts = [f'<section id="{anchor}">', f"<h2>{_e(group.name)}</h2>", _data_links(group.folder, page_dir),
             "<h3>Tables</h3>"]
    parts += [section_html(s, level=4) for s in sections]
    if notes:
        parts.append("<h3>Notes</h3>")
        parts.append('<ol class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ol>")
    parts.append("<h3>Figures</h3>")
    parts.append(figures_html(group.folder))
    parts.append("<h3>Provenance</h3>")
    parts.append(provenance_html(table))
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def render_html(title: str, groups: Sequence[ReportGroup], provenance: Mapping | None = None,
                page_dir: Path = Path(".")) -> str:
    """The page as a string (see the module docstring); ``page_dir``: where it will be written, for
    the relative links to each group's files."""
    if not groups:
        raise ReportError("no group to report: the report needs at least one (model, resolution) group of "
                          "finished records; run the sweep (or the aggregate) first")
    taken: set[str] = set()
    anchors = [_anchor(g.name, taken) for g in groups]
    toc = "".join(f'<li><a href="#{a}">{_e(g.name)}</a> <span class="muted">({len(g.paired)} record'
                  f"{'s' if len(g.paired) != 1 else ''})</span></li>" for g, a in zip(groups, anchors))
    head = [f"<h1>{_e(title)}</h1>"] + [f'<p class="meta">{_e(line)}</p>' for line in _when_what(groups)]
    if provenance:
        head += ["<h3>Run</h3>", _kv_table(_flatten(provenance))]
    head.append(f"<nav><h3>Contents</h3><ul>{toc}</ul></nav>")
    body = "\n".join(head + [group_html(g, a, page_dir) for g, a in zip(groups, anchors)])
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def write_html_report(path: Path, title: str, groups: Sequence[ReportGroup],
                      provenance: Mapping | None = None) -> Path:
    """Write the self-contained report (``results/<experiment>/report.html``) atomically: a crash
    leaves the previous page whole. ``provenance``: run-level facts shown at the top (e.g. the store
    path, the command), flattened to ``key.sub: value`` rows. Returns ``path``."""
    path = Path(path)
    page = render_html(title, groups, provenance, page_dir=path.parent)
    atomic_write_bytes(path, page.encode("utf-8"))
    return path

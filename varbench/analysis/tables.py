"""Paper tables from a paired frame (:func:`varbench.analysis.aggregate.pair_with_baseline`): markdown
(``table.md``) and LaTeX (``table.tex``), built from one list of :class:`Section` so both say the same.

One section per baseline: a row appears under the baseline it was paired with, so rows that
differ in prompts, limits, seeds, sampling settings or device never share a section (a row kept
without a baseline, ``--allow-unpaired``, gets a section of its own settings). The title names
the model (marked ``[random weights]``), resolution, benchmark with its prompt count, images per
prompt and selection (marked when the prompt file's sha256 is not the official one), the device
(marked when its label names no CPU model) and the baseline entry.

Columns: ``method``, the row's one name (:func:`varbench.analysis.names.display_name`): the
preset chosen (``nova_fast``; the policy name alone would merge variants), or its label where the
label says more (``NOVA (small-schedule thresholds)``, knob values such as ``ssim 0.84``); the notes
name rows the same way, and ``table.csv``/``tidy.csv`` keep ``method_preset`` and ``method_label``
both; then ``n`` (images scored / timed prompts × repeats per prompt), ``AR ms per prompt``
(the row's own AR loop: median over timed prompts, [p10, p90] over them), the paired speed-ups
(AR loop and end to end) with their intervals, ``FLOPs × (transformer)`` (the transformer's count
alone, what methods change) and ``FLOPs × (end to end)`` (with the text encoder and the VAE decode
every method still pays; ``–`` for records without that count), ``KV (GB) @<resolution>`` (the KV
cache one generate call allocates at the record's batch, per image; :func:`kv_header`), ``peak (GB)``
(the measured peak of that call, of the kind the footnote names) and ``memory ×`` (baseline KV /
method KV, allocated; ``–`` for records without a ``memory`` block), then per metric its value
``± err`` and ``Δ`` against the baseline (absent for metrics that already compare with the
baseline's image, and ``—`` on the baseline's own row). An evaluator with an ``overall`` metric
shows only that; GenEval-style evaluators get a per-tag breakdown table (six tags + overall).
A method that changed no image (record ``method.effect == "none"``, varbench/engine/effect.py) has
``(no effect)`` after its name and a footnote with the reason; one that left only some images
unchanged, ``(no effect on k/n)``. Footnotes state what ``±`` and the intervals are, which cells
are unreliable and why, which rows do the baseline's exact work, and which evaluator parts were skipped. The ratio of separately
timed jobs (``speedup``) is in ``table.csv``/``tidy.csv`` only: it drifts with the machine.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from varbench.analysis.frame import frame_directions, higher_is_better, metric_columns
from varbench.analysis.names import display_name
from varbench.harness.provenance import code_version

#: GenEval's tags in the order the paper's tables print them, with their column names
GENEVAL_TAGS: tuple[tuple[str, str], ...] = (
    ("single_object", "Single obj."), ("two_object", "Two obj."), ("counting", "Counting"),
    ("colors", "Colors"), ("position", "Position"), ("color_attr", "Color attr."), ("overall", "Overall"))

#: DPG-Bench's level-1 categories in the order ELLA's paper tables print them, with their column names
DPG_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("global", "Global"), ("entity", "Entity"), ("attribute", "Attribute"), ("relation", "Relation"),
    ("other", "Other"), ("overall", "Overall"))

#: readable names of evaluators and metrics (with units where known)
EVALUATOR_NAMES = {"geneval": "GenEval", "toy_geneval": "toy GenEval", "hpsv2": "HPSv2", "imagereward": "ImageReward",
                   "fidelity": "", "dpgbench": "DPG-Bench", "dpgbench_tiny": "DPG-Bench (tiny mPLUG)", "fid": "FID",
                   "clipscore": "CLIP score", "mjhq_fid": "MJHQ-30K FID"}
METRIC_NAMES = {"psnr": "PSNR (dB)", "ssim": "SSIM", "lpips": "LPIPS", "overall": "overall", "score": "score"}
#: metrics whose header carries an arrow (↑ higher is better, ↓ lower; :func:`varbench.analysis.frame.higher_is_better`):
#: their scale alone does not say which way is better
ARROWED = ("psnr", "ssim", "lpips")
#: digits per metric (PSNR in dB needs fewer)
METRIC_DIGITS = {"psnr": 2}

DAGGER, DDAGGER, DASH = "†", "‡", "—"
NO_EFFECT = "(no effect)"   # the method changed nothing: its row is not a result (footnoted with the reason)


@dataclass
class Section:
    """One table: a title, a header and rows of cell strings (unicode; LaTeX converts them)."""
    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    subtables: list["Section"] = field(default_factory=list)


def is_nan(v: Any) -> bool:
    """None, or a number that is NaN (strings are values); the tables' and the report's missing cell."""
    if v is None:
        return True
    try:
        return not isinstance(v, str) and math.isnan(float(v))
    except (TypeError, ValueError):
        return False


def _flag(v: Any) -> bool | None:
    """A boolean column read back from CSV or a frame (None/NaN -> None)."""
    if is_nan(v):
        return None
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    return bool(v)


def metric_header(metric: str, recorded: dict | None = None) -> str:
    """``toy_geneval/overall`` -> ``toy GenEval overall``; ``fidelity/psnr`` -> ``PSNR (dB) ↑``
    (``recorded``: the records' metric directions, ``frame.attrs["higher_is_better"]``)."""
    ev, _, m = metric.partition("/")
    name = EVALUATOR_NAMES.get(ev, ev.replace("_", " "))
    part = METRIC_NAMES.get(m, m.replace("_", " "))
    if m in ARROWED:
        part += " ↑" if higher_is_better(metric, recorded) else " ↓"
    return f"{name} {part}".strip()


def _num(v: Any, digits: int = 4) -> str:
    if is_nan(v):
        return "–"
    v = float(v)
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    return f"{v:.{digits}f}"


def speed_cell(med: Any, lo: Any, hi: Any, reliable: Any, n: Any) -> str:
    """``1.52× [1.48, 1.57]``; ``†`` appended when unreliable; ``n/a`` interval for one repeat."""
    if is_nan(med):
        return "–"
    cell = f"{float(med):.2f}×"
    if not is_nan(n) and int(n) <= 1:
        cell += " [n/a]"
    elif not (is_nan(lo) or is_nan(hi)):
        cell += f" [{float(lo):.2f}, {float(hi):.2f}]"
    if _flag(reliable) is False:
        cell += f" {DAGGER}"
    return cell


def value_cell(value: Any, err: Any, n_images: Any, digits: int = 4, identical: bool = False) -> str:
    """``0.9917 ± 0.0083``; ``± n/a`` for one image; ``∞`` for identical images' PSNR."""
    if identical:
        return "∞"
    cell = _num(value, digits)
    if cell == "–":
        return cell
    if not is_nan(n_images) and int(n_images) <= 1:
        return cell + " ± n/a"
    if not is_nan(err):
        cell += f" ± {float(err):.{digits}f}"
    return cell


def _is_base(row, baseline: str) -> bool:
    return str(row.get("method")) == baseline or _flag(row.get("is_baseline")) is True


def same_work(row) -> bool:
    """The row executed the baseline's work: FLOPs ratio 1 and every image bit-identical."""
    fx = row.get("flops_x")
    return (_flag(row.get("identical_images")) is True and not is_nan(fx) and abs(float(fx) - 1.0) < 1e-9)


def effect_mark(row) -> str:
    """`` (no effect)`` when the method changed no image (record ``method.effect``, see
    varbench/engine/effect.py), `` (no effect on k/n)`` when it changed only some; else empty."""
    effect = row.get("method_effect")
    if effect == "none":
        return f" {NO_EFFECT}"
    if effect == "partial":
        k, n = row.get("unchanged_images"), row.get("n_images")
        return f" ({NO_EFFECT[1:-1]} on {'?' if is_nan(k) else int(k)}/{'?' if is_nan(n) else int(n)})"
    return ""


def _effect_reason(row) -> str:
    """``<preset>: <reason>``, the preset named once (a policy's reason starts with its own name)."""
    name, reason = _preset(row), str(row.get("method_effect_reason"))
    return reason if reason.startswith(f"{name}:") else f"{name}: {reason}"


def _preset(row) -> str:
    """The row's one name (:func:`varbench.analysis.names.display_name`): its cell in the method
    column, and how the notes name it."""
    return display_name(row)


def _section_key(row) -> tuple:
    base = row.get("baseline_entry")
    if not is_nan(base):
        return ("baseline", str(base))
    return ("unpaired",) + tuple(str(row.get(k)) for k in ("model", "resolution", "benchmark", "prompts_sha256",
                                                             "n_images", "device", "pair_key"))


#: title marks for what a reader would otherwise assume
RANDOM_WEIGHTS = "random weights"
MODIFIED_PROMPTS = "prompt file modified: sha256 ≠ official"
NO_CPU_MODEL = "CPU model not recorded"


def _title(row, key: tuple, rows: Sequence = ()) -> str:
    rows = list(rows) or [row]
    bench = str(row.get("benchmark"))
    n_p, spp, sel = row.get("n_prompts"), row.get("samples_per_prompt"), row.get("prompt_selection")
    if any(_flag(r.get("benchmark_sha256_matches")) is False for r in rows):
        bench += f" [{MODIFIED_PROMPTS}]"
    if not is_nan(n_p) and not is_nan(spp):
        bench += f" ({int(n_p)} prompts × {int(spp)} images"
        bench += f", {sel})" if isinstance(sel, str) and sel not in ("", "{}") else ")"
    model = str(row.get("model")) + (f" [{RANDOM_WEIGHTS}]" if any(_flag(r.get("random_weights")) for r in rows) else "")
    device = str(row.get("device")) + (f" [{NO_CPU_MODEL}]" if any(_flag(r.get("device_known")) is False for r in rows) else "")
    where = (f"baseline entry {key[1]}" if key[0] == "baseline" else "no baseline (kept unpaired)")
    return " · ".join([f"model={model}", str(row.get("resolution")), f"benchmark={bench}",
                       f"device={device}", where])


#: the memory columns of the main table (the KV column's label gets the section's resolution)
KV_HEADER, PEAK_HEADER, MEMORY_X_HEADER = "KV (GB)", "peak (GB)", "memory ×"
#: what the peak kinds measure, as the footnote says it (varbench/engine/memory.py)
PEAK_KINDS = {"cuda_max_memory_allocated": "CUDA max_memory_allocated (weights, KV cache, activations, graph pool)",
              "cpu_rss_hwm": "the CPU process's resident-set high-water mark over the call (VmHWM: also the text "
                             "encoder, the VAE, Python and torch's pages)",
              "cpu_ru_maxrss": "the CPU process's peak RSS since it started (ru_maxrss: VmHWM could not be reset)",
              "mixed": "mixed kinds over the record's images"}


def kv_header(resolution: Any) -> str:
    """``KV (GB) @1024²`` for a square ``1024x1024`` resolution, ``KV (GB) @1024×768`` otherwise,
    ``KV (GB)`` when the row has none."""
    res = "" if is_nan(resolution) else str(resolution)
    h, _, w = res.partition("x")
    if not res:
        return KV_HEADER
    return f"{KV_HEADER} @{h}²" if h == w else f"{KV_HEADER} @{h}×{w}"


def gb_cell(v: Any) -> str:
    """GiB with 3 significant digits (41.1, 5.14, 0.00375: the toy's cache is megabytes); ``–`` for none."""
    if is_nan(v):
        return "–"
    v = float(v)
    return f"{v:.3g}" if v == 0 or v >= 1e-3 else f"{v:.2e}"


def timed_cell(n_images: Any, n_prompts: Any, repeats: Any, n_repeats: Any) -> str:
    """``480 / 16×3``: images scored / timed prompts × repeats per prompt (older records: the
    repeats of their one prompt, ``480 / 1×9``)."""
    img = "–" if is_nan(n_images) else str(int(n_images))
    if is_nan(n_prompts) and is_nan(n_repeats):
        return f"{img} / –"
    n_p = 1 if is_nan(n_prompts) else int(n_prompts)
    per = int(n_repeats) // n_p if not is_nan(n_repeats) else (int(repeats) if not is_nan(repeats) else None)
    return f"{img} / {n_p}×{'–' if per is None else per}"


def ar_cell(row) -> str:
    """The row's own AR-loop ms at batch 1: median over the timed prompts of each prompt's median
    repeat, ``[p10, p90]`` over prompts when several were timed; ``†`` when its repeats spread."""
    cell = _num(row.get("ar_ms"), 1)
    n_p = row.get("n_prompts_timed")
    if cell != "–" and not is_nan(n_p) and int(n_p) > 1 and not (is_nan(row.get("ar_ms_p10")) or is_nan(row.get("ar_ms_p90"))):
        cell += f" [{float(row.get('ar_ms_p10')):.1f}, {float(row.get('ar_ms_p90')):.1f}]"
    return cell + (f" {DAGGER}" if _flag(row.get("ar_ms_reliable")) is False else "")


def table_metrics(frame) -> list[str]:
    """The quality columns of the main table: no counts (``n_*``); an evaluator with an
    ``overall`` shows only that (its parts go to the breakdown and ``table.csv``)."""
    metrics = [c for c in metric_columns(frame) if not c.rsplit("/", 1)[-1].startswith("n_")]
    with_overall = {m.split("/", 1)[0] for m in metrics if m.endswith("/overall")}
    return [m for m in metrics if m.split("/", 1)[0] not in with_overall or m.endswith("/overall")]


def geneval_evaluators(frame) -> list[str]:
    """Evaluators with GenEval's tags and an overall (``geneval``, ``toy_geneval``, ...)."""
    cols = set(frame.columns)
    evs = sorted({c.split("/", 1)[0] for c in metric_columns(frame)})
    return [ev for ev in evs if all(f"{ev}/{tag}" in cols for tag, _ in GENEVAL_TAGS)]


def dpg_evaluators(frame) -> list[str]:
    """Evaluators with DPG-Bench's overall and its dropped-image count (``dpgbench``, ``dpgbench_tiny``, ...)."""
    cols = set(frame.columns)
    evs = sorted({c.split("/", 1)[0] for c in metric_columns(frame)})
    return [ev for ev in evs if f"{ev}/overall" in cols and f"{ev}/n_failed" in cols]


def _dpg_cell(r, ev: str, cat: str) -> str:
    """``value ± err (n)``: a category's score x 100, its bootstrap ± over prompts, and the questions (the
    overall: prompts) it averages."""
    v = r.get(f"{ev}/{cat}")
    if is_nan(v):
        return "–"
    err, n = r.get(f"{ev}/{cat}_err"), r.get(f"{ev}/n_{'prompts' if cat == 'overall' else cat}")
    cell = f"{float(v):.2f}" + ("" if is_nan(err) else f" ± {float(err):.2f}")
    return cell + ("" if is_nan(n) else f" (n={int(n)})")


def build_sections(table, baseline: str = "baseline") -> list[Section]:
    """Sections (one per baseline) of the formatted table from the ordered wide/paired frame."""
    metrics = table_metrics(table)
    geneval = geneval_evaluators(table)
    dpg = dpg_evaluators(table)
    header = ["method", "n (images / timed prompts×repeats)", "AR ms per prompt [p10, p90]", "paired speed-up AR [CI]",
              "paired speed-up e2e [CI]", "FLOPs × (transformer)", "FLOPs × (end to end)", KV_HEADER, PEAK_HEADER,
              MEMORY_X_HEADER]
    kv_col = header.index(KV_HEADER)
    recorded = frame_directions(table)
    for m in metrics:
        header += [metric_header(m, recorded)] + ([f"Δ {metric_header(m, recorded)}"] if f"{m}_delta" in table.columns else [])
    groups: dict[tuple, list] = {}
    for _, r in table.iterrows():
        groups.setdefault(_section_key(r), []).append(r)
    sections = []
    for key, rows in groups.items():
        sec = Section(_title(rows[0], key, rows), header[:kv_col] + [kv_header(rows[0].get("resolution"))] + header[kv_col + 1:])
        breakdowns = {ev: Section(f"{EVALUATOR_NAMES.get(ev, ev)} by tag", ["method"] + [h for _, h in GENEVAL_TAGS])
                      for ev in geneval}
        breakdowns.update({f"dpg:{ev}": Section(f"{EVALUATOR_NAMES.get(ev, ev)} by category (DPG-Bench, x 100, ± over "
                                                 f"prompts, n = questions; overall: n = prompts)",
                                                 ["method"] + [h for _, h in DPG_CATEGORIES]) for ev in dpg})
        names = [_preset(r) for r in rows]
        for r in rows:
            is_base = _is_base(r, baseline)
            name = _preset(r)
            if names.count(name) > 1:       # same preset twice (other knobs): never one label for both
                name += f" [{str(r.get('entry_id'))[:8]}]"
            if not is_base and same_work(r):
                name += f" {DDAGGER}"
            if not is_base:
                name += effect_mark(r)
            n_img, n_rep = r.get("n_images"), r.get("n_repeats")
            n = timed_cell(n_img, r.get("n_prompts_timed"), r.get("repeats_per_prompt"), n_rep)
            if is_base:
                speeds = ["1 (reference)", "1 (reference)"]
            else:
                speeds = [speed_cell(r.get("paired_speedup"), r.get("paired_speedup_ci_low"),
                                     r.get("paired_speedup_ci_high"), r.get("speedup_reliable"), n_rep),
                          speed_cell(r.get("paired_e2e_speedup"), r.get("paired_e2e_speedup_ci_low"),
                                     r.get("paired_e2e_speedup_ci_high"), r.get("speedup_reliable"), n_rep)]
            fx, fx_e2e = r.get("flops_x"), r.get("flops_x_e2e")
            ar = ar_cell(r)
            mx = r.get("memory_x")
            cells = [name, n, ar, *speeds,
                     *("–" if is_nan(v) else f"{float(v):.2f}×" for v in (fx, fx_e2e)),
                     gb_cell(r.get("kv_gb")), gb_cell(r.get("peak_gb")), "–" if is_nan(mx) else f"{float(mx):.2f}×"]
            for m in metrics:
                short = m.rsplit("/", 1)[-1]
                digits = METRIC_DIGITS.get(short, 4)
                ident = m == "fidelity/psnr" and _flag(r.get("identical_images")) is True
                cells.append(value_cell(r.get(m), r.get(f"{m}_err"), n_img, digits, ident))
                if f"{m}_delta" in table.columns:
                    d = r.get(f"{m}_delta")
                    cells.append(DASH if is_base else ("–" if is_nan(d) else f"{float(d):+.{digits}f}"))
            sec.rows.append(cells)
            for ev, sub in breakdowns.items():
                if ev.startswith("dpg:"):
                    sub.rows.append([name] + [_dpg_cell(r, ev[4:], cat) for cat, _ in DPG_CATEGORIES])
                else:
                    sub.rows.append([name] + [_num(r.get(f"{ev}/{tag}"), 2) for tag, _ in GENEVAL_TAGS])
        sec.subtables = [s for s in breakdowns.values() if any(c != "–" for row in s.rows for c in row[1:])]
        sections.append(sec)
    return sections


_ABS_PATH = re.compile(r"(?<![\w.])(?:/[^\s/:;,()]+)+/([^\s/:;,()]+)")


def footnotes(table, baseline: str = "baseline") -> list[str]:
    """What the symbols mean, per-row reasons for unreliable cells, skipped evaluator parts."""
    orders = sorted({str(o).upper() for o in table.get("timing_order", []) if not is_nan(o)})
    kinds = {str(k) for k in table.get("paired_ci_kind", []) if not is_nan(k)}
    how = []
    if "bootstrap" in kinds:
        how.append("several timed prompts: sum over the prompts of the baseline's ms / sum of the method's "
                   "(each prompt's median repeat); [CI] = percentile bootstrap over the timed prompts at 95%")
    if "order_statistic" in kinds or not kinds:
        how.append("one timed prompt: median over repeats of baseline ms / method ms; [CI] = distribution-free "
                   "interval of that median from binomial order statistics, coverage ≥ 95% (attained per row: "
                   "paired_speedup_ci_level in tidy.csv), n/a with one repeat")
    notes = ["n = images scored / timed prompts × repeats per prompt (the same prompts and seeds for the "
             "method and its baseline; adaptive methods on more prompts than static ones). Paired speed-up: "
             "the baseline timed interleaved with the method in the method's own job"
             + (f" ({' or '.join(orders)} order)" if orders else "") + "; " + "; ".join(how) + ". "
             "The intervals cover prompt-to-prompt variation and repeat noise within one run on one machine, "
             "not another run or another machine of the same kind. AR ms per prompt = the row's own AR loop at "
             "batch 1, median over its timed prompts of each prompt's median repeat, [p10, p90] over those "
             "prompts: absolute, so it moves with the machine's load (compare rows through the paired "
             "speed-up). The ratio of separately timed jobs (unpaired, drifts with the machine) "
             "is in table.csv / tidy.csv only (speedup, e2e_speedup).",
             "± = the evaluator's standard error of the mean over images (bootstrap over prompts when a "
             "prompt has several images), not a confidence interval; n/a for one image. Δ = value − "
             "baseline value on the same prompts and seeds (no ±: the two errors are correlated); "
             "— on the baseline's own row."]
    notes.append("FLOPs × = baseline FLOPs / method FLOPs per image, analytic (a multiply-add = 2): "
                 "(transformer) counts the transformer alone; (end to end) adds the text encoder and the VAE "
                 "decode, which every method runs unchanged, so it is the smaller ratio.")
    rows = [r for _, r in table.iterrows()]
    notes += memory_notes(rows)
    bad = [r for r in rows if not _is_base(r, baseline) and _flag(r.get("speedup_reliable")) is False]
    if bad:
        by_reason: dict[str, list[str]] = {}
        for r in bad:
            by_reason.setdefault(str(r.get("unreliable_reason") or "unknown"), []).append(_preset(r))
        notes.append(f"{DAGGER} unreliable speed-up (read the interval, not the ratio): " + "; ".join(
            f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()) + ".")
    noisy = [r for r in rows if _flag(r.get("ar_ms_reliable")) is False]
    if noisy:
        notes.append(f"{DAGGER} on AR (ms): the job's own repeat times spread (p90 − p10 over the median) "
                     "more than timing.max_reference_spread, the machine's speed moved during its pass: "
                     + ", ".join(f"{_preset(r)} {float(r.get('ar_spread')):.0%}" for r in noisy)
                     + ". Paired speed-ups are unaffected when their own pass was steady.")
    unknown = [_preset(r) for r in rows if _flag(r.get("device_known")) is False]
    if unknown:
        notes.append(f"device [{NO_CPU_MODEL}]: {', '.join(unknown)} recorded no CPU model (a CPU row only its "
                     "architecture, a GPU row no driver or library versions), so rows from different machines of the "
                     "same kind cannot be told apart; re-run them to record the machine.")
    if any(_flag(r.get("random_weights")) for r in rows):
        notes.append(f"model [{RANDOM_WEIGHTS}]: quality columns mean nothing; speed-ups of methods whose decisions "
                     "read entropy or features (NOVA, ToProVAR, SkipVAR) follow the random model's decisions, not the trained one's.")
    if any(_flag(r.get("benchmark_sha256_matches")) is False for r in rows):
        notes.append(f"benchmark [{MODIFIED_PROMPTS}]: the prompt file is not the published one; scores are not "
                     "comparable with published numbers (record: benchmark.sha256 vs sha256_expected).")
    retimed = [f"{_preset(r)} ({int(r.get('timing_tries'))} passes)" for r in rows
               if not is_nan(r.get("timing_tries")) and int(r.get("timing_tries")) > 1]
    if retimed:
        notes.append("Re-timed after an unreliable pass (timing.retime_unreliable; the last pass is shown): "
                     + ", ".join(retimed) + ".")
    same = [_preset(r) for r in rows if not _is_base(r, baseline) and same_work(r)]
    if same:
        notes.append(f"{DDAGGER} executed work equals the baseline's (same FLOPs, bit-identical images): "
                     f"{', '.join(same)}; its speed-up should be 1.00× within the interval, any departure is "
                     "policy overhead (work FLOPs do not count) or noise.")
    for effect, what, so in (("none", "changed no image", "the row is the baseline's, not a result"),
                             ("partial", "left k of its n images unchanged", "those images are the baseline's")):
        hit = [r for r in rows if not _is_base(r, baseline) and r.get("method_effect") == effect]
        if hit:
            notes.append(f"{NO_EFFECT if effect == 'none' else '(no effect on k/n)'}: the method {what} (every plan "
                         f"it made for them was neutral, or the pixels equal the baseline's), so {so}: "
                         + "; ".join(_effect_reason(r) for r in hit) + ".")
    if "fidelity/psnr" in table.columns and any(_flag(r.get("identical_images")) is True for r in rows):
        notes.append("PSNR ∞: every image bit-identical to the baseline's (the evaluator's mean caps each "
                     "identical pair at 100 dB; table.csv keeps that capped mean).")
    skipped = sorted({s for r in rows for s in str(r.get("skipped_metrics") or "").split("; ")
                      if s and s != "nan"})
    for s in skipped:
        part = s.split(":", 1)[0]
        name = metric_header(part).replace(" ↑", "").replace(" ↓", "")   # the direction is no news here
        reason = _ABS_PATH.sub(r"\1", s.split(": ", 1)[-1])   # a file's name, not this machine's path to it
        notes.append(f"{name} not reported: {part} {reason}.")
    notes += code_version_notes(table)
    return notes


def memory_notes(rows: Sequence) -> list[str]:
    """What the memory columns count: one image's share of the KV cache at the records' batch, which peak
    kind(s) the table shows; nothing when no row has a ``memory`` block."""
    have = [r for r in rows if not is_nan(r.get("kv_gb")) or not is_nan(r.get("peak_gb"))]
    if not have:
        return []
    batches = sorted({int(r.get("memory_batch")) for r in have if not is_nan(r.get("memory_batch"))})
    kinds = sorted({str(r.get("peak_kind")) for r in have if not is_nan(r.get("peak_kind"))})
    at = f"batch {', '.join(map(str, batches))}" if batches else "the record's batch"
    note = (f"{KV_HEADER} @resolution = the KV cache one generate call allocates at the record's batch size "
            f"(memory.batch; here {at}), per image (the batch's K/V buffers, and a KV budget's shared staging "
            "buffer, divided by the batch), in the run's K/V dtype; GB = 2^30 bytes. memory × = baseline KV / "
            "method KV, allocated (the memory that runs out: buffers are preallocated, so pruning and skipping "
            "do not shrink them, a KV budget does); the positions in use (kv_used_gb, memory_used_x) are in "
            "table.csv / tidy.csv. peak (GB) = the measured peak of one generate call of that batch: "
            + ("; ".join(f"{k}: {PEAK_KINDS.get(k, k)}" for k in kinds) if kinds else "not measured")
            + ". – = the record has no memory block (written before varbench recorded memory).")
    return [note]


def code_version_notes(table) -> list[str]:
    """One note naming the commits when the records were written by different code versions
    (``provenance.git.sha``, ``+dirty`` for a checkout with uncommitted changes): a table mixing them
    may compare a method against a baseline that older code produced. Nothing when they agree."""
    if "git_sha" not in getattr(table, "columns", ()):
        return []
    by_version: dict[str, list[str]] = {}
    for _, r in table.iterrows():
        by_version.setdefault(code_version(r), []).append(_preset(r))
    if len(by_version) < 2:
        return []
    parts = [f"{v} ({', '.join(names)})" for v, names in sorted(by_version.items(), key=lambda kv: -len(kv[1]))]
    return [f"Records from {len(by_version)} code versions: {'; '.join(parts)}. Rows from different commits "
            "(or uncommitted changes) may not measure the same code; rerun the stale ones with runtime.force=true "
            "to compare one version."]


def _n_left(header: Sequence[str]) -> int:
    """Left-aligned text columns: the method's name; numbers go right."""
    return 1


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    left = min(_n_left(header), len(header))
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * left + ["---:"] * (len(header) - left)) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def render_markdown(sections: Sequence[Section], notes: Sequence[str]) -> str:
    """``table.md``: each section's table (and breakdowns), then the numbered footnotes."""
    parts = []
    for s in sections:
        parts.append("### " + s.title)
        parts.append("\n".join(_md_table(s.header, s.rows)))
        for sub in s.subtables:
            parts.append(f"#### {sub.title}\n\n" + "\n".join(_md_table(sub.header, sub.rows)))
    if notes:
        parts.append("Notes:\n\n" + "\n".join(f"- {n}" for n in notes))
    return "\n\n".join(parts) + "\n"


_TEX_ESCAPE = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_TEX_SYMBOLS = {"×": r"$\times$", "±": r"$\pm$", "∞": r"$\infty$", "Δ": r"$\Delta$", "†": r"$^\dagger$",
                "‡": r"$^\ddagger$", "–": "--", "—": "---", "−": "$-$", "↑": r"$\uparrow$", "↓": r"$\downarrow$",
                "·": r"$\cdot$", "≥": r"$\geq$", "→": r"$\to$", "²": r"$^2$"}


def tex(text: str) -> str:
    """Escape LaTeX specials and turn the tables' unicode symbols into math-mode macros."""
    return "".join(_TEX_ESCAPE.get(ch) or _TEX_SYMBOLS.get(ch) or ch for ch in str(text))


def _tex_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    left = min(_n_left(header), len(header))
    spec = "l" * left + "r" * (len(header) - left)
    out = [r"\begin{table}[t]", r"\centering", r"\scriptsize", rf"\caption{{{tex(title)}}}",
           rf"\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(tex(h) for h in header) + r" \\", r"\midrule"]
    out += [" & ".join(tex(c) for c in row) + r" \\" for row in rows]
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return out


def render_latex(sections: Sequence[Section], notes: Sequence[str]) -> str:
    """``table.tex``: one booktabs ``table`` per section and breakdown, then the notes as a list
    (``\\usepackage{booktabs}``; ``\\input`` it into a paper)."""
    lines = ["% varbench table (needs \\usepackage{booktabs}); generated by varbench.analysis.tables"]
    for s in sections:
        lines += _tex_table(s.title, s.header, s.rows)
        for sub in s.subtables:
            lines += _tex_table(f"{s.title}: {sub.title}", sub.header, sub.rows)
    if notes:
        lines += [r"\begin{itemize}\scriptsize"] + [rf"\item {tex(n)}" for n in notes] + [r"\end{itemize}"]
    return "\n".join(lines) + "\n"

"""Aggregate finished records into paper tables and figures, each row against its baseline.

Usage::

    python -m varbench.aggregate store/nova_sweep [--out results/nova_sweep] [--baseline baseline]
                                          [--allow-unpaired] [--no-figures]     (varbench.cli.aggregate)
    python -m varbench.aggregate store/sweep_a store/sweep_b --baseline sweep_a:baseline   # compare experiments

    from varbench.analysis.aggregate import aggregate, pair_with_baseline
    result = aggregate("store/nova_sweep", out="results/nova_sweep")   # Aggregation; files under out/
    result.paired                                  # every record, paired (DataFrame)
    for g in result.groups:                        # one per (model, resolution)
        g.name, g.folder, g.paired, g.notes, g.baseline    # "toy-64px", results/nova_sweep/toy-64px, ...

Steps: find every entry with ``DONE`` under each PATH (recursively) -> tidy frame
(:func:`varbench.analysis.frame.records_to_frame`) -> :func:`pair_with_baseline` over the whole
frame -> files, one folder per (model, resolution) group (:mod:`varbench.analysis.layout`:
``out/<group>/``, e.g. ``results/nova_sweep/toy-64px/``), so runs of two models never overwrite or
rename each other's files:

* ``out/tidy.csv``: every record with the paired columns (one row per record, every column);
* ``out/<group>/tidy.csv``: the group's rows of it;
* ``out/<group>/table.csv``: the wide table, numbers only (``<metric>``, ``<metric>_err``, ``<metric>_delta``);
* ``out/<group>/table.md``: the same, formatted (:mod:`varbench.analysis.tables`: one section per baseline, paired
  speed-ups with their intervals, ``value ± err``, ``Δ`` signed, GenEval per-tag breakdown,
  footnotes saying what ``±`` and the intervals are and which cells are unreliable);
* ``out/<group>/table.tex``: the same tables in LaTeX (booktabs);
* figures (PNG) in ``out/<group>/`` (:func:`varbench.analysis.plots.write_figures`): ``speed_vs_<metric>.png``
  per metric (``__<benchmark/device>`` appended only when one group holds several benchmarks or
  devices), keep-ratio heatmaps, entropy curves, ``image_grid.png``.

Files an earlier aggregation wrote that the records no longer back are removed
(:func:`varbench.analysis.layout.clear_stale`): a group whose records are gone, and the flat tables
and figures of the layout before groups (``table.md`` directly in ``results/<experiment>/``).

Choosing the baseline (``--baseline``, :func:`choose_baseline`): a method name (default
``baseline``: the records of that method), ``experiment:method`` (that experiment's records of the
method: two experiments whose baselines have the same settings are compared against one of them),
or an entry id (or a unique prefix: that record alone). Rows of several experiments are named
``<label> [<experiment>]`` in the tables and figures (:func:`label_experiments`).

Pairing: a row's baseline is the record with ``method == --baseline`` and

* the same ``pair_key``: the hash of the record's resolved generation config minus the method
  (:func:`varbench.core.hashing.pair_key`: the image store's explicit ``GENERATION_KEYS`` minus ``method``,
  plus the sha256 of the weight and prompt files), so cfg, tau, top_k, top_p, the negative prompt,
  the schedule, the seed, the model, its weights and the pixel-relevant runtime all match;
* the same ``PAIR_KEYS`` (model, resolution, benchmark file hash, selected-prompts hash, seeds,
  image count, device, dtype; these also catch what the config cannot, e.g. the GPU). The device
  label (:func:`varbench.harness.provenance.device_label`) names the CPU model, and on CUDA the GPU,
  driver, torch, CUDA and cuDNN: rows from different machines are refused, the error naming both
  labels. Records from before the label named the CPU model (``device_known`` False) pair on
  what they have, with a warning and a flag in the table: two machines of one architecture
  looked alike then;
* the same timing batch size (``timing_bs``) when both rows were timed.

Comparing across any of these would mix effects, so a row without such a baseline is an error
that names what differs from the nearest baseline (config keys by their dotted path, e.g.
``generation.cfg (3.0 vs baseline 4.0)``); ``--allow-unpaired`` keeps the row with empty ratios
instead. Several matching baselines are always an error naming every candidate entry and the
``--baseline`` spelling that chooses one: nothing is chosen silently (move or delete the stale one,
or pass ``--baseline EXPERIMENT:METHOD`` / ``--baseline ENTRY``). Device: when both rows were timed, their timing
device labels are compared; when either is quality-only (``timing=none``, no timing block), the
record's provenance label is compared (the same string); an older quality-only record without
one is compared on provenance's hardware name (``device_name``). Records without a ``config`` (hand-made or older than it) have no
pairing key: they are paired on ``PAIR_KEYS`` alone with a warning that the sampling settings
were not checked. Evaluator versions (``version_info`` hashes) must agree between a row and its
baseline for every evaluator both report; otherwise the error names the evaluator.

Columns added: ``is_baseline``, ``speedup`` = baseline ar_ms / ar_ms and ``e2e_speedup`` = baseline
total_ms / total_ms (text + AR + decode): the *unpaired* ratios of separately timed jobs, kept in
the CSVs only (they drift with the machine: 2x between jobs on a shared CPU), ``flops_x`` =
baseline flops_total / flops_total (transformer only, shown as "FLOPs × (transformer)") and
``flops_x_e2e`` = baseline flops_e2e / flops_e2e (with the text encoder and the VAE decode, shown as
"FLOPs × (end to end)"), ``memory_x`` = baseline kv_gb / kv_gb (the KV cache one generate call
allocates, per image: the memory that runs out; shown as "memory ×") and ``memory_used_x`` =
baseline kv_used_gb / kv_used_gb (the most positions in use; CSVs only), both NaN when either
record has no ``memory`` block or the two were measured at different batch sizes
(``memory_batch``: the per-image share of a shared buffer depends on it). The memory columns
themselves (``kv_gb``, ``kv_used_gb``, ``peak_gb``, ``peak_kind``, ``peak_analytic_gb``,
``memory_batch``: :func:`varbench.analysis.frame.records_to_frame`) are in ``table.csv`` too. The paired speed-ups come from each
record (:func:`varbench.analysis.frame.records_to_frame`): ``paired_speedup`` / ``paired_e2e_speedup``
(ratio of summed per-prompt times against the baseline timed interleaved in the method's own
job, over ``n_prompts_timed`` prompts; one prompt: median per-repeat ratio),
``paired_speedup_ci_low/high``, ``paired_e2e_speedup_ci_low/high``, ``paired_speedup_ci_level``,
``n_repeats``, ``speedup_reliable`` and ``unreliable_reason`` (:mod:`varbench.harness.timing`). Also
``<metric>_delta`` = value - baseline value, except for evaluators
that declare ``relative_to_baseline`` (fidelity: PSNR/SSIM/LPIPS against the baseline's own
image, already a comparison; a Δ against the baseline's self-comparison, e.g. its 100 dB PSNR
cap, means nothing), which get no ``_delta`` column. Deltas carry no ±: both
runs use the same prompts and seeds, so their errors are correlated and adding them in
quadrature would overstate the spread; use the per-sample files for a paired test.

Reading the results in pandas::

    df = pd.read_csv("results/nova_sweep/tidy.csv")   # one row per record (all groups), every column above
    df[["method_preset", "paired_speedup", "paired_speedup_ci_low", "paired_speedup_ci_high",
        "n_repeats", "speedup_reliable", "flops_x", "flops_x_e2e", "kv_gb", "memory_x"]]
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence, Union

from varbench.analysis.frame import metric_columns, pair_config, records_to_frame, relative_to_baseline
from varbench.analysis.groups import GROUP_KEYS, baseline_mask
from varbench.analysis.layout import clear_stale, is_results_folder, split_groups
from varbench.core.errors import FixableError
from varbench.harness.records import RunEntry, find_entries

#: the frame columns a row and its baseline must share (besides ``pair_key``; see the module docstring)
PAIR_KEYS: tuple[str, ...] = ("model", "resolution", "benchmark_sha256", "prompts_sha256", "seeds",
                              "n_images", "device", "dtype")


class AggregationError(FixableError, ValueError):
    """Rows that cannot be compared honestly (no matching baseline, differing evaluators)."""


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
    except TypeError:
        pass
    return a == b


def _ratio(num, den) -> float:
    try:
        num, den = float(num), float(den)
    except (TypeError, ValueError):
        return float("nan")
    if math.isnan(num) or math.isnan(den) or den == 0:
        return float("nan")
    return num / den


def _same_memory_batch(row, base) -> bool:
    """Both records measured their KV cache at one batch size (a shared buffer's per-image share
    depends on it); True when neither says (older frames without the column)."""
    a, b = row.get("memory_batch"), base.get("memory_batch")
    if _missing(a) and _missing(b):
        return True
    return not (_missing(a) or _missing(b)) and int(a) == int(b)


def _both_timed(row, base) -> bool:
    return not (_missing(row.get("timing_bs")) or _missing(base.get("timing_bs")))


def _flag(v) -> bool:
    return not _missing(v) and bool(v)


def _unflagged(v) -> bool:
    """A boolean column that is present and false (None/NaN: not known, so not false)."""
    return not _missing(v) and not bool(v)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _differs(row, base, keys: Sequence[str]) -> list[str]:
    """Names of what differs between ``row`` and a candidate baseline (empty: they pair)."""
    out = []
    for k in keys:
        if k == "device" and not _both_timed(row, base) and not (_flag(row.get("device_known")) and _flag(base.get("device_known"))):
            # an older quality-only record has no full device label; compare the provenance hardware name
            if not (_missing(row.get("device_name")) or _missing(base.get("device_name"))):
                if not _same(row.get("device_name"), base.get("device_name")):
                    out.append("device_name")
                continue
        if not _same(row.get(k), base.get(k)):
            out.append(k)
    a, b = row.get("pair_key"), base.get("pair_key")
    if not (_missing(a) or _missing(b)) and a != b:
        out.append("pair_key")
    if _both_timed(row, base) and not _same(int(row["timing_bs"]), int(base["timing_bs"])):
        out.append("timing_bs")
    return out


def _files_diff(rec_a: Mapping, rec_b: Mapping) -> list[str]:
    """What :func:`varbench.core.hashing.pair_key` hashes besides the config, named: the weight files
    (``model.weights``, by file name, with both sha256 abbreviated) and the prompt file's sha256."""
    wa, wb = (rec_a.get("model") or {}).get("weights") or {}, (rec_b.get("model") or {}).get("weights") or {}
    short = lambda h: f"sha256 {h[:12]}…" if isinstance(h, str) else "absent"   # noqa: E731
    parts = [f"weights {name} ({short(wa.get(name))} vs baseline {short(wb.get(name))})"
             for name in sorted(set(wa) | set(wb)) if wa.get(name) != wb.get(name)]
    ba, bb = (rec_a.get("benchmark") or {}).get("sha256"), (rec_b.get("benchmark") or {}).get("sha256")
    if ba != bb:
        parts.append(f"prompt file ({short(ba)} vs baseline {short(bb)})")
    return parts


def _config_diff(row, base, limit: int = 8) -> str:
    """Dotted config keys, weight files and prompt file in which two records' pairing keys differ
    (read from their entries); the bare hashes only when the records cannot be read."""
    try:
        rec_a = RunEntry.from_dir(row["path"]).read(verify=False)
        rec_b = RunEntry.from_dir(base["path"]).read(verify=False)
        a, b = pair_config(rec_a), pair_config(rec_b)
    except Exception:  # noqa: BLE001 - no files (an in-memory frame): the hashes are all we can name
        a = b = None
    if a is None or b is None:
        return f"pair_key ({row.get('pair_key')!r} vs baseline {base.get('pair_key')!r})"

    def flat(tree, prefix=""):
        if isinstance(tree, dict) and tree:
            return {k: v for key, val in tree.items() for k, v in flat(val, f"{prefix}{key}.").items()}
        return {prefix[:-1]: tree}

    fa, fb = flat(a), flat(b)
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k, "<absent>") != fb.get(k, "<absent>"))
    parts = [f"config {k} ({fa.get(k, '<absent>')!r} vs baseline {fb.get(k, '<absent>')!r})" for k in keys[:limit]]
    if len(keys) > limit:
        parts.append(f"... {len(keys) - limit} more config keys")
    parts += _files_diff(rec_a, rec_b)   # retrained weights: name the file, as a config key is named
    return ", ".join(parts) or f"pair_key ({row.get('pair_key')!r} vs baseline {base.get('pair_key')!r})"


def _describe(row, base, what: Sequence[str]) -> str:
    parts = []
    for k in what:
        if k == "pair_key":
            parts.append(_config_diff(row, base))
        else:
            parts.append(f"{k} ({row.get(k)!r} vs baseline {base.get(k)!r})")
    return ", ".join(parts)


@dataclass(frozen=True)
class BaselineChoice:
    """Which records are the baseline (:func:`choose_baseline`).

    ``mask``: a boolean per row of the frame it was chosen from (after ``reset_index``); ``name``:
    the string the tables and figures recognise the baseline by (their ``baseline`` argument): the
    method name for a plain method, else ``<experiment>:<method>`` or ``entry:<id>``, which match no
    method, so only the ``is_baseline`` column marks the baseline rows (another experiment's own
    baseline, paired against the chosen one, is then an ordinary row); ``how``: words for a table note."""
    mask: tuple
    name: str
    how: str
    spec: str


def choose_baseline(frame, spec: str = "baseline") -> BaselineChoice:
    """The baseline records ``spec`` names (``--baseline``):

    * ``experiment:method`` -- the records of ``method`` in experiment ``experiment`` (comparing
      experiments whose baselines have the same settings: one of them is the reference);
    * a method name present in the frame -- its records (the meaning it always had);
    * else an entry id or a unique prefix of one -- that record alone.

    Raises :class:`AggregationError` naming what exists when nothing (or several entries) match."""
    frame = frame.reset_index(drop=True)
    spec = str(spec)
    methods = frame["method"].astype(str) if "method" in frame.columns else None
    if methods is None:
        raise AggregationError("the records have no method column: nothing to choose a baseline from")
    if ":" in spec:
        exp, method = spec.split(":", 1)
        exps = frame["experiment"].astype(str) if "experiment" in frame.columns else methods.map(lambda _: "None")
        if not (exps == exp).any():
            raise AggregationError(f"--baseline {spec}: no record of experiment {exp!r} among {len(frame)} records "
                                   f"(experiments present: {sorted(exps.unique())}); spell it EXPERIMENT:METHOD")
        mask = (exps == exp) & (methods == method)
        if not mask.any():
            raise AggregationError(f"--baseline {spec}: experiment {exp!r} has no record with method == {method!r} "
                                   f"(its methods: {sorted(methods[exps == exp].unique())})")
        return BaselineChoice(tuple(mask), spec, f"the {method!r} records of experiment {exp!r}", spec)
    if (methods == spec).any():
        return BaselineChoice(tuple(methods == spec), spec, f"method {spec!r}", spec)
    ids = frame["entry_id"].astype(str) if "entry_id" in frame.columns else methods.map(lambda _: "")
    hit = ids.str.startswith(spec) if spec else ids.map(lambda _: False)
    if hit.sum() == 1:
        entry = ids[hit].iloc[0]
        return BaselineChoice(tuple(hit), f"entry:{entry}", f"entry {entry}", spec)
    if hit.sum() > 1:
        raise AggregationError(f"--baseline {spec}: the prefix matches {int(hit.sum())} entries "
                               f"({', '.join(sorted(ids[hit]))}); give more of the entry id")
    raise AggregationError(f"no record with method == {spec!r} among {len(frame)} records "
                           f"(methods present: {sorted(str(m) for m in frame['method'].dropna().unique())}), and no "
                           f"entry id starts with {spec!r}; run the baseline (method={spec} with the same "
                           f"experiment_name and settings), or choose the reference rows with "
                           f"`python -m varbench.aggregate STORE/EXPERIMENT --baseline NAME|EXPERIMENT:METHOD|ENTRY`")


def pair_with_baseline(frame, baseline: "str | BaselineChoice" = "baseline", allow_unpaired: bool = False,
                       keys: Sequence[str] = PAIR_KEYS):
    """Return a copy of ``frame`` with baseline_entry, speedup, e2e_speedup, flops_x, flops_x_e2e,
    memory_x, memory_used_x and ``<metric>_delta`` columns (see module docstring). ``baseline``: a ``--baseline`` spelling
    (:func:`choose_baseline`) or its result. Raises AggregationError on mismatch."""
    import pandas as pd

    if frame.empty:
        raise AggregationError("no finished records (entries with DONE) to aggregate")
    frame = frame.reset_index(drop=True)
    for col in ("pair_key", "device_name", "timing_bs", "path"):
        if col not in frame.columns:
            frame[col] = None
    metrics = metric_columns(frame)
    delta_metrics = [m for m in metrics if not relative_to_baseline(m.split("/", 1)[0])]
    choice = baseline if isinstance(baseline, BaselineChoice) else choose_baseline(frame, baseline)
    if len(choice.mask) != len(frame):
        raise ValueError("the BaselineChoice was made for another frame")
    is_base = list(choice.mask)
    baseline = choice.spec
    bases = frame[is_base]
    records = frame.to_dict("records")
    base_rows = bases.to_dict("records")
    added = []
    problems = []
    unknown_device: dict[str, set] = {}
    ambiguous: dict[tuple, tuple[list, list]] = {}
    for row, row_is_base in zip(records, is_base):
        out = {"baseline_entry": None, "is_baseline": bool(row_is_base),
               "speedup": float("nan"), "e2e_speedup": float("nan"),
               "flops_x": float("nan"), "flops_x_e2e": float("nan"), "memory_x": float("nan"),
               "memory_used_x": float("nan"), **{f"{m}_delta": float("nan") for m in delta_metrics}}
        diffs = [(b, _differs(row, b, keys)) for b in base_rows]
        match = [b for b, d in diffs if not d]
        who = f"{row.get('method_label')!r} (entry {row.get('entry_id')})"
        if len(match) > 1:
            ids = tuple(str(b.get("entry_id")) for b in match)
            if ids not in ambiguous:
                ambiguous[ids] = (match, [])
            ambiguous[ids][1].append(who)
            added.append(out)
            continue
        if not match:
            nearest, what = min(diffs, key=lambda bd: len(bd[1]))
            msg = (f"no matching {baseline!r} record for {who}; the nearest baseline (entry "
                   f"{nearest.get('entry_id')}) differs in: {_describe(row, nearest, what)}")
            if not allow_unpaired:
                problems.append(msg)
            else:
                warnings.warn(msg + " (kept unpaired)", stacklevel=2)
            added.append(out)
            continue
        base = match[0]
        unknown = [str(r.get("entry_id")) for r in (row, base) if _unflagged(r.get("device_known"))]
        if unknown:
            unknown_device.setdefault(str(row.get("device")), set()).update(unknown)
        if _missing(row.get("pair_key")) or _missing(base.get("pair_key")):
            without = list(dict.fromkeys(str(r.get("entry_id")) for r in (row, base) if _missing(r.get("pair_key"))))
            warnings.warn(f"{who} paired with baseline entry {base.get('entry_id')} on {', '.join(keys)} only: "
                          f"entr{'y' if len(without) == 1 else 'ies'} {', '.join(without)} "
                          "hold no config, so sampling settings (cfg, tau, top_k, top_p, negative prompt, "
                          "schedule) were not checked", stacklevel=2)
        for col in [c for c in frame.columns if c.startswith("version/")]:
            a, b = row.get(col), base.get(col)
            if isinstance(a, str) and isinstance(b, str) and a != b:
                raise AggregationError(
                    f"evaluator {col.split('/', 1)[1]!r} differs between {row.get('method_label')!r} "
                    f"(entry {row.get('entry_id')}, version_info {a}) and its baseline (entry "
                    f"{base.get('entry_id')}, version_info {b}); re-score both with the same evaluator version")
        out["baseline_entry"] = base.get("entry_id")
        out["speedup"] = _ratio(base.get("ar_ms"), row.get("ar_ms"))
        out["e2e_speedup"] = _ratio(base.get("total_ms"), row.get("total_ms"))
        out["flops_x"] = _ratio(base.get("flops_total"), row.get("flops_total"))
        out["flops_x_e2e"] = _ratio(base.get("flops_e2e"), row.get("flops_e2e"))
        if _same_memory_batch(row, base):
            out["memory_x"] = _ratio(base.get("kv_gb"), row.get("kv_gb"))
            out["memory_used_x"] = _ratio(base.get("kv_used_gb"), row.get("kv_used_gb"))
        for m in delta_metrics:
            a, b = row.get(m), base.get(m)
            if a is not None and b is not None and not (math.isnan(a) or math.isnan(b)):
                out[f"{m}_delta"] = a - b
        added.append(out)
    for label, ids in unknown_device.items():
        warnings.warn(f"entries {', '.join(sorted(ids))} were paired on the device label {label!r}, which names no "
                      "CPU model (recorded before varbench recorded it): rows from different machines of the same "
                      "kind cannot be told apart; the table flags them (re-run them to record the CPU model)", stacklevel=2)
    unmatched = len(problems)
    for match, rows in ambiguous.values():
        cands = "".join(f"\n    entry {b.get('entry_id')} (created {b.get('created')}, path {b.get('path')})"
                        for b in match)
        experiments = sorted({str(b.get("experiment")) for b in match})
        fix = (f"they belong to different experiments ({', '.join(experiments)}): choose the reference with "
               f"--baseline {match[0].get('experiment')}:{match[0].get('method')} (EXPERIMENT:METHOD) or --baseline "
               f"{match[0].get('entry_id')} (an entry id), or aggregate one experiment at a time "
               "(python -m varbench.aggregate STORE/EXPERIMENT)" if len(experiments) > 1
               else f"move or delete the stale one(s), or choose one with --baseline {match[0].get('entry_id')} (an entry id)")
        problems.append(f"{len(match)} {baseline!r} records have the same generation settings, so the baseline of "
                        f"{', '.join(rows)} is ambiguous; {fix} (nothing is chosen silently):{cands}")
    if problems:
        raise AggregationError("refusing to compare mismatched runs:\n  " + "\n  ".join(problems)
                               + ("\n(run the matching baseline, or pass --allow-unpaired to keep rows that have "
                                  "no matching baseline without ratios)" if unmatched else ""))
    paired = pd.concat([frame, pd.DataFrame(added, columns=list(out))], axis=1)
    paired.attrs = dict(frame.attrs)   # the records' metric directions (varbench.analysis.frame.higher_is_better)
    return paired


def _order(paired, baseline: str):
    """Rows grouped by model/resolution/benchmark/device and by the baseline they pair with,
    the baseline first in each, then by preset name."""
    group = [k for k in GROUP_KEYS if k in paired.columns]
    extra = [k for k in ("prompts_sha256", "n_images", "baseline_entry") if k in paired.columns]
    name = "method_preset" if "method_preset" in paired.columns else "method_label"
    paired = paired.assign(_is_base=(~baseline_mask(paired, baseline)).astype(int))
    return paired.sort_values(group + extra + ["_is_base", name, "method_label"], kind="stable",
                              na_position="last").drop(columns="_is_base")


#: identification and timing columns of ``table.csv``, in order (the metrics follow)
WIDE_COLUMNS: tuple[str, ...] = (
    "method", "method_preset", "method_label", "entry_id", "baseline_entry", "is_baseline", "prompts_sha256",
    "n_images", "n_prompts_timed", "repeats_per_prompt", "n_repeats", "ar_ms", "ar_ms_p10", "ar_ms_p90", "ar_spread", "ar_ms_reliable", "total_ms", "paired_speedup", "paired_speedup_ci_low", "paired_speedup_ci_high",
    "paired_speedup_ci_level", "paired_e2e_speedup", "paired_e2e_speedup_ci_low", "paired_e2e_speedup_ci_high",
    "paired_ci_kind", "speedup_reliable", "unreliable_reason", "timing_tries", "speedup", "e2e_speedup", "flops_x",
    "flops_x_e2e", "kv_gb", "kv_used_gb", "peak_gb", "peak_kind", "peak_analytic_gb", "memory_batch", "memory_x",
    "memory_used_x", "identical_images", "method_effect", "method_effect_reason", "unchanged_images", "skipped_metrics")


def wide_table(paired, baseline: str = "baseline"):
    """The numeric wide table (``table.csv``): group keys, :data:`WIDE_COLUMNS`, then per metric
    ``<metric>``, ``<metric>_err``, ``<metric>_delta``. ``speedup``/``e2e_speedup`` are the unpaired
    ratios (separate jobs); the paired ones and their intervals are the ``paired_*`` columns."""
    metrics = metric_columns(paired)
    cols = [k for k in GROUP_KEYS if k in paired.columns] + list(WIDE_COLUMNS)
    for m in metrics:
        cols += [m, f"{m}_err", f"{m}_delta"]
    return _order(paired, baseline)[[c for c in cols if c in paired.columns]].reset_index(drop=True)


def _ordered_with_all(paired, baseline: str):
    return _order(paired, baseline).reset_index(drop=True)


def markdown_table(paired, baseline: str = "baseline", extra_notes: Sequence[str] = ()) -> str:
    """Formatted table (``table.md``; :mod:`varbench.analysis.tables`): one section per baseline."""
    from varbench.analysis.tables import build_sections, footnotes, render_markdown

    table = _ordered_with_all(paired, baseline)
    return render_markdown(build_sections(table, baseline), footnotes(table, baseline) + list(extra_notes))


def latex_table(paired, baseline: str = "baseline", extra_notes: Sequence[str] = ()) -> str:
    """The same tables in LaTeX (``table.tex``; booktabs)."""
    from varbench.analysis.tables import build_sections, footnotes, render_latex

    table = _ordered_with_all(paired, baseline)
    return render_latex(build_sections(table, baseline), footnotes(table, baseline) + list(extra_notes))


def incompleteness_notes(failed: Sequence[Mapping] = (), unfinished: Sequence[Path] = ()) -> list[str]:
    """Table notes for what the table lacks, so a pasted table never hides it: the sweep's failed
    jobs (``{"overrides", "error"}`` rows of ``failed_jobs.jsonl``) and entries without DONE
    (running, killed or failed)."""
    def shown(override: str) -> bool:          # machine-local paths do not belong in a pasted table
        return not (override.lstrip("+~").startswith(("paths.", "hydra.")) or "=/" in override)

    notes = []
    if failed:
        jobs = [f"{' '.join(o for o in f['overrides'] if shown(o))} ({str(f['error']).split(':', 1)[0]})" for f in failed]
        notes.append(f"Not in this table: {len(failed)} job(s) of the sweep failed: {'; '.join(jobs)}.")
    if unfinished:
        names = ", ".join(p.name for p in unfinished[:10]) + (" ..." if len(unfinished) > 10 else "")
        notes.append(f"Not in this table: {len(unfinished)} unfinished store entr{'y' if len(unfinished) == 1 else 'ies'} "
                     f"(no DONE: still running, killed or failed): {names}.")
    return notes


def unfinished_entries(path: str | Path) -> list[Path]:
    """Entry folders under ``path`` (``entries/<hash>/``) that have no DONE yet."""
    return sorted(p for p in Path(path).rglob("*") if p.is_dir() and p.parent.name == "entries"
                  and not (p / "DONE").exists())


@dataclass(frozen=True)
class ResultGroup:
    """One (model, resolution) group's outputs: ``folder`` = ``out/<name>``
    (:func:`varbench.analysis.layout.group_dir_name`) holds its tables, tidy.csv and figures;
    ``paired`` its rows; ``notes`` the table notes it was written with; ``baseline`` the name the
    tables and figures recognise its baseline rows by (:class:`BaselineChoice`). The fields of
    :class:`varbench.analysis.html_report.ReportGroup`, in its order."""
    name: str
    folder: Path
    paired: object
    notes: list = field(default_factory=list)
    baseline: str = "baseline"


@dataclass(frozen=True)
class Aggregation:
    """What :func:`aggregate` wrote: ``paired`` (every record, paired), ``out`` (the results folder,
    holding ``tidy.csv`` and one folder per group), ``groups`` (sorted by name), ``baseline`` (as in
    :class:`ResultGroup`), ``notes`` (the notes every group's table carries) and ``removed`` (stale
    files of an earlier aggregation deleted, :func:`varbench.analysis.layout.clear_stale`)."""
    paired: object
    out: Path
    groups: list
    baseline: str = "baseline"
    notes: list = field(default_factory=list)
    removed: list = field(default_factory=list)
    sources: list = field(default_factory=list)     # the store folders aggregated

    def __len__(self) -> int:      # the number of records, as len(paired) was
        return len(self.paired)


Paths = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]


def _as_paths(path: Paths) -> list[Path]:
    if isinstance(path, (str, os.PathLike)):
        return [Path(path)]
    return [Path(p) for p in path]


def find_records(paths: Sequence[Path]):
    """The tidy frame of the finished records under every folder of ``paths`` (recursively), each
    entry once: the same entry folder reached through two paths (a store and one of its
    experiments) counts once; the same entry id in two folders (a copied store) keeps the last,
    with a warning naming both. Raises :class:`AggregationError` for a path that is no folder or
    holds no finished record."""
    found: dict[Path, Path] = {}        # resolved -> as found (the tidy frame keeps the path as given)
    for path in paths:
        if not path.is_dir():
            raise AggregationError(f"{path} is not a folder; records live in the store, one folder per experiment "
                                   "(paths.store_dir/<experiment_name>, e.g. store/nova_sweep)")
        entries = find_entries(path)
        if not entries:
            hint = (" (that is a results folder: the records are in the store, e.g. store/<experiment_name>)"
                    if is_results_folder(path) else "")
            raise AggregationError(f"no finished records (entries/<hash>/ with DONE and record.json) under {path}{hint}")
        for e in entries:
            found.setdefault(Path(e).resolve(), Path(e))
    frame = records_to_frame([found[k] for k in sorted(found)])
    twice = frame[frame.duplicated(subset=["entry_id"], keep=False)]
    if not twice.empty:
        for entry_id, rows in twice.groupby("entry_id"):
            warnings.warn(f"entry {entry_id} is in {len(rows)} folders ({', '.join(map(str, rows['path']))}); "
                          "the last is used (remove the copy)", stacklevel=3)
    return frame.drop_duplicates(subset=["entry_id"], keep="last").reset_index(drop=True)


def label_experiments(paired):
    """When ``paired`` holds several experiments, append `` [<experiment>]`` to each row's
    ``method_label`` and ``method_preset`` (its name in the tables and figures), so the same method
    of two experiments is two rows one can tell apart; one experiment: unchanged."""
    if "experiment" not in paired.columns or paired["experiment"].nunique(dropna=False) < 2:
        return paired
    exp = paired["experiment"].astype(str)
    paired = paired.copy()
    paired["method_label"] = paired["method_label"].astype(str) + " [" + exp + "]"
    preset = paired["method_preset"] if "method_preset" in paired.columns else paired["method"]
    paired["method_preset"] = preset.fillna(paired["method"]).astype(str) + " [" + exp + "]"
    return paired


def aggregate(path: Paths, out: str | Path, baseline: str = "baseline", allow_unpaired: bool = False,
              figures: bool = True, failed: Sequence[Mapping] = ()) -> Aggregation:
    """Find records under ``path`` (a folder, or several: experiments or stores compared), pair
    them (the whole frame: a row pairs with its baseline wherever it is), write each (model,
    resolution) group's tables and figures into ``out/<group>/`` and every record into
    ``out/tidy.csv`` (:mod:`varbench.analysis.layout`). ``baseline``: :func:`choose_baseline`.
    ``failed``: the sweep's failed jobs, named in the tables' notes with the entries under
    ``path`` that have no DONE (:func:`incompleteness_notes`)."""
    paths = _as_paths(path)
    if not paths:
        raise AggregationError("no folder given: pass store/<experiment> (or several, to compare them)")
    frame = find_records(paths)
    bad = frame[frame["status"].fillna("ok") != "ok"]
    if not bad.empty:
        warnings.warn(f"skipping {len(bad)} finished record(s) whose status is not 'ok': "
                      f"{sorted(bad['entry_id'])}", stacklevel=2)
        frame = frame[frame["status"].fillna("ok") == "ok"].reset_index(drop=True)
    if frame.empty:
        raise AggregationError("no finished records (entries with DONE) to aggregate")
    choice = choose_baseline(frame, baseline)
    paired = label_experiments(pair_with_baseline(frame, baseline=choice, allow_unpaired=allow_unpaired))
    out = Path(out)
    from varbench.core.errors import writing
    from varbench.core.jsonio import atomic_write_bytes   # a killed aggregate never leaves half a table behind

    unfinished = sorted({p for root in paths for p in unfinished_entries(root)})
    notes = incompleteness_notes(failed, unfinished)
    if choice.spec != "baseline":        # the default needs no word; any other choice is said in the table
        notes.append(f"Baseline: {choice.how} (--baseline {choice.spec}): the Δ and FLOPs × of every other row, of "
                     "any experiment, are against it; a paired speed-up stays the row's own job's, timed against "
                     "the baseline interleaved in that job.")
    parts = split_groups(paired)
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
        removed = clear_stale(out, list(parts))
        atomic_write_bytes(out / "tidy.csv", paired.to_csv(index=False).encode("utf-8"))
    groups = []
    for name, sub in parts.items():
        folder = out / name
        sub = sub.reset_index(drop=True)
        sub.attrs = dict(paired.attrs)
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
            for fname, text in (("tidy.csv", sub.to_csv(index=False)),
                                ("table.csv", wide_table(sub, choice.name).to_csv(index=False)),
                                ("table.md", markdown_table(sub, choice.name, notes)),
                                ("table.tex", latex_table(sub, choice.name, notes))):
                atomic_write_bytes(folder / fname, text.encode("utf-8"))
        if figures:
            from varbench.analysis.plots import write_figures  # the figures live with the plotting code

            write_figures(sub, folder, baseline=choice.name)
        # the systems experiments' own table and figure (batch_sweep, systems_ladder), after the figures:
        # write_figures clears figures it did not write
        from varbench.analysis.systems_tables import write_systems_tables

        write_systems_tables(sub, folder)
        groups.append(ResultGroup(name, folder, sub, list(notes), choice.name))
    result = Aggregation(paired, out, groups, choice.name, notes, removed, sources=[str(p) for p in paths])
    write_report(result)
    return result


def write_report(result: Aggregation) -> Path | None:
    """``<out>/report.html`` (:func:`varbench.analysis.html_report.write_html_report`: every group's
    tables, notes, figures and provenance in one self-contained page); written again after figures
    are added later (the W&B sweep run renders them itself). A page that cannot be built (a figure
    listed but unreadable) is a warning naming why: it never costs the tables. Returns its path."""
    from varbench.analysis.html_report import ReportGroup, write_html_report

    title = ", ".join(dict.fromkeys(Path(s).name for s in result.sources)) or result.out.name
    try:
        return write_html_report(result.out / "report.html", title, [ReportGroup(**vars(g)) for g in result.groups],
                                 provenance={"records from": ", ".join(result.sources)})
    except FixableError as e:
        warnings.warn(f"report.html not written: {e}", stacklevel=2)
        return None

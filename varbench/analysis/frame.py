"""Records -> the tidy frame: one pandas row per finished record, and what its columns mean.

Usage::

    from varbench.harness.records import find_entries
    from varbench.analysis.frame import records_to_frame, metric_columns, higher_is_better
    df = records_to_frame(find_entries("store/nova_sweep"))   # tidy, one row per finished record
    for m in metric_columns(df):
        print(m, "higher is better" if higher_is_better(m, df.attrs.get("higher_is_better")) else "lower is better")

    import pandas as pd                                      # per-sample rows, for pandas users:
    pd.read_json(entry_dir / "samples_hpsv2.jsonl", lines=True)

The record itself (what every key means) is :mod:`varbench.harness.schema`; its folder, seal and
lock are :mod:`varbench.harness.records`. This module only reads: missing optional blocks are fine,
the frame shows NaN for what a record lacks.

A metric's direction ("higher is better") is decided in one place, :func:`higher_is_better`: the
direction the record carries (``higher_is_better``, written from the evaluator that computed the
metric; :func:`records_to_frame` keeps the records' directions in ``frame.attrs["higher_is_better"]``),
else the registered evaluator's declaration, else the metric's name (distances and errors are
lower-is-better). Figures, tables and their arrows all ask it.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping

from varbench.core.hashing import PAIR_KEYS, generation_key, pair_key, stable_hash
from varbench.core.jsonio import read_jsonl
from varbench.harness.provenance import recorded_git
from varbench.harness.records import LegacySealError, RunEntry


def _compact(obj: Any) -> str:
    """A short, stable string for a JSON value (long ones become ``sha:<hash>``)."""
    if obj is None:
        return ""
    text = obj if isinstance(obj, str) else json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= 48 else "sha:" + stable_hash(obj)


def method_label(method: Mapping) -> str:
    """``method.label`` if given, else ``name`` plus its scalar config knobs (``fastvar(r=0.4)``)."""
    if method.get("label"):
        return str(method["label"])
    name = str(method.get("name", "?"))
    cfg = method.get("config") or {}
    knobs = [f"{k}={v}" for k, v in sorted(cfg.items())
             if k not in ("_target_", "name", "label") and isinstance(v, (int, float, str, bool))]
    return f"{name}({','.join(knobs)})" if knobs else name


def pair_config(rec: Mapping) -> dict | None:
    """The settings :func:`varbench.core.hashing.pair_key` hashes, by dotted key (to name what differs)."""
    cfg = rec.get("config")
    if not isinstance(cfg, Mapping):
        return None
    return generation_key(cfg, keys=PAIR_KEYS)["config"]


def pick_batch(by_batch: Mapping) -> tuple[str | None, Mapping]:
    """``(batch size, block)`` of a record's ``timing.by_batch`` that the tidy columns (and the W&B
    per-scale table) come from: batch size 1 if timed, else the smallest; ``(None, {})`` if none."""
    if not by_batch:
        return None, {}
    if "1" in by_batch:
        return "1", by_batch["1"]
    key = min(by_batch, key=lambda k: int(k))
    return key, by_batch[key]


def _median(block: Any) -> float:
    """The median of a ``{"median", "p10", "p90"}`` block (or a bare number); NaN if absent."""
    if isinstance(block, Mapping):
        v = block.get("median")
        return float(v) if v is not None else float("nan")
    return float(block) if block is not None else float("nan")


def _num(v: Any) -> float:
    try:
        return float(v) if v is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _method_preset(rec: Mapping) -> str | None:
    """The Hydra choice of the method group (``nova_fast``): ``method.preset`` when the job wrote
    it, else the last ``method=...`` command-line override, else None."""
    method = rec.get("method") or {}
    if method.get("preset"):
        return str(method["preset"])
    exp = rec.get("experiment")
    for o in reversed((exp.get("overrides") or []) if isinstance(exp, Mapping) else []):
        if isinstance(o, str) and o.startswith("method="):
            return o.split("=", 1)[1]
    return None


def _timing_cfg(rec: Mapping) -> Mapping:
    cfg = (rec.get("config") or {}).get("timing") if isinstance(rec.get("config"), Mapping) else None
    return cfg if isinstance(cfg, Mapping) else {}


def _paired_columns(rec: Mapping, tb: Mapping) -> dict[str, Any]:
    """The paired speed-up columns: estimates, intervals and the reliability verdict
    (:mod:`varbench.harness.timing`), re-derived from the stored repeats with the record's own
    ``config.timing`` knobs (the defaults where it has none; :func:`varbench.harness.timing.rederive`). A
    record timed before per-repeat ratios were kept keeps its ratio of medians, with no interval,
    marked unreliable."""
    from varbench.harness import timing as T
    nan = float("nan")
    p = tb.get("paired") or {}
    n_rep = tb.get("n_repeats", (rec.get("timing") or {}).get("repeats"))
    out = {"paired_speedup": _num(p.get("ar_speedup")), "paired_speedup_ci_low": nan, "paired_speedup_ci_high": nan,
           "paired_speedup_ci_level": nan, "paired_e2e_speedup": _num(p.get("e2e_speedup")), "paired_e2e_speedup_ci_low": nan,
           "paired_e2e_speedup_ci_high": nan, "n_repeats": int(n_rep) if n_rep is not None else None,
           "reference_spread": _num(p.get("reference_spread")), "timing_order": p.get("order"),
           "paired_ci_kind": None, "speedup_reliable": None, "unreliable_reason": None}
    if not p:
        return out
    kw = T.protocol_kwargs(_timing_cfg(rec))
    block = T.rederive(p, kw["ci_level"], kw["bootstrap_resamples"], kw["bootstrap_seed"])
    if block is None:
        out["speedup_reliable"] = False
        out["unreliable_reason"] = "no per-repeat ratios (timed before the interval protocol): no interval"
        return out
    reliable, reasons = T.judge(block, kw["ci_level"], **{k: kw[k] for k in T.THRESHOLDS})
    out.update({"paired_speedup": block["ar_speedup"], "paired_speedup_ci_low": _num(block["ar_ci_low"]),
                "paired_speedup_ci_high": _num(block["ar_ci_high"]), "paired_speedup_ci_level": block["ci_level"],
                "paired_e2e_speedup": block["e2e_speedup"], "paired_e2e_speedup_ci_low": _num(block["e2e_ci_low"]),
                "paired_e2e_speedup_ci_high": _num(block["e2e_ci_high"]), "n_repeats": block["n_repeats"],
                "reference_spread": _num(block.get("reference_spread")), "paired_ci_kind": block.get("ci_kind"),
                "speedup_reliable": reliable, "unreliable_reason": "; ".join(reasons) or None})
    return out


def _own_spread(rec: Mapping, tb: Mapping) -> dict[str, Any]:
    """``ar_spread``: the row's own AR repeat times' spread (p90 - p10 over the median; per-prompt
    protocol: pooled within prompts, ``ar_repeat_spread``); ``ar_ms_reliable``: that spread within
    the record's ``timing.max_reference_spread`` (a pass whose machine speed moved makes its own ms,
    and any ratio of separately timed jobs built on them, unreliable)."""
    from varbench.harness import timing as T
    limit = T.protocol_kwargs(_timing_cfg(rec))["max_reference_spread"]
    if tb.get("ar_repeat_spread") is not None:
        spread = float(tb["ar_repeat_spread"])
        return {"ar_spread": spread, "ar_ms_reliable": spread <= limit}
    block = tb.get("ar_ms")
    if "per_prompt" in tb or not isinstance(block, Mapping) or None in (block.get("p10"), block.get("p90")) \
            or not block.get("median"):
        return {"ar_spread": float("nan"), "ar_ms_reliable": None}
    spread = (float(block["p90"]) - float(block["p10"])) / float(block["median"])
    return {"ar_spread": spread, "ar_ms_reliable": spread <= limit}


def _timed_prompts(timing: Mapping, tb: Mapping) -> dict[str, Any]:
    """How much was timed: ``n_prompts_timed`` (a record older than the per-prompt protocol timed
    one prompt), ``repeats_per_prompt``, ``timing_tries`` (passes run, re-times included)."""
    if not timing:
        return {"n_prompts_timed": None, "repeats_per_prompt": None, "timing_tries": None}
    n = tb.get("n_prompts", timing.get("n_prompts", 1))
    return {"n_prompts_timed": int(n) if n is not None else None,
            "repeats_per_prompt": int(timing["repeats"]) if timing.get("repeats") is not None else None,
            "timing_tries": len(timing.get("tries") or []) or 1}


def _device_columns(rec: Mapping, timing: Mapping) -> dict[str, Any]:
    """``device``: the timing block's label, else provenance's (``device``; an older record:
    ``torch.device_name``, just the architecture on a CPU); ``device_name``: provenance's
    ``torch.device_name``; ``device_known``: the record names the machine's CPU model (records from
    before it did cannot tell two machines of one architecture apart: paired, but flagged)."""
    prov = rec.get("provenance") or {}
    torch_name = (prov.get("torch") or {}).get("device_name")
    return {"device": timing.get("device") or prov.get("device") or torch_name, "device_name": torch_name,
            "device_known": bool(prov.get("cpu_model")) and "unknown CPU" not in str(timing.get("device") or prov.get("device"))}


def _random_weights(rec: Mapping) -> bool:
    """The model ran with random weights (``model.random_weights``; the toy's trained weights are not random)."""
    model_cfg = (rec.get("config") or {}).get("model") if isinstance(rec.get("config"), Mapping) else None
    return bool(isinstance(model_cfg, Mapping) and model_cfg.get("random_weights"))


def _skipped_metrics(evals: Mapping) -> str | None:
    """``<evaluator>/<part>: <status>`` for every part an evaluator reports as skipped or disabled
    in its version_info (e.g. fidelity's LPIPS without backbone weights); None if none."""
    out = []
    for name, info in (evals or {}).items():
        for key, val in (info.items() if isinstance(info, Mapping) else []):
            if isinstance(val, str) and val.startswith(("skipped", "disabled")):
                out.append(f"{name}/{key}: {val}")
    return "; ".join(out) or None


def _identical_images(rec: Mapping, path: str | None) -> bool | None:
    """Whether every image is bit-identical to its baseline image, from the fidelity evaluator:
    every per-sample PSNR infinite (``samples_fidelity.jsonl``), or without that file, the mean
    PSNR at the evaluator's cap with SSIM exactly 1. None without fidelity metrics."""
    metrics = rec.get("metrics") or {}
    if "fidelity/psnr" not in metrics:
        return None
    if path is not None:
        rows = read_jsonl(Path(path) / "samples_fidelity.jsonl")
        vals = [r.get("psnr") for r in rows if r.get("psnr") is not None]
        if vals:
            return all(math.isinf(v) and v > 0 for v in vals)
    cap = ((rec.get("evaluators") or {}).get("fidelity") or {}).get("psnr_cap_db_in_mean")
    psnr, ssim = metrics.get("fidelity/psnr"), metrics.get("fidelity/ssim")
    return bool(cap is not None and psnr is not None and psnr >= cap and ssim == 1.0)


def _memory_columns(mem: Any) -> dict[str, Any]:
    """The record's ``memory`` block (varbench/engine/memory.py) as columns, GiB: kv_gb (the KV-cache
    buffers one image holds: its share, mean over images), kv_used_gb (the most of them in use),
    attn_mem_gb (the most an attention plan kept between scales: SparVAR's indices and O_cache),
    peak_gb (the measured peak of one generation call of memory_batch images; peak_kind says what
    was measured: CUDA's max_memory_allocated or the CPU's RSS), peak_analytic_gb (weights + KV x
    batch). NaN / None for records without the block."""
    mem = mem if isinstance(mem, Mapping) else {}
    gib = lambda key: _num(mem.get(key)) / 2**30  # noqa: E731
    return {"kv_gb": gib("kv_bytes_allocated"), "kv_used_gb": gib("kv_bytes_used_peak"),
            "attn_mem_gb": gib("attn_memory_bytes_peak"), "peak_gb": gib("peak_bytes"),
            "peak_kind": mem.get("peak_kind"), "peak_analytic_gb": gib("analytic_peak_bytes"),
            "memory_batch": mem.get("batch")}


def _rewriter(bench: Mapping) -> str | None:
    """"on" when the images were generated from rewritten prompts (``benchmark.rewrite``), "off" for a
    GenEval run without (the two are reported apart: Infinity's 0.73 vs 0.69), None otherwise."""
    if bench.get("rewrite"):
        return "on"
    return "off" if "geneval" in (bench.get("loader"), bench.get("name")) else None


def _benchmark_label(bench: Mapping) -> str | None:
    """The benchmark's name, with ``· rewriter: on|off`` where :func:`_rewriter` says which: rows with and
    without rewritten prompts land in different sections of the table."""
    name, rw = bench.get("name"), _rewriter(bench)
    return f"{name} · rewriter: {rw}" if rw is not None and name is not None else name


def record_to_row(rec: Mapping, path: str | None = None) -> dict[str, Any]:
    """Flatten one record into the tidy frame's columns (see :func:`records_to_frame`)."""
    nan = float("nan")
    model = rec.get("model") or {}
    method = rec.get("method") or {}
    bench = rec.get("benchmark") or {}
    timing = rec.get("timing") or {}
    flops = rec.get("flops") or {}
    exp = rec.get("experiment")
    res = model.get("resolution")
    evals = rec.get("evaluators") or {}
    bs, tb = pick_batch(timing.get("by_batch") or {})
    n_prompts, spp = bench.get("n_prompts"), bench.get("samples_per_prompt")
    peak = tb.get("peak_mem_bytes")
    selection = bench.get("selection")
    row: dict[str, Any] = {
        "experiment": exp.get("name") if isinstance(exp, Mapping) else exp,
        "entry_id": rec.get("entry_id"),
        "generation_id": rec.get("generation_id"),
        "created": rec.get("created"),
        "status": rec.get("status", "ok"),
        "model": model.get("name"),
        "preset": model.get("preset"),
        "method": method.get("name"),
        "method_preset": _method_preset(rec) or method.get("name"),
        "method_label": method_label(method),
        "resolution": f"{res[0]}x{res[1]}" if isinstance(res, (list, tuple)) and len(res) == 2 else (res or None),
        "h_div_w": model.get("h_div_w"),
        "benchmark": _benchmark_label(bench),
        "rewriter": _rewriter(bench),
        # with a rewrite file: the prompts' and the rewrites' hash (PromptSet.key_sha256), so rows pair only alike
        "benchmark_sha256": bench.get("key_sha256") or bench.get("sha256"),
        "prompts_sha256": bench.get("items_sha256"),
        # False: the prompt file's sha256 differs from the official one (None: no official hash pinned)
        "benchmark_sha256_matches": bench.get("sha256_matches"),
        "random_weights": _random_weights(rec),
        "n_prompts": int(n_prompts) if n_prompts is not None else None,
        "samples_per_prompt": int(spp) if spp is not None else None,
        "n_images": int(n_prompts) * int(spp) if n_prompts is not None and spp is not None else None,
        # the prompt selection (limit, limit_per_tag), so sections never merge different subsets
        "prompt_selection": _compact({k: v for k, v in selection.items() if v is not None})
        if isinstance(selection, Mapping) else _compact(selection),
        "seeds": _compact(bench.get("seeds")),
        # the machine (CPU model; GPU, driver, torch, CUDA, cuDNN), and whether the record names it
        **_device_columns(rec, timing),
        "pair_key": pair_key(rec),
        "dtype": timing.get("dtype") or model.get("dtype"),
        "evaluator_versions": stable_hash(evals),
        "timing_bs": int(bs) if bs is not None else None,
        "text_ms": _median(tb.get("text_ms")),
        "ar_ms": _median(tb.get("ar_ms")),
        # per-prompt AR latency over the timed prompts (older records: over repeats of one prompt)
        "ar_ms_p10": _num((tb.get("ar_ms") or {}).get("p10")) if isinstance(tb.get("ar_ms"), Mapping) else nan,
        "ar_ms_p90": _num((tb.get("ar_ms") or {}).get("p90")) if isinstance(tb.get("ar_ms"), Mapping) else nan,
        **_timed_prompts(timing, tb),
        "decode_ms": _median(tb.get("decode_ms")),
        "total_ms": _median(tb.get("total_ms")),
        "images_per_s": float(tb["images_per_s"]) if tb.get("images_per_s") is not None else nan,
        # in-process ratios against the baseline timed interleaved in the same job (timing.paired_baseline)
        **_paired_columns(rec, tb),
        **_own_spread(rec, tb),
        "peak_mem_gb": peak / 2**30 if peak is not None else nan,  # GiB
        **_memory_columns(rec.get("memory")),
        "flops_total": float(flops["total"]) if flops.get("total") is not None else nan,
        "flops_ar": float(flops["ar"]) if flops.get("ar") is not None else nan,
        "flops_e2e": float(flops["end_to_end"]) if flops.get("end_to_end") is not None else nan,
        "identical_images": _identical_images(rec, path),
        # the method changed nothing (varbench/engine/effect.py): "none" rows are marked in table.md
        "method_effect": method.get("effect"),
        "method_effect_reason": method.get("effect_reason"),
        "unchanged_images": method.get("unchanged_images"),
        "skipped_metrics": _skipped_metrics(evals),
        "wall_s": rec.get("wall_s"),
        # the code that wrote the record (provenance.git): tables name the commits when they differ
        "git_sha": recorded_git(rec).get("sha"),
        "git_dirty": recorded_git(rec).get("dirty"),
        "path": path,
    }
    for name, info in evals.items():
        row[f"version/{name}"] = stable_hash(info)
    unc = rec.get("uncertainty") or {}
    for key, val in (rec.get("metrics") or {}).items():
        row[key] = float(val) if val is not None else nan
        e = unc.get(key)
        row[f"{key}_err"] = float(e) if e is not None else nan
    return row


def records_to_frame(paths: Iterable[str | os.PathLike]):
    """Tidy ``pandas.DataFrame``: one row per finished record.

    ``paths``: entry folders or ``record.json`` files (see :func:`varbench.harness.records.find_entries`);
    ``frame.attrs["higher_is_better"]``: the records' metric directions (:func:`higher_is_better`). Columns:
    experiment, entry_id, generation_id, created, status, model, preset (the model's), method (the
    policy name, e.g. ``nova``), method_preset (the config chosen, e.g. ``nova_fast``; tables show
    it), method_label, resolution ("HxW"), h_div_w, benchmark, benchmark_sha256, prompts_sha256,
    n_prompts, samples_per_prompt, n_images, prompt_selection (limit / limit_per_tag), seeds,
    benchmark_sha256_matches (False: not the official prompt file), random_weights, device (the
    timing block's device label, else provenance's; :func:`varbench.harness.provenance.device_label`),
    device_name (provenance's ``torch.device_name``, for every record), device_known (the record
    names its CPU model), pair_key (:func:`varbench.core.hashing.pair_key`), dtype,
    evaluator_versions (short hash of all evaluators' version_info), one ``version/<evaluator>``
    per evaluator, timing_bs (the batch size the timing columns come from: 1 if measured, else
    the smallest), text_ms, ar_ms, decode_ms, total_ms (medians over the timed prompts of each
    prompt's median repeat; older records: over repeats of one prompt), ar_ms_p10/ar_ms_p90 (over
    the timed prompts), n_prompts_timed, repeats_per_prompt, timing_tries (passes run,
    ``timing.retime_unreliable``), images_per_s; the paired speed-up against the baseline timed
    interleaved in the same job (:mod:`varbench.harness.timing`): paired_speedup (AR loop) and
    paired_e2e_speedup (ratio of summed per-prompt times; one prompt: median per-repeat ratio),
    paired_speedup_ci_low/high and paired_e2e_speedup_ci_low/high (bootstrap over prompts, or the
    order-statistic interval for one prompt: paired_ci_kind; ``<column>_ci_low`` names the column
    bounded), paired_speedup_ci_level (the coverage attained or nominal), n_repeats,
    reference_spread (the baseline's own p90-p10 over median), ar_spread and ar_ms_reliable (the
    row's own AR repeats' p90-p10 over median, within ``timing.max_reference_spread``), timing_order, speedup_reliable
    (bool; None without a paired block), unreliable_reason; peak_mem_gb (GiB, the timed pass's);
    kv_gb, kv_used_gb, peak_gb, peak_kind, peak_analytic_gb, memory_batch (``_memory_columns``); flops_total
    (transformer only), flops_ar, flops_e2e (transformer + text encoder + VAE decode), identical_images
    (every image bit-identical to the baseline's, from fidelity; None without it), method_effect /
    method_effect_reason / unchanged_images (did the method change anything: "none" | "partial" |
    "some", why not, how many images it left unchanged; record ``method.effect``), skipped_metrics
    (evaluator parts skipped, e.g. LPIPS without weights), wall_s, git_sha and git_dirty
    (``provenance.git`` of the code that wrote the record), path, and per metric
    ``<evaluator>/<metric>`` and ``<evaluator>/<metric>_err`` (the evaluator's standard error of the
    mean; fidelity's PSNR mean caps identical pairs, see ``identical_images``).
    """
    import pandas as pd

    rows, legacy, directions = [], [], {}
    for p in paths:
        p = Path(p)
        entry_dir = p.parent if p.name == "record.json" else p
        entry = RunEntry.from_dir(entry_dir)
        if not entry.is_done():
            continue
        try:
            rec = entry.read()
            rows.append(record_to_row(rec, str(entry_dir)))
            directions.update(recorded_directions(rec))
            note_evaluator_classes(rec)
        except LegacySealError:
            legacy.append(entry_dir)
    if legacy:  # one message for all of them, with the command that fixes them
        dirs = " ".join(str(d) for d in legacy)
        raise LegacySealError(f"{len(legacy)} entr{'y' if len(legacy) == 1 else 'ies'} sealed by older varbench "
                              f"(DONE holds record.json's hash only, so the other files cannot be checked): "
                              f"{dirs}. Run `python -m varbench.cli.records reseal {dirs}` (checks record.json "
                              f"against the old hash, then seals every file as it is now), or rerun those jobs "
                              f"with runtime.force=true")
    frame = pd.DataFrame(rows)
    frame.attrs["higher_is_better"] = directions   # the records' own metric directions (higher_is_better)
    return frame


def metric_columns(frame) -> list[str]:
    """The ``<evaluator>/<metric>`` value columns of a frame (not ``_err``/``_delta``/``version/``)."""
    return [c for c in frame.columns
            if "/" in c and not c.startswith("version/") and not c.endswith(("_err", "_delta"))]


# ---------------------------------------------------------------------------------------------
# what the metric columns mean

#: Metric column -> (words, unit) for axis titles and grid headers; others get "<evaluator> <metric>".
METRIC_WORDS: dict[str, tuple[str, str]] = {
    "geneval/overall": ("GenEval overall score", "fraction of prompts correct"),
    "toy_geneval/overall": ("Toy GenEval overall score", "fraction of prompts correct"),
    "hpsv2/score": ("HPSv2.1 human-preference score", ""),
    "imagereward/score": ("ImageReward score", ""),
    "fidelity/psnr": ("PSNR against the baseline's image", "dB"),
    "fidelity/ssim": ("SSIM against the baseline's image", "0 to 1"),
    "fidelity/lpips": ("LPIPS distance to the baseline's image", "0 to 1"),
    "fid/fid": ("FID against the baseline's images", "clean-fid"),
    "clipscore/score": ("CLIP score", "100 x cosine"),
    "mjhq_fid/fid": ("MJHQ-30K FID", "clean-fid"),
}
#: name parts of metrics where lower is better, for metrics neither a record nor an evaluator declares
LOWER_IS_BETTER_NAMES = ("lpips", "fid", "kid", "mse", "mae", "distance", "error", "loss")


def recorded_directions(rec: Mapping) -> dict[str, bool]:
    """``{"<evaluator>/<metric>": higher is better}`` as a record carries it (its ``higher_is_better``,
    written from the evaluator that computed the metric); {} for records without it."""
    table = rec.get("higher_is_better")
    return {str(k): bool(v) for k, v in table.items() if v is not None} if isinstance(table, Mapping) else {}


def higher_is_better(metric: str, recorded: Mapping[str, bool] | None = None) -> bool:
    """Whether larger values of a ``<evaluator>/<metric>`` column are better; decided here only.

    ``recorded``: the directions the records carry (:func:`recorded_directions`; a frame from
    :func:`records_to_frame` keeps them in ``frame.attrs["higher_is_better"]``), used when they name
    the metric. Else the registered evaluator class's ``higher_is_better``, else False for
    distance-like names (:data:`LOWER_IS_BETTER_NAMES`: LPIPS, FID, MSE, ...), True otherwise."""
    if recorded and metric in recorded:
        return bool(recorded[metric])
    ev, _, name = metric.partition("/")
    try:
        from varbench.core.registry import resolve
        from varbench.evaluators import REGISTRY

        if ev in REGISTRY:
            table = getattr(resolve(REGISTRY, ev, "evaluator"), "higher_is_better", {}) or {}
            if name in table:
                return bool(table[name])
    except Exception:  # noqa: BLE001 - an evaluator that cannot be imported here: fall back to the name
        pass
    return not any(k in metric.lower() for k in LOWER_IS_BETTER_NAMES)


def frame_directions(frame) -> Mapping[str, bool] | None:
    """The records' metric directions a frame carries (``frame.attrs``), for :func:`higher_is_better`."""
    return getattr(frame, "attrs", {}).get("higher_is_better")


def relative_to_baseline(evaluator: str) -> bool:
    """True if the evaluator registered as ``evaluator`` (the ``<evaluator>/`` prefix of a metric
    column; the evaluator's config key is its registry name) declares ``relative_to_baseline``.
    Names not in the registry (synthetic, external) are not relative."""
    if evaluator in _RELATIVE:
        return _RELATIVE[evaluator]
    try:
        from varbench.evaluators import REGISTRY
        from varbench.core.registry import resolve

        rel = bool(getattr(resolve(REGISTRY, evaluator, "evaluator"), "relative_to_baseline", False)) \
            if evaluator in REGISTRY else False
    except ImportError as e:
        warnings.warn(f"cannot import evaluator {evaluator!r} ({e}); treating its metrics as absolute "
                      "(deltas against the baseline are shown)", stacklevel=3)
        rel = False
    _RELATIVE[evaluator] = rel
    return rel


_RELATIVE: dict[str, bool] = {}


def note_evaluator_classes(rec: Mapping) -> None:
    """Teach :func:`relative_to_baseline` the record's own evaluator keys: a key that is not a registry name
    (``fid_tiny``, ``dpgbench_tiny``: an option naming the class ``fid``) is relative when its class is."""
    evs = (rec.get("config") or {}).get("evaluator") if isinstance(rec.get("config"), Mapping) else None
    for key, ecfg in (evs or {}).items():
        name = ecfg.get("name") if isinstance(ecfg, Mapping) else None
        if key not in _RELATIVE and isinstance(name, str) and name != key:
            try:
                _RELATIVE[key] = relative_to_baseline(name)
            except Exception:  # noqa: BLE001 - an outside class that does not import here: absolute, as before
                pass


def relative_metric(metric: str) -> bool:
    """True if the metric already compares with the baseline's image (fidelity): the baseline's
    own value is a self-comparison (e.g. a 100 dB PSNR cap), not a point to plot."""
    try:
        return bool(relative_to_baseline(metric.split("/", 1)[0]))
    except Exception:  # noqa: BLE001
        return metric.split("/", 1)[0] == "fidelity"


def plot_metrics(frame) -> list[str]:
    """Quality columns worth a figure: not counts (``n_*``), and for an evaluator with an
    ``overall`` metric only that one (its parts stay in the tables)."""
    ms = [m for m in metric_columns(frame) if not m.rsplit("/", 1)[-1].startswith("n_")
          and frame[m].notna().any()]
    with_overall = {m.split("/", 1)[0] for m in ms if m.endswith("/overall")}
    return [m for m in ms if m.split("/", 1)[0] not in with_overall or m.endswith("/overall")]


def primary_metric(frame) -> str | None:
    """The metric a one-line summary shows: the first ``*/overall``, else the first quality metric
    (absolute metrics before ones relative to the baseline)."""
    ms = plot_metrics(frame)
    overall = [m for m in ms if m.endswith("/overall")]
    if overall:
        return overall[0]
    absolute = [m for m in ms if not relative_metric(m)]
    return (absolute or ms or [None])[0]

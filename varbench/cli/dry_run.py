"""``python -m varbench [+experiment=NAME] [overrides] --dry-run``: the jobs a command would run,
without running them.

One line per job (:mod:`varbench.cli.sweep_plan`): what tells it apart, its store entry, whether
that entry is already finished (a relaunch skips it), partly done (the images stored so far are
reused) or new, and its estimated time. Then the files the jobs need and lack (the preflight's
list, :mod:`varbench.harness.preflight`), the total, and where the store and results go.

Estimates come from the store's own past records (``wall_s``, a job's whole wall time), on the
same device label only (:func:`varbench.harness.provenance.device_label`: times of another machine
say nothing here), in this order:

1. ``past run``: a finished record of the same method preset, model, resolution and image count;
2. ``other methods' runs``: this model and resolution (preset and aspect ratio) under any method,
   from the runs closest in image count (a job's fixed costs dominate small runs): their median
   wall time when they have the job's image count, else their seconds per image times the job's
   images (a pruning method is usually faster than that: a baseline-like estimate);
3. ``unknown``: no record of this model and resolution on this device.

A finished entry costs nothing; a partly done one is estimated in full (its stored images save
generation time, not scoring and timing).
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from varbench.cli.sweep_plan import SweepPlan, plan_command
from varbench.core.errors import ConfigError, FixableError, report_line


@dataclass
class PastRun:
    """What the estimate reads from one finished record."""

    preset: str
    model: str
    resolution: str
    n_images: int
    device: str
    wall_s: float


def past_runs(store_root: Path) -> list[PastRun]:
    """Every finished record under ``store_root`` (all experiments), as :class:`PastRun` rows;
    unreadable records are left out (an estimate never fails the dry run)."""
    from varbench.harness.records import find_entries

    out = []
    for entry in find_entries(store_root) if Path(store_root).is_dir() else []:
        try:
            rec = json.loads((Path(entry) / "record.json").read_text(encoding="utf-8"))
            bench = rec.get("benchmark") or {}
            n = int(bench.get("n_prompts") or 0) * int(bench.get("samples_per_prompt") or 1)
            method, model = rec.get("method") or {}, rec.get("model") or {}
            wall = float(rec["wall_s"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if n > 0 and math.isfinite(wall):
            gen = (rec.get("config") or {}).get("generation") or {}
            out.append(PastRun(str(method.get("preset") or method.get("name")), str(model.get("name")),
                               resolution_key(gen.get("pn"), gen.get("h_div_w")), n, str((rec.get("provenance") or {}).get("device")), wall))
    return out


def resolution_key(pn, h_div_w) -> str:
    """``1M@1.0``: the resolution preset and aspect ratio, what fixes the token schedule."""
    try:
        return f"{pn}@{float(h_div_w):g}"
    except (TypeError, ValueError):
        return f"{pn}@?"


def estimate(runs: Sequence[PastRun], preset: str, model: str, resolution: str, n_images: int,
             device: str) -> tuple[Optional[float], str]:
    """(seconds or None, where the number comes from); see the module docstring."""
    here = [r for r in runs if r.device == device and r.model == model and r.resolution == resolution]
    same = [r.wall_s for r in here if r.preset == preset and r.n_images == n_images]
    if same:
        return statistics.median(same), "past run" if len(same) == 1 else f"median of {len(same)} past runs"
    if not here:
        return None, f"unknown: no past run of {model} at {resolution} on this device"
    # the runs closest in size: a job's fixed costs (model load, the timed pass) dominate small runs
    gap = min(abs(math.log(r.n_images / n_images)) for r in here)
    near = [r for r in here if abs(math.log(r.n_images / n_images)) == gap]
    size = near[0].n_images
    if size == n_images:
        return statistics.median(r.wall_s for r in near), (f"other methods' {'run' if len(near) == 1 else f'{len(near)} runs'} "
                                                           f"of {model} with {size} images")
    per_image = statistics.median(r.wall_s / r.n_images for r in near)
    return per_image * n_images, f"scaled from {len(near)} run{'s' if len(near) != 1 else ''} of {model} with {size} images"


def _duration(s: Optional[float]) -> str:
    if s is None:
        return "?"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


@dataclass
class JobLine:
    label: str
    entry: str
    status: str
    seconds: Optional[float]
    source: str


def describe_job(cfg, runs: Sequence[PastRun]) -> JobLine:
    """The dry run's line for one job: entry, status and estimate (a config or file problem is
    the status: the job would fail on it)."""
    from varbench.cli.context import hydra_context
    from varbench.harness.job import prepare_job
    from varbench.harness.provenance import device_label

    try:
        job = prepare_job(cfg, hydra_context())
    except ConfigError as e:
        return JobLine("", "-", f"{e.first_words}: {e}", None, "")
    except FixableError as e:
        missing = isinstance(e, FileNotFoundError)
        return JobLine("", "-", f"cannot start: {e.first_words or type(e).__name__}", None,
                       "see the missing files below" if missing else "see below")
    spp = job.prompt_set.samples_per_prompt
    items = [it for it, s in job.keys if s == 0]
    n_images = len(items) * spp
    entry = job.entry.entry_hash[:12]
    if job.entry.is_done():
        return JobLine("", entry, "finished (skipped)", 0.0, "")
    stored = n_images - len(job.store.missing(items, spp))
    status = f"partly done: {stored}/{n_images} images stored" if stored else f"new: {n_images} images"
    applied = cfg.method.get("per_model_applied")   # the model's knob block merged (varbench/harness/per_model.py)
    if applied not in (None, "none"):
        status += f"; knobs of per_model.{applied}"
    resolution = resolution_key(cfg.generation.pn, cfg.generation.h_div_w)
    seconds, source = estimate(runs, str(job.preset or cfg.method.name), str(cfg.model.name), resolution, n_images,
                               device_label(str(job.device)))
    return JobLine("", entry, status, seconds, source)


def timed_generations(timing) -> int:
    """Generations the timed pass runs per job (adaptive methods' prompt count; static methods time
    ``prompts_static``): prompts × (repeats + warm-up) × batch sizes, twice with the paired baseline."""
    if not timing or not timing.get("enabled", True):
        return 0
    prompts = int(timing.get("prompts") or 1)
    per = int(timing.get("repeats") or 1) + (int(timing.get("warmup_per_prompt")) if str(timing.get("warmup_per_prompt")).isdigit() else 0)
    n = prompts * per * len(timing.get("batch_sizes") or [1]) + int(timing.get("warmup") or 0)
    return n * (2 if timing.get("paired_baseline") else 1)


def stage_line(cfg) -> str:
    """Where a job's time goes: images generated and scored, then the timed pass (often most of a
    small job's wall time on a CPU), with the quick protocol's size for a first look."""
    try:
        spp = int(cfg.benchmark.get("samples_per_prompt") or 1)
        from varbench.harness.prompts import load_prompt_set

        n_images = len(load_prompt_set(cfg.benchmark).items) * spp
    except Exception:  # noqa: BLE001 - a prompt problem is named below
        return ""
    timed = timed_generations(cfg.get("timing"))
    evaluators = ", ".join(cfg.get("evaluator") or {}) or "none"
    line = f"  per job: generate {n_images} images, score them ({evaluators})"
    if timed:
        line += (f", then a timed pass of ≈ {timed} generations (timing.prompts × (repeats + warm-up) × batch sizes"
                 f"{', × 2 with the paired baseline' if cfg.timing.get('paired_baseline') else ''}); "
                 "timing=quick is the fast first look, timing=none skips it")
    return line


def dry_run_lines(plan: SweepPlan) -> list[str]:
    """The dry run's report (see the module docstring)."""
    from varbench.core.missing import MissingFilesError
    from varbench.harness.preflight import check_files

    varying = plan.varying()
    labels = [" ".join(o for o in j.overrides if o.partition("=")[0] in varying) or "(the job)" for j in plan.jobs]
    first = plan.jobs[0].cfg
    store = Path(first.paths.store_dir)
    runs = past_runs(store)
    lines_ = []
    for label, job in zip(labels, plan.jobs):
        line = describe_job(job.cfg, runs)
        line.label = label
        lines_.append(line)
    w = max(len(x.label) for x in lines_)
    out = [f"[varbench] dry run: {len(plan.jobs)} job{'s' if len(plan.jobs) != 1 else ''} of "
           f"{first.experiment_name} (nothing is run)",
           f"  {'#':>3}  {'job':<{w}}  {'entry':<12}  {'estimate':>9}  status"]
    for k, x in enumerate(lines_, 1):
        est = "—" if x.seconds == 0 else _duration(x.seconds)
        out.append(f"  {k:>3}  {x.label:<{w}}  {x.entry:<12}  {est:>9}  {x.status}"
                   + (f" ({x.source})" if x.source else ""))
    todo = [x for x in lines_ if x.seconds != 0]
    known = [x.seconds for x in todo if x.seconds is not None]
    unknown = len(todo) - len(known)
    total = f"≈ {_duration(sum(known))}" if known else "nothing to run" if not todo else "time unknown"
    out.append(f"  {len(todo)} to run, {len(lines_) - len(todo)} finished; {total}"
               + (f" for the {len(known)} with an estimate, {unknown} without" if unknown and known else "")
               + "; one after another on this machine")
    stages = stage_line(first)
    if stages:
        out.append(stages)
    try:
        check_files([j.cfg for j in plan.jobs], labels)
    except MissingFilesError as e:
        out += ["", *str(e).splitlines()]
    except FixableError as e:          # a malformed file, a bad setting, an incompatible combination
        out += ["", report_line(e)]
    else:
        out.append("  every file the jobs need is in place")
    out.append(f"  store: {store / str(first.experiment_name)}   results: "
               f"{Path(first.paths.results_dir) / str(first.experiment_name)}")
    return out


def dry_run(argv: Sequence[str]) -> int:
    """Print the dry run of a command line; 0, or 2 when it cannot be planned (Hydra's composition
    errors said in one line, :mod:`varbench.cli.hydra_errors`, unless ``HYDRA_FULL_ERROR=1``)."""
    from varbench.cli.hydra_errors import full_error, translate

    try:
        plan = plan_command(argv)
    except FixableError:
        raise
    except Exception as e:  # noqa: BLE001 - translated when it is an input fault, else its traceback
        fixable = None if full_error() else translate(e)
        if fixable is None:
            raise
        raise fixable from None
    if plan is None:
        raise ConfigError("--dry-run cannot expand this command's sweep (a glob(...) sweep or a flag such as --cfg); "
                          "list the values explicitly")
    print("\n".join(dry_run_lines(plan)))
    return 0

"""Weights & Biases as its users expect: one run per job, open while the job runs, and one run per sweep.

In a job (``logger=wandb``; :class:`varbench.loggers.observer.WandbObserver` calls these from the
job's hooks, :mod:`varbench.harness.events`)::

    run = JobRun.open(job)            # once the job holds its lock: config, name, group, tags; a bad
                                      # WANDB_MODE or a missing login is a ConfigError naming the fix
    run.progress("generate", 8, 64)   # after each batch: live progress (system metrics stream by themselves)
    bar = run.wrap(tqdm_bar, "generate nova", 64)   # or: a progress bar whose update() also reports it
    run.finish(job, record)           # after DONE: summary + paired speed-up/deltas, tables, artifact; .published
    run.fail(exc)                     # the job failed: the run ends with exit code 1
    republish(job, record)            # a finished entry relaunched (or assembled): publish it if it never was

Later, from the records alone (an offline machine first, ``wandb sync`` or an online machine later)::

    python -m varbench.publish store/<experiment> [--mode offline|online|disabled] [--project P]
        [--entity E] [--dir results] [--force] [--no-sweep] [--results results/<experiment>]

Offline runs travel: every file a run's ``.wandb`` names (the per-image table's images, the tables'
JSON, record.json, the sweep's table files) is staged inside its ``offline-run-*`` folder
(:func:`varbench.loggers.wandb.stage_inside`). Copied to another machine, the folder is made ready for
``wandb sync`` (which uploads artifact files from the absolute paths the ``.wandb`` file holds) with::

    python -m varbench.publish --relocate <copied wandb/ folder or offline-run-* folders>

(:mod:`varbench.loggers.offline`: rewrites those paths to the new place, then checks that every
named file is there with its recorded digest; exit 1 naming each file that would not sync).

publishes every finished entry (``entries/<hash>/`` with ``DONE``) that has no ``.published``
marker yet (``--force``: all of them again), then aggregates the experiment (tables and figures
into ``--results``) and logs the sweep run, unless the same tables (each group's ``table.csv``) were logged before
(marker ``store/<experiment>/.published_sweep`` with :func:`tables_digest`; ``--force`` logs it again). Exit status 0 when
everything was published, 1 when some record failed (each is named), 2 for a W&B set-up error.

What a job's run holds:

* config: the resolved config plus ``varbench`` (entry_id, generation_id, experiment, method,
  preset, model, benchmark); name ``<method label>-<entry[:8]>``, group the experiment,
  job_type the method, tags the logger's tags plus method, preset and model names;
* while it runs: ``progress/<stage>`` (fraction done), ``progress/<stage>_done`` and ``_total``
  per batch (at most every ``logger.progress_every_s`` seconds, always at the end of a stage),
  W&B's own system metrics (CPU, memory, GPU) and console output;
* summary: :func:`varbench.loggers.wandb.summary_from_record` (``<evaluator>/<metric>``, ``_err``,
  ``timing/bs<k>/...``, ``flops/...``, ``wall_s``) plus, from pairing the record with the
  baseline record of its experiment folder (``store/<experiment>``, handed in by the caller) exactly
  as :func:`varbench.analysis.aggregate.pair_with_baseline` does
  (same columns as ``table.csv``): ``paired/speedup`` (AR loop, against the baseline timed
  interleaved in the job) with ``paired/speedup_ci_low``, ``_ci_high``, ``paired/speedup_ci_level``,
  ``paired/e2e_speedup`` (+ interval), ``paired/n_repeats``, ``paired/speedup_reliable``,
  ``paired/unreliable_reason``, and once a baseline record pairs with it ``paired/baseline_entry``,
  ``paired/flops_x`` (transformer only), ``paired/flops_x_e2e`` (end to end),
  ``paired/speedup_separate_jobs`` and ``paired/e2e_speedup_separate_jobs`` and
  one ``<evaluator>/<metric>_delta`` per metric (none for evaluators relative to the baseline,
  e.g. fidelity). ``paired/status`` says which: ``paired``, ``is baseline``, ``no baseline record
  finished yet in <folder>`` (the sweep run's table has the deltas once it is), or ``unpaired: <why>``;
* tables: ``per_scale`` (scale, h, w, FLOPs, timed ms, share of images that ran it, mean keep
  fraction, mean entropy) and ``per_image`` (image for the first ``logger.log_images`` rows,
  prompt, tag, prompt_index, sample_index and every evaluator's per-sample scores as
  ``<evaluator>/<field>``);
* artifact ``record-<entry>`` (type ``varbench-record``) with record.json (``logger.log_record``).

Then the entry gets ``.published`` (JSON: run id, name, mode, dir, url), written atomically; it is
dot-named, so outside the entry's DONE seal. A W&B error while publishing is printed and leaves no
marker: the record is safe and the next launch (or ``python -m varbench.publish``) publishes it.
``disabled`` mode runs every step with a no-op run and writes no marker (nothing was published).

The sweep run (``job_type="sweep"``, group the experiment, :func:`log_sweep`), logged when the
sweep is aggregated (:func:`varbench.cli.callbacks.aggregate_experiment`; ``logger.log_sweep``): one
run per experiment; for each (model, resolution) group ``<group>`` (its folder
``results/<experiment>/<group>/``, :mod:`varbench.analysis.layout`) the paper table ``<group>/table``
(``table.csv`` as a W&B table), ``<group>/table_md`` (``table.md`` as preformatted HTML), the figures
(``<group>/figures/<name>``, :func:`varbench.analysis.plots.wandb_figures`) and the qualitative grids
(``<group>/qualitative/<name>``, :func:`varbench.analysis.image_grid.grids_for_wandb`); summary
``table_md`` holds every group's table; an artifact ``table-<experiment>`` (type ``varbench-table``)
with ``<group>/table.md|.csv|.tex|tidy.csv`` and the experiment's ``tidy.csv``. A failure there is
printed and never fails the sweep.
"""
from __future__ import annotations

import argparse
import hashlib
import html
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from varbench.harness.events import ObservedBar
from varbench.loggers.wandb import WandbSink, log_record_artifact, summary_from_record

MARKER = ".published"
SWEEP_MARKER = ".published_sweep"
SAFE = "the record is finished and safe; the next launch of this job (or `python -m varbench.publish`) publishes it"

#: tidy-frame columns (:func:`varbench.analysis.frame.records_to_frame` / :func:`pair_with_baseline`) -> summary keys
PAIRED_KEYS: dict[str, str] = {
    "paired_speedup": "paired/speedup", "paired_speedup_ci_low": "paired/speedup_ci_low",
    "paired_speedup_ci_high": "paired/speedup_ci_high", "paired_speedup_ci_level": "paired/speedup_ci_level",
    "paired_e2e_speedup": "paired/e2e_speedup", "paired_e2e_speedup_ci_low": "paired/e2e_speedup_ci_low",
    "paired_e2e_speedup_ci_high": "paired/e2e_speedup_ci_high", "n_repeats": "paired/n_repeats",
    "speedup_reliable": "paired/speedup_reliable", "unreliable_reason": "paired/unreliable_reason",
}
#: columns that exist only once a baseline record pairs with this one
BASELINE_KEYS: dict[str, str] = {
    "baseline_entry": "paired/baseline_entry", "flops_x": "paired/flops_x", "flops_x_e2e": "paired/flops_x_e2e",
    "speedup": "paired/speedup_separate_jobs", "e2e_speedup": "paired/e2e_speedup_separate_jobs",
}


# -- the logger config -------------------------------------------------------------------------
def sink_from_cfg(logger_cfg: Any) -> WandbSink | None:
    """The :class:`WandbSink` a ``logger`` config node describes; None for ``logger=none``
    (``NullSink``) or no node. A bad mode is a ConfigError naming the fix."""
    if logger_cfg is None:
        return None
    from omegaconf import OmegaConf

    kw = OmegaConf.to_container(logger_cfg, resolve=True) if OmegaConf.is_config(logger_cfg) else dict(logger_cfg)
    target = str(kw.pop("_target_", "") or "")
    if not target or target.rsplit(".", 1)[-1] == "NullSink":
        return None
    if target.rsplit(".", 1)[-1] != "WandbSink":
        from varbench.core.errors import ConfigError

        raise ConfigError(f"logger._target_ {target!r} is not supported: use logger=wandb or logger=none")
    return WandbSink(**kw)


# -- what a record maps to -----------------------------------------------------------------------
def _plain(v: Any) -> Any:
    """A JSON/W&B-friendly scalar: NaN and missing become None; numpy scalars become Python ones."""
    if v is None:
        return None
    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        try:
            v = v.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, (bool, int, float, str)):
        return v
    return json.dumps(v, default=str, sort_keys=True)


def paired_summary(record: Mapping, entry_dir: str | Path, experiment_dir: str | Path,
                   baseline: str = "baseline") -> dict[str, Any]:
    """The paired speed-up and delta summary keys (see module docstring) of ``record`` (stored in
    ``entry_dir``), pairing it with the finished baseline records of ``experiment_dir``
    (``store/<experiment>``) by :func:`varbench.analysis.aggregate.pair_with_baseline`. Never raises:
    a problem is ``paired/status``."""
    import pandas as pd

    from varbench.analysis.aggregate import AggregationError, pair_with_baseline
    from varbench.analysis.frame import record_to_row, records_to_frame
    from varbench.harness.records import find_entries

    entry_dir = Path(entry_dir)
    root = Path(experiment_dir)
    out: dict[str, Any] = {}
    try:
        own = pd.DataFrame([record_to_row(record, str(entry_dir))])
    except Exception as e:  # noqa: BLE001 - a hand-made record: the summary still gets its metrics
        return {"paired/status": f"error: cannot read the record for pairing ({type(e).__name__}: {e})"}
    row = own.iloc[0].to_dict()
    for col, key in PAIRED_KEYS.items():                 # the in-job paired timing: the record's own
        if _plain(row.get(col)) is not None:
            out[key] = _plain(row.get(col))
    if row.get("method") == baseline:
        out["paired/status"] = "is baseline"
        return out
    try:
        others = [p for p in find_entries(root) if Path(p).resolve() != entry_dir.resolve()]
        frame = records_to_frame(others)
    except Exception as e:  # noqa: BLE001 - a broken neighbour must not cost this run its summary
        out["paired/status"] = f"error: cannot read the records in {root} ({type(e).__name__}: {e})"
        return out
    bases = frame[(frame["method"] == baseline) & (frame["status"].fillna("ok") == "ok")] if not frame.empty else frame
    if bases.empty:
        out["paired/status"] = (f"no baseline record finished yet in {root}; the sweep's table "
                                "(and `python -m varbench.publish`) has the deltas once it is")
        return out
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            paired = pair_with_baseline(pd.concat([own, bases], ignore_index=True), baseline=baseline,
                                        allow_unpaired=True)
    except AggregationError as e:
        out["paired/status"] = f"unpaired: {e}"
        return out
    mine = paired.iloc[0].to_dict()
    if _plain(mine.get("baseline_entry")) is None:
        why = "; ".join(str(w.message) for w in caught) or "no matching baseline record"
        out["paired/status"] = f"unpaired: {why}"
        return out
    out["paired/status"] = "paired"
    for col, key in BASELINE_KEYS.items():
        if _plain(mine.get(col)) is not None:
            out[key] = _plain(mine.get(col))
    for col, val in mine.items():
        if isinstance(col, str) and col.endswith("_delta") and _plain(val) is not None:
            out[col] = _plain(val)
    return out


def per_scale_rows(record: Mapping, traces: Sequence[Mapping]) -> list[dict]:
    """One row per scale: scale, h, w, flops, ms (the timed pass's median at the timing batch
    size), ran_frac (share of images that ran it), keep_mean (mean kept fraction of token-layer
    work, 1 when every layer ran in full, 0 when skipped), entropy_mean."""
    from varbench.analysis.frame import pick_batch

    flops = list((record.get("flops") or {}).get("per_scale") or [])
    _, tb = pick_batch(((record.get("timing") or {}).get("by_batch")) or {})
    ms = list(tb.get("per_scale_ms") or [])
    scales = [sc for sc in (traces[0].get("scales") or [])] if traces else []
    n = max(len(flops), len(ms), len(scales))
    rows = []
    for i in range(n):
        col = [t["scales"][i] for t in traces if i < len(t.get("scales") or [])]
        ran = [bool(c.get("ran")) for c in col]
        keep = [0.0 if not c.get("ran") else (1.0 if not c.get("keep_frac") else sum(c["keep_frac"]) / len(c["keep_frac"]))
                for c in col]
        ent = [c["entropy_mean"] for c in col if c.get("entropy_mean") is not None]
        rows.append({"scale": i, "h": scales[i]["h"] if i < len(scales) else None,
                     "w": scales[i]["w"] if i < len(scales) else None,
                     "flops": flops[i] if i < len(flops) else None, "ms": ms[i] if i < len(ms) else None,
                     "ran_frac": sum(ran) / len(ran) if ran else None,
                     "keep_mean": sum(keep) / len(keep) if keep else None,
                     "entropy_mean": sum(ent) / len(ent) if ent else None})
    return rows


def per_image_rows(entry_dir: str | Path, evaluators: Iterable[str] | None = None,
                   keys: Iterable[tuple[int, int]] = ()) -> tuple[list[str], list[dict]]:
    """``(score columns, rows)``: one row per image, (prompt_index, sample_index) sorted, joining
    every evaluator's per-sample row (``samples_<evaluator>.jsonl``; later rows win) as
    ``<evaluator>/<field>`` columns. ``keys`` adds images that have no score row."""
    from varbench.core.jsonio import read_jsonl

    entry_dir = Path(entry_dir)
    names = list(evaluators) if evaluators is not None else sorted(
        p.name[len("samples_"):-len(".jsonl")] for p in entry_dir.glob("samples_*.jsonl"))
    by_key: dict[tuple[int, int], dict] = {(int(p), int(s)): {} for p, s in keys}
    cols: list[str] = []
    for name in names:
        path = entry_dir / f"samples_{name}.jsonl"
        if not path.exists():
            continue
        for r in read_jsonl(path):
            k = (int(r["prompt_index"]), int(r["sample_index"]))
            row = by_key.setdefault(k, {})
            for f, v in r.items():
                if f in ("prompt_index", "sample_index"):
                    continue
                c = f"{name}/{f}"
                if c not in cols:
                    cols.append(c)
                row[c] = _plain(v)
    return cols, [{"prompt_index": p, "sample_index": s, **by_key[(p, s)]} for p, s in sorted(by_key)]


def run_config(record_or_resolved: Mapping, *, entry_id: str | None, generation_id: str | None,
               experiment: str | None, method: str | None, preset: str | None, model: str | None,
               benchmark: str | None) -> dict:
    config = dict(record_or_resolved or {})
    config["varbench"] = {"entry_id": entry_id, "generation_id": generation_id, "experiment": experiment,
                          "method": method, "preset": preset, "model": model, "benchmark": benchmark}
    return config


def _record_meta(record: Mapping) -> dict:
    method, model = record.get("method") or {}, record.get("model") or {}
    exp = record.get("experiment")
    return {"entry_id": record.get("entry_id"), "generation_id": record.get("generation_id"),
            "experiment": exp.get("name") if isinstance(exp, Mapping) else exp,
            "method": method.get("name"), "preset": method.get("preset"), "model": model.get("name"),
            "benchmark": (record.get("benchmark") or {}).get("name"),
            "label": method.get("label") or method.get("preset") or method.get("name") or "run"}


def fill_run(run, sink: WandbSink, record: Mapping, entry_dir: str | Path, experiment_dir: str | Path,
             load_image: Callable[[int, int], Any] | None, prompt_of: Callable[[int], Mapping | str | None],
             baseline: str = "baseline") -> dict[str, Any]:
    """Log a finished record (stored in ``entry_dir``) into an open run (summary, paired against
    the baselines of ``experiment_dir``; per-scale and per-image tables, record artifact; see module
    docstring); returns the summary. Shared by a job's run and ``python -m varbench.publish``."""
    import wandb

    from varbench.core.jsonio import read_jsonl

    entry_dir = Path(entry_dir)
    summary = {**summary_from_record(record), **paired_summary(record, entry_dir, experiment_dir, baseline)}
    summary["status"] = record.get("status", "ok")
    run.summary.update(summary)
    traces = read_jsonl(entry_dir / "traces.jsonl") if (entry_dir / "traces.jsonl").exists() else []
    scale_rows = per_scale_rows(record, traces)
    if scale_rows:
        cols = list(scale_rows[0])
        run.log({"per_scale": wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in scale_rows])})
    score_cols, rows = per_image_rows(entry_dir, None, [(t["prompt_index"], t["sample_index"]) for t in traces])
    if rows:
        n_img = sink.log_images if sink.log_images >= 0 else len(rows)
        data, warned = [], False
        for i, r in enumerate(rows):
            img = None
            if load_image is not None and i < n_img:
                try:
                    img = wandb.Image(load_image(r["prompt_index"], r["sample_index"]))
                except Exception as e:  # noqa: BLE001 - a missing image leaves its cell empty, said once
                    if not warned:
                        print(f"[varbench] W&B per-image table: image ({r['prompt_index']}, {r['sample_index']}) "
                              f"not loaded ({type(e).__name__}: {e}); its cell stays empty")
                        warned = True
            meta = prompt_of(r["prompt_index"]) if prompt_of is not None else None
            meta = {"prompt": meta} if isinstance(meta, str) else dict(meta or {})
            data.append([img, meta.get("prompt"), meta.get("tag"), r["prompt_index"], r["sample_index"],
                         *(r.get(c) for c in score_cols)])
        run.log({"per_image": wandb.Table(columns=["image", "prompt", "tag", "prompt_index", "sample_index",
                                                   *score_cols], data=data)})
    if sink.log_record:
        log_record_artifact(run, record)
    return summary


def _run_info(run, sink: WandbSink, name: str) -> dict:
    return {"id": getattr(run, "id", None), "name": name, "mode": sink.mode, "project": sink.project,
            "url": getattr(run, "url", None) if sink.mode == "online" else None,
            "dir": str(Path(run.dir).parent) if sink.mode == "offline" and getattr(run, "dir", None) else None,
            "published": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _write_marker(entry_dir: Path, info: Mapping, sink: WandbSink) -> None:
    if sink.mode == "disabled":       # nothing was published: a later real publish must not be skipped
        return
    from varbench.core.jsonio import atomic_write_bytes

    atomic_write_bytes(Path(entry_dir) / MARKER, json.dumps(dict(info), indent=1, default=str).encode())


def _report_failure(e: BaseException) -> None:
    import logging

    logging.getLogger("varbench").error("W&B publish failed", exc_info=True)
    print(f"[varbench] W&B publish failed ({type(e).__name__}: {e}); {SAFE}")


# -- a job's run -------------------------------------------------------------------------------
class JobRun:
    """The W&B run of one job, open from start-up to the end (see module docstring). With
    ``logger=none`` every method does nothing."""

    def __init__(self, sink: WandbSink | None = None, run: Any = None, name: str | None = None):
        self.sink, self.run, self.name = sink, run, name
        self._last: dict[str, float] = {}

    @property
    def active(self) -> bool:
        return self.run is not None

    @classmethod
    def open(cls, job, sink: WandbSink | None = None) -> "JobRun":
        """Open the job's run (config, name, group, tags) with ``sink`` (default: the job's
        ``logger`` config); ``logger=none`` gives an inactive one. Raises
        :class:`varbench.core.errors.ConfigError` naming the fix for a bad mode or a missing login."""
        sink = sink if sink is not None else sink_from_cfg(job.cfg.get("logger"))
        if sink is None:
            return cls()
        cfg = job.cfg
        method = cfg.method
        label = method.get("label") or job.preset or method.name
        name = f"{label}-{str(job.entry.entry_hash)[:8]}"
        shard = getattr(job, "shard", None)
        if shard is not None and getattr(shard, "count", 1) > 1:
            name += f"-shard{shard.index}of{shard.count}"
        config = run_config(job.resolved, entry_id=job.entry.entry_hash, generation_id=job.store.generation_hash,
                            experiment=str(cfg.experiment_name), method=str(method.name), preset=job.preset,
                            model=str(cfg.model.name), benchmark=str(cfg.benchmark.get("name")))
        run = sink.init_run(name=name, job_type=str(method.name), config=config,
                            tags=[str(method.name), job.preset, str(cfg.model.name)])
        return cls(sink, run, name)

    def progress(self, stage: str, done: int, total: int) -> None:
        """Live progress after each batch (throttled to ``logger.progress_every_s``; the end of a
        stage always logs). Never raises."""
        if self.run is None:
            return
        now = time.monotonic()
        if done < total and now - self._last.get(stage, -math.inf) < self.sink.progress_every_s:
            return
        self._last[stage] = now
        try:
            self.run.log({f"progress/{stage}": done / total if total else 1.0,
                          f"progress/{stage}_done": done, f"progress/{stage}_total": total})
            self.run.summary["progress/stage"] = stage
        except Exception as e:  # noqa: BLE001 - progress is a convenience; the job goes on
            print(f"[varbench] W&B progress not logged ({type(e).__name__}: {e})")

    def wrap(self, bar, desc: str, total: int):
        """``bar`` (a tqdm bar, as :meth:`varbench.harness.job.Job.bar` makes) whose ``update(n)`` also reports
        :meth:`progress` for stage ``desc`` (:func:`stage_key`: "generate nova" ->
        ``progress/generate/nova``); ``bar`` itself when this run is inactive."""
        if self.run is None:
            return bar
        return ObservedBar(bar, stage_key(desc), int(total), self.progress)

    def finish(self, job, record: Mapping | None) -> None:
        """Log the finished record (summary with paired speed-up and deltas, tables, artifact),
        finish the run and write the entry's ``.published`` marker. ``record=None`` (a shard that
        did not assemble the record) only finishes the run. A W&B error is printed, never raised,
        and leaves no marker."""
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            if record is not None:
                items = {it.index: it for it in job.prompt_set.items}

                def prompt_of(p):
                    it = items.get(p)
                    return None if it is None else {**(getattr(it, "metadata", None) or {}), "prompt": it.prompt}

                fill_run(run, self.sink, record, job.entry.dir, job.entry.root, job.store.load, prompt_of)
            info = _run_info(run, self.sink, self.name)
            run.finish(exit_code=0)
        except Exception as e:  # noqa: BLE001 - the record is safe; the next launch publishes it
            _finish_quietly(run, 1)
            _report_failure(e)
            return
        if info.get("url"):
            print(f"[varbench] W&B run: {info['url']}")
        elif info.get("dir"):  # offline: say where it waits and how it gets uploaded
            print(f"[varbench] W&B offline run: {info['dir']} (upload it with `wandb sync {info['dir']}`); "
                  "copied to another machine, run `python -m varbench.publish --relocate <its new place>` first")
        if record is not None:
            try:
                _write_marker(job.entry.dir, info, self.sink)
            except OSError as e:
                _report_failure(e)

    def fail(self, exc: BaseException) -> None:
        """The job failed: note the error in the summary and finish the run with exit code 1."""
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            run.summary["error"] = f"{type(exc).__name__}: {exc}"
        except Exception:  # noqa: BLE001
            pass
        _finish_quietly(run, 1)


def stage_key(desc: str) -> str:
    """The W&B key of a progress bar's stage: its words joined by ``/`` ("generate nova" ->
    ``generate/nova``, logged as ``progress/generate/nova``)."""
    return "/".join(str(desc).split()) or "job"


def _finish_quietly(run, exit_code: int) -> None:
    try:
        run.finish(exit_code=exit_code)
    except Exception as e:  # noqa: BLE001 - nothing more to do with a run that cannot finish
        print(f"[varbench] W&B run did not finish cleanly ({type(e).__name__}: {e})")


def is_published(entry_dir: str | Path) -> bool:
    return (Path(entry_dir) / MARKER).is_file()


def republish(job, record: Mapping, sink: WandbSink | None = None) -> None:
    """A finished entry relaunched (skip path) or assembled by ``python -m varbench.job assemble``:
    publish its record with ``sink`` (default: the job's ``logger`` config) if it has no
    ``.published`` marker (a mirror that failed, or ``logger=wandb`` added later). A bad mode or
    missing login raises ConfigError like :meth:`JobRun.open`; a W&B error while publishing is printed."""
    sink = sink if sink is not None else sink_from_cfg(job.cfg.get("logger"))
    if sink is None or is_published(job.entry.dir):
        return
    JobRun.open(job, sink).finish(job, record)


# -- from the records alone --------------------------------------------------------------------
def publish_entry(sink: WandbSink, entry_dir: str | Path, store_root: str | Path | None = None,
                  force: bool = False, baseline: str = "baseline", experiment_dir: str | Path | None = None) -> dict | None:
    """Publish one finished entry from its files (no Job): its own run, as a job's run ends, paired
    against the baselines of ``experiment_dir`` (default: the entry's own experiment folder, the
    one holding its ``entries/``), with its images from the store ``store_root`` (default: the
    experiment folder's parent, ``paths.store_dir``). Returns the marker's info, or None if
    skipped (already published). Raises ConfigError for a W&B set-up problem and SealError for an
    entry that fails its seal; other W&B errors propagate after the run is finished with exit
    code 1 (no marker)."""
    from varbench.harness.records import RunEntry
    from varbench.harness.store import ImageStore

    entry = RunEntry.from_dir(entry_dir)
    if is_published(entry.dir) and not force:
        return None
    record = entry.read()                               # verifies the seal
    experiment_dir = Path(experiment_dir) if experiment_dir is not None else entry.root
    store_root = Path(store_root) if store_root is not None else experiment_dir.parent
    images = ImageStore(store_root, str(record.get("generation_id")))
    meta = _record_meta(record)
    name = f"{meta['label']}-{str(meta['entry_id'])[:8]}"
    run = sink.init_run(name=name, job_type=meta["method"],
                        config=run_config(record.get("config") or {}, **{k: v for k, v in meta.items() if k != "label"}),
                        tags=[meta["method"], meta["preset"], meta["model"]])

    def prompt_of(p):
        try:
            return images.read_metadata(p)
        except Exception:  # noqa: BLE001 - no metadata: the row keeps its indices
            return None

    try:
        fill_run(run, sink, record, entry.dir, experiment_dir, images.load, prompt_of, baseline)
        info = _run_info(run, sink, name)
        run.finish(exit_code=0)
    except BaseException:
        _finish_quietly(run, 1)
        raise
    _write_marker(entry.dir, info, sink)
    return info


def sweep_figures(groups: Sequence[Any]) -> dict[str, Path]:
    """Render each result group's figures into its folder, keyed for W&B under the group's name:
    ``<group>/figures/<name>`` (:func:`varbench.analysis.plots.wandb_figures`, without the grids) and
    ``<group>/qualitative/<name>`` (:func:`varbench.analysis.image_grid.grids_for_wandb`).
    ``groups``: :attr:`varbench.analysis.aggregate.Aggregation.groups` (name, folder, paired, baseline)."""
    from varbench.analysis.image_grid import grids_for_wandb
    from varbench.analysis.plots import wandb_figures

    figs: dict[str, Path] = {}
    for g in groups:
        figs.update({f"{g.name}/{k}": p for k, p in
                     wandb_figures(g.paired, Path(g.folder), baseline=g.baseline, image_grids=False).items()})
        try:
            figs.update({f"{g.name}/{k}": p for k, p in grids_for_wandb(g.paired, g.folder, baseline=g.baseline).items()})
        except Exception as e:  # noqa: BLE001 - as write_figures: a grid must not sink the table
            warnings.warn(f"qualitative image grid of {g.name} not written: {type(e).__name__}: {e}", stacklevel=2)
    return figs


def log_sweep(sink: WandbSink, out: str | Path, experiment: str, figures: Mapping[str, str | Path] = (),
              n_records: int | None = None) -> dict | None:
    """The sweep-level run (see module docstring) from the aggregated files in ``out``: one run per
    experiment, each (model, resolution) group's ``table.csv`` as ``<group>/table`` and
    ``table.md`` as ``<group>/table_md`` (summary ``table_md``: every group's, one after another),
    the ``figures`` (:func:`sweep_figures`) and the artifact ``table-<experiment>`` with
    ``<group>/table.md|.csv|.tex|tidy.csv`` and ``tidy.csv``. Never raises: a failure is printed;
    returns the run's info or None."""
    from varbench.analysis.layout import group_dirs

    out = Path(out)
    try:
        import pandas as pd
        import wandb

        folders = group_dirs(out)
        if not folders:
            raise FileNotFoundError(f"no group folder with a table under {out}")
        tables = {f.name: pd.read_csv(f / "table.csv") for f in folders}
        mds = {f.name: (f / "table.md").read_text(encoding="utf-8") if (f / "table.md").exists() else "" for f in folders}
        n_rows = sum(len(t) for t in tables.values())
        name = f"{experiment}-table"
        run = sink.init_run(name=name, job_type="sweep", group=experiment, tags=["sweep"],
                            config={"varbench": {"experiment": experiment, "n_records": n_records or n_rows,
                                                 "results_dir": str(out), "groups": list(tables)}})
        try:
            logged = {}
            for group, table in tables.items():
                cols = [str(c) for c in table.columns]
                data = [[_plain(v) for v in row] for row in table.itertuples(index=False, name=None)]
                logged[f"{group}/table"] = wandb.Table(columns=cols, data=data)
                logged[f"{group}/table_md"] = wandb.Html(f"<pre>{html.escape(mds[group])}</pre>")
            run.log(logged)
            images = {k: wandb.Image(str(p)) for k, p in dict(figures or {}).items() if Path(p).is_file()}
            if images:
                run.log(images)
            every_md = "\n\n".join(f"## {group}\n\n{md}" for group, md in mds.items())
            run.summary.update({"n_records": n_records or n_rows, "table_md": every_md,
                                **{f"{group}/table_md": md for group, md in mds.items()}})
            if sink.log_record:
                art = wandb.Artifact(f"table-{experiment}", type="varbench-table")
                for f in folders:
                    for fname in ("table.md", "table.csv", "table.tex", "tidy.csv"):
                        if (f / fname).is_file():
                            art.add_file(str(f / fname), name=f"{f.name}/{fname}")
                if (out / "tidy.csv").is_file():
                    art.add_file(str(out / "tidy.csv"), name="tidy.csv")
                run.log_artifact(art)
            info = _run_info(run, sink, name)
            run.finish(exit_code=0)
        except BaseException:
            _finish_quietly(run, 1)
            raise
        return info
    except Exception as e:  # noqa: BLE001 - the tables are written; W&B is a copy
        import logging

        logging.getLogger("varbench").error("W&B sweep run failed", exc_info=True)
        print(f"[varbench] W&B sweep run not logged ({type(e).__name__}: {e}); the tables under {out} are "
              f"written; `python -m varbench.publish <store>/{experiment}` logs it later")
        return None


def tables_digest(results: str | Path) -> str:
    """sha256 over every group's name and ``table.csv`` in the results folder (in order): what the
    sweep marker compares, so the same tables are not logged twice and a changed group is."""
    from varbench.analysis.layout import group_dirs

    h = hashlib.sha256()
    for folder in group_dirs(results):
        h.update(folder.name.encode() + b"\0" + (folder / "table.csv").read_bytes() + b"\0")
    return h.hexdigest()


def publish_sweep(sink: WandbSink, src: Path, results: Path, force: bool = False, baseline: str = "baseline") -> int:
    """Aggregate ``src`` into ``results`` and log the sweep run unless these very tables were logged
    (``src/.published_sweep``). 0 ok / skipped, 1 failed."""
    from varbench.analysis.aggregate import AggregationError, aggregate
    from varbench.harness.records import SealError

    try:
        result = aggregate(src, results, baseline=baseline, figures=False)
    except (AggregationError, SealError) as e:
        print(f"[varbench] sweep run not logged: no table ({e})")
        return 0
    digest = tables_digest(results)
    marker = src / SWEEP_MARKER
    if not force and marker.is_file():
        try:
            if json.loads(marker.read_text()).get("table_sha256") == digest:
                print(f"[varbench] sweep run: this table was logged already ({marker}); --force logs it again")
                return 0
        except (OSError, ValueError):
            pass
    figs = sweep_figures(result.groups)
    info = log_sweep(sink, results, src.name, figs, n_records=len(result.paired))
    if info is None:
        return 1
    mark_sweep_logged(sink, src, results, info)
    print(f"[varbench] sweep run {info.get('name')} logged ({sink.mode})")
    return 0


def mark_sweep_logged(sink: WandbSink, src: str | Path, results: str | Path, info: Mapping) -> None:
    """Write ``src/.published_sweep`` (the run's info and :func:`tables_digest` of ``results``) after
    the sweep run logged those tables, so neither the next ``python -m varbench.publish`` nor a rerun
    logs the same tables twice. Nothing is written when W&B is disabled (nothing was logged)."""
    from varbench.core.jsonio import atomic_write_bytes

    if sink.mode == "disabled":
        return
    digest = tables_digest(results)
    atomic_write_bytes(Path(src) / SWEEP_MARKER, json.dumps({**info, "table_sha256": digest}, indent=1, default=str).encode())


def relocate_main(paths: Sequence[str]) -> int:
    """``--relocate``: :func:`varbench.loggers.offline.relocate` each run folder under ``paths`` and
    say what is missing. 0 when every run can be synced, 1 when a file is missing, 2 for a bad path."""
    from varbench.core.errors import FixableError
    from varbench.loggers.offline import relocate, run_dirs

    try:
        dirs = run_dirs(paths)
    except FixableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bad = 0
    for d in dirs:
        try:
            rep = relocate(d)
        except FixableError as e:
            print(f"[varbench] {d}: {e}")
            bad += 1
            continue
        moved = f"{rep.rewritten} path(s) pointed here" if rep.rewritten else "paths already point here"
        if rep.problems:
            bad += 1
            print(f"[varbench] {d}: {moved}; {len(rep.problems)} of {rep.files} file(s) it names will not sync:")
            for p in rep.problems:
                print(f"    {p}")
        else:
            print(f"[varbench] {d}: {moved}; all {rep.files} file(s) it names are inside it")
    parents = {d.parent for d in dirs}
    together = len(dirs) > 1 and len(parents) == 1 and all(d.name.startswith("offline-run-") for d in dirs)
    where = f"{dirs[0].parent}/offline-run-*" if together else " ".join(map(str, dirs))
    print(f"[varbench] {len(dirs) - bad} of {len(dirs)} run(s) ready" + (f"; upload: `wandb sync {where}`" if not bad else ""))
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m varbench.publish",
                                 description="Mirror an experiment's finished records (and its table) to W&B.")
    ap.add_argument("path", nargs="?", help="the experiment's store folder, store/<experiment> (or one entry folder)")
    ap.add_argument("--relocate", nargs="+", metavar="RUN_DIR", default=None,
                    help="instead: after copying offline runs (offline-run-* folders, or the wandb/ folder) to "
                         "another machine, point their artifact paths at where they are now, check every file "
                         "they name, then `wandb sync` them (varbench.loggers.offline)")
    ap.add_argument("--mode", default=os.environ.get("WANDB_MODE", "online"),
                    help="online | offline | disabled (default: $WANDB_MODE, else online)")
    ap.add_argument("--project", default="varbench")
    ap.add_argument("--entity", default=None)
    ap.add_argument("--group", default=None, help="run group (default: the experiment folder's name)")
    ap.add_argument("--dir", default="results", help="W&B writes <dir>/wandb/ (offline runs wait there)")
    ap.add_argument("--store-root", default=None, help="the store holding images/ (default: PATH/..)")
    ap.add_argument("--results", default=None, help="where the sweep's tables go (default: results/<experiment>)")
    ap.add_argument("--baseline", default="baseline", help="method name of the reference rows")
    ap.add_argument("--log-images", type=int, default=16, help="images in each per-image table (-1: all)")
    ap.add_argument("--no-record-artifact", action="store_true", help="no record.json / table artifacts")
    ap.add_argument("--force", action="store_true", help="publish entries (and the table) that were published before")
    ap.add_argument("--no-sweep", action="store_true", help="records only, no sweep-level run")
    args = ap.parse_args(argv)
    if args.relocate is not None:
        return relocate_main(args.relocate)
    if args.path is None:
        ap.error("the store folder (PATH) is required, or --relocate RUN_DIR...")

    from varbench.core.errors import ConfigError
    from varbench.harness.records import RunEntry, SealError, find_entries
    from varbench.loggers.wandb import MODES

    if args.mode not in MODES:
        print(f"error: --mode (default: $WANDB_MODE) must be one of {', '.join(MODES)}, got {args.mode!r}",
              file=sys.stderr)
        return 2
    path = Path(args.path)
    entries = find_entries(path)
    if not entries:
        print(f"error: no finished entries (entries/<hash>/ with DONE) under {path}", file=sys.stderr)
        return 2
    single = len(entries) == 1 and Path(entries[0]).resolve() == path.resolve()
    exp_dir = RunEntry.from_dir(entries[0]).root if single else path
    try:
        sink = WandbSink(mode=args.mode, project=args.project, entity=args.entity, group=args.group or exp_dir.name,
                         dir=args.dir, log_record=not args.no_record_artifact, log_images=args.log_images)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    done = skipped = 0
    failed = []
    for e_dir in entries:
        try:
            info = publish_entry(sink, e_dir, args.store_root, force=args.force, baseline=args.baseline)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except SealError as e:
            failed.append(e_dir)
            print(f"[varbench] not published (fails its seal): {e}")
            continue
        except Exception as e:  # noqa: BLE001 - one record's failure must not stop the others
            failed.append(e_dir)
            print(f"[varbench] not published: {e_dir} ({type(e).__name__}: {e})")
            continue
        if info is None:
            skipped += 1
            print(f"[varbench] skip (published): {e_dir}")
        else:
            done += 1
            verb = "checked (W&B disabled, nothing sent)" if sink.mode == "disabled" else "published"
            print(f"[varbench] {verb} {e_dir} -> {info.get('name')} ({sink.mode})")
    rc = 1 if failed else 0
    if not args.no_sweep and not single:
        results = Path(args.results) if args.results else Path("results") / exp_dir.name
        rc = max(rc, publish_sweep(sink, exp_dir, results, force=args.force, baseline=args.baseline))
    print(f"[varbench] {done} {'checked, nothing published (W&B disabled)' if sink.mode == 'disabled' else 'published'}, "
          f"{skipped} already published, {len(failed)} failed"
          + (f"; offline runs under {Path(args.dir) / 'wandb'}: `wandb sync {Path(args.dir) / 'wandb'}/offline-run-*`"
             if sink.mode == "offline" and done else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())

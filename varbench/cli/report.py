"""What a job prints when it ends: one result line, with its place in the sweep ("job k/N").

    [varbench] job 3/12 done · nova_fast · 2212 images · paired speed-up 1.84× [1.71, 1.97] (9 repeats, bs 1) · geneval/overall 0.712 ± 0.010

N comes from the sweep's overrides and ``hydra.sweeper.params`` (counted by
:func:`sweep_size` when the multirun starts, passed to the jobs in ``VARBENCH_SWEEP_JOBS``, which
launchers such as submitit hand on to their processes); without it the line says "job k".
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from varbench.harness.events import JobObserver

ENV_SWEEP_JOBS = "VARBENCH_SWEEP_JOBS"


def sweep_size(task_overrides: Iterable[str], sweeper_params: Mapping[str, Any] | None = None) -> int | None:
    """Jobs in a basic-sweeper multirun: the product of the sizes of its sweep overrides (the
    command line's winning over ``hydra.sweeper.params`` of the same key;
    :func:`varbench.cli.sweep_plan.job_overrides`). None when a sweep cannot be counted without the
    config repository (``glob(...)``)."""
    from varbench.cli.sweep_plan import job_overrides

    jobs = job_overrides(dict(sweeper_params or {}), list(task_overrides))
    return None if jobs is None else len(jobs)


def job_position(job_num: int | None) -> str:
    """``job k/N`` (k from Hydra's 0-based job number), ``job k``, or ``job`` outside a sweep."""
    if job_num is None:
        return "job"
    total = os.environ.get(ENV_SWEEP_JOBS)
    return f"job {int(job_num) + 1}/{total}" if total else f"job {int(job_num) + 1}"


def main_metric(record: Mapping) -> str | None:
    """The metric the line shows: the first ``*/overall``, else the first that is not a count."""
    names = [k for k in (record.get("metrics") or {}) if not k.rsplit("/", 1)[-1].startswith("n_")]
    overall = [k for k in names if k.endswith("/overall")]
    return (overall or names or [None])[0]


def result_line(record: Mapping, position: str = "job") -> str:
    """The one line a finished job prints (see the module docstring)."""
    method = record.get("method") or {}
    parts = [f"{position} done", str(method.get("preset") or method.get("name"))]
    bench = record.get("benchmark") or {}
    if bench.get("n_prompts") is not None:
        parts.append(f"{bench['n_prompts'] * int(bench.get('samples_per_prompt') or 1)} images")
    parts.append(_speed(record.get("timing")))
    metric = main_metric(record)
    if metric is not None:
        value = record["metrics"][metric]
        err = (record.get("uncertainty") or {}).get(metric)
        parts.append(f"{metric} {value:.4g}" + (f" ± {err:.2g}" if err is not None and math.isfinite(err) else ""))
    return "[varbench] " + " · ".join(parts)


def _speed(timing: Mapping | None) -> str:
    if not timing:
        return "not timed"
    by_batch = timing.get("by_batch") or {}
    if not by_batch:
        return "not timed"
    bs = min(by_batch, key=int)
    block = by_batch[bs]
    paired = block.get("paired")
    if paired and paired.get("ar_speedup") is not None:
        mark = "" if paired.get("reliable", True) else " (unreliable: " + "; ".join(paired.get("unreliable_reasons") or []) + ")"
        return (f"paired speed-up {paired['ar_speedup']:.2f}× [{paired['ar_ci_low']:.2f}, {paired['ar_ci_high']:.2f}] "
                f"({_timed(paired)}, bs {bs}){mark}")
    ar = (block.get("ar_ms") or {}).get("median")
    return f"AR {ar:.1f} ms (bs {bs})" if ar is not None else "not timed"


def _timed(paired: Mapping) -> str:
    """``16 prompts × 3 repeats`` (a record from before the per-prompt protocol: ``9 repeats``)."""
    n_p, n = paired.get("n_prompts"), int(paired.get("n_repeats") or 0)
    if not n_p or int(n_p) <= 1:
        return f"{n} repeats" if not n_p else f"1 prompt × {n} repeats"
    return f"{int(n_p)} prompts × {n // int(n_p)} repeats"


#: the sweep folder's log of finished jobs, one JSON line each (``{"wall_s": s, "skipped": bool}``): the ETA's data
DONE_LOG = ".jobs_done.jsonl"


def note_done(sweep_dir: str | Path, wall_s: float, skipped: bool) -> list[dict]:
    """Append this job to the sweep's :data:`DONE_LOG`; every line so far (this one last). One
    ``write`` of one short line in append mode: jobs of parallel launchers do not interleave."""
    import json

    path = Path(sweep_dir) / DONE_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"wall_s": float(wall_s), "skipped": bool(skipped)}) + "\n")
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue                      # a line cut by a kill: one job less in the estimate
    return rows


def eta_text(done: list[dict], total: int | None) -> str | None:
    """``sweep ≈ 12 min left (4 jobs)``: the mean wall time of the jobs that ran (not of those a
    relaunch skipped) times the jobs not yet done; None when nothing is left or nothing ran yet.
    It assumes the jobs run one after another (the local and basic launchers' default)."""
    if not total:
        return None
    left = int(total) - len(done)
    ran = [float(d["wall_s"]) for d in done if not d.get("skipped")]
    if left <= 0 or not ran:
        return None
    s = sum(ran) / len(ran) * left
    when = f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"
    return f"sweep ≈ {when} left ({left} job{'s' if left != 1 else ''})"


class ResultLine(JobObserver):
    """Prints a job's result line (:func:`result_line`, with its place in the sweep) when it
    finishes with a record, and when a relaunch finds its entry finished; in a sweep, the line
    ends with the sweep's ETA (:func:`eta_text`)."""

    def job_skipped(self, job: Any, record: Mapping) -> None:
        print(result_line(record, job_position(_job_num())) + _eta(0.0, skipped=True))

    def job_finished(self, job: Any, record: Mapping | None) -> None:
        if record is not None:                 # None: a shard that did not assemble the record
            print(result_line(record, job_position(_job_num())) + _eta(float(record.get("wall_s") or 0.0), False)
                  + stage_text(getattr(job, "stage_s", None) or {}))


#: how the result line names the job's stages (varbench.harness.job.Job.stage_s)
STAGE_NAMES = {"build": "model build", "generate": "generation", "score": "scoring", "time": "timed pass"}


def stage_text(stage_s: Mapping[str, float]) -> str:
    """`` · time: timed pass 71% (48 s), generation 22% ...``: where this job's wall time went, largest
    first; when the timed pass took most of it, the way to a fast first look (``timing=quick``)."""
    total = sum(stage_s.values())
    if total <= 0:
        return ""
    parts = [f"{STAGE_NAMES.get(k, k)} {v / total:.0%} ({v:.0f} s)" for k, v in
             sorted(stage_s.items(), key=lambda kv: -kv[1]) if v / total >= 0.01]
    hint = " (timing=quick for a fast first look)" if stage_s.get("time", 0.0) > total / 2 else ""
    return " · time: " + ", ".join(parts) + hint


def _eta(wall_s: float, skipped: bool) -> str:
    """`` · sweep ≈ ... left`` for a job of a sweep, else ""."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        if hc.mode.name != "MULTIRUN":
            return ""
        total = os.environ.get(ENV_SWEEP_JOBS)
        text = eta_text(note_done(hc.sweep.dir, wall_s, skipped), int(total) if total else None)
    except Exception:  # noqa: BLE001 - outside Hydra (tests, the Python API) or an unwritable folder: no ETA
        return ""
    return f" · {text}" if text else ""


def _job_num() -> int | None:
    from varbench.cli.context import hydra_job_num

    return hydra_job_num()

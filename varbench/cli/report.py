"""What a job prints when it ends: one result line, with its place in the sweep ("job k/N").

    [varbench] job 3/12 done · nova_fast · 2212 images · paired speed-up 1.84× [1.71, 1.97] (9 repeats, bs 1) · geneval/overall 0.712 ± 0.010

N comes from the sweep's overrides and ``hydra.sweeper.params`` (counted by
:func:`sweep_size` when the multirun starts, passed to the jobs in ``VARBENCH_SWEEP_JOBS``, which
launchers such as submitit hand on to their processes); without it the line says "job k".
"""
from __future__ import annotations

import math
import os
from typing import Any, Iterable, Mapping

from varbench.harness.events import JobObserver

ENV_SWEEP_JOBS = "VARBENCH_SWEEP_JOBS"


def sweep_size(task_overrides: Iterable[str], sweeper_params: Mapping[str, Any] | None = None) -> int | None:
    """Jobs in a basic-sweeper multirun: the product of the sizes of its sweep overrides (the
    command line's winning over ``hydra.sweeper.params`` of the same key). None when a sweep
    cannot be counted without the config repository (``glob(...)``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    strings = [f"{k}={v}" for k, v in (sweeper_params or {}).items()] + list(task_overrides)
    by_key = {}
    for o in OverridesParser.create().parse_overrides(strings):
        by_key[o.key_or_group] = o
    n = 1
    for o in by_key.values():
        if o.is_sweep_override():
            try:
                n *= len(list(o.sweep_string_iterator()))
            except Exception:  # noqa: BLE001 - glob sweeps need the config loader
                return None
    return n


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


class ResultLine(JobObserver):
    """Prints a job's result line (:func:`result_line`, with its place in the sweep) when it
    finishes with a record, and when a relaunch finds its entry finished."""

    def job_skipped(self, job: Any, record: Mapping) -> None:
        print(result_line(record, job_position(_job_num())))

    def job_finished(self, job: Any, record: Mapping | None) -> None:
        if record is not None:                 # None: a shard that did not assemble the record
            print(result_line(record, job_position(_job_num())))


def _job_num() -> int | None:
    from varbench.harness.job import hydra_job_num

    return hydra_job_num()

"""Hydra callbacks: aggregate a whole sweep into one table when the multirun ends."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from varbench.cli import launcher_watch     # the console of submitit sweeps


def failures_path(sweep_dir: str | Path) -> Path:
    """Where the jobs of a sweep note their failures (one JSON line each): `<hydra.sweep.dir>/failed_jobs.jsonl`.
    A job reads the folder from `HydraConfig.get().sweep.dir` (its task config has no `hydra` node)."""
    return Path(sweep_dir) / "failed_jobs.jsonl"


def read_failures(sweep_dir: str | Path) -> list[dict]:
    """The failed jobs noted in the sweep's folder: ``{"overrides": [...], "error": str}`` each."""
    path = failures_path(sweep_dir)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report_failures(sweep_dir: str | Path, failed: list[dict] | None = None) -> int:
    """Print the failed jobs of the sweep, one line per distinct error (a missing weight file fails
    every job the same way: one line names them all by the overrides that differ); the number failed.
    ``failed``: :func:`read_failures` of ``sweep_dir`` when the caller has read it already."""
    failed = read_failures(sweep_dir) if failed is None else failed
    if failed:
        where = (f" (tracebacks in the job logs under {sweep_dir})" if any(f.get("traceback_logged", True) for f in failed)
                 else "")
        print(f"[varbench] {len(failed)} job(s) of this sweep failed{where}:")
        by_error: dict[str, list[list[str]]] = {}
        for f in failed:
            by_error.setdefault(f["error"], []).append(list(f["overrides"]))
        for error, jobs in by_error.items():
            if len(jobs) == 1:
                print(f"  FAILED {' '.join(jobs[0])}: {error}")
                continue
            shared = set.intersection(*(set(o) for o in jobs))
            names = [" ".join(o for o in overrides if o not in shared) or "(same overrides)" for overrides in jobs]
            print(f"  FAILED {len(jobs)} jobs ({', '.join(names)}; all with {' '.join(o for o in jobs[0] if o in shared)}): "
                  f"{error}")
    return len(failed)


def _wandb_sink(cfg: DictConfig):
    """The W&B sink of `cfg.logger` when it logs the sweep run (`logger=wandb`, `logger.log_sweep`), else None.
    A bad logger setting is printed here (the jobs already reported it) and means no sweep run."""
    from varbench.loggers.publish import sink_from_cfg

    try:
        sink = sink_from_cfg(cfg.get("logger"))
    except Exception as e:  # noqa: BLE001 - the table matters more than its W&B copy
        print(f"[varbench] W&B sweep run not logged: {e}")
        return None
    return sink if sink is not None and sink.log_sweep else None


def aggregate_experiment(cfg: DictConfig, failed: list[dict] | None = None):
    """Tables + figures for every finished record of `cfg.experiment_name` -> results/<name>/<group>/,
    one folder per (model, resolution) (:mod:`varbench.analysis.layout`), and results/<name>/tidy.csv;
    with `logger=wandb`, also the sweep-level W&B run (varbench.loggers.publish.log_sweep: each group's
    table, table.md, figures and image grids under the group's name), whose failure is printed and
    never fails the sweep. Prints each group's table.md and its folder. `failed`: the sweep's failed
    jobs (:func:`read_failures`), named in the tables' notes. Returns the
    :class:`varbench.analysis.aggregate.Aggregation` (None when no table was written)."""
    from varbench.analysis.aggregate import aggregate
    from varbench.cli.aggregate import print_result
    from varbench.core.errors import FixableError

    src = Path(cfg.paths.store_dir) / str(cfg.experiment_name)
    out = Path(cfg.paths.results_dir) / str(cfg.experiment_name)
    sink = _wandb_sink(cfg)
    try:
        result = aggregate(src, out, figures=sink is None, failed=failed or ())   # with W&B the figures are rendered once, below
    except FixableError as e:   # unpaired rows, a broken seal, a garbled file, a read-only results folder
        print(f"[varbench] no table written: {e}")
        return None
    if sink is not None:
        from varbench.loggers.publish import log_sweep, mark_sweep_logged, sweep_figures

        from varbench.analysis.aggregate import write_report

        figures = sweep_figures(result.groups)
        write_report(result)       # again, now with the figures rendered for W&B
        info = log_sweep(sink, out, str(cfg.experiment_name), figures, n_records=len(result.paired))
        if info is not None:       # the next `varbench.publish` then skips these tables (it used to log them again)
            mark_sweep_logged(sink, src, out, info)
    print_result(result, prefix="[varbench] ", figures=True)
    return result


def _announce_sweep_size(config: DictConfig) -> None:
    """Count the sweep's jobs for their "job k/N" lines (:mod:`varbench.cli.report`); the count goes
    into the environment, which launchers hand on to the jobs' processes."""
    import os

    from omegaconf import OmegaConf

    from varbench.cli.report import ENV_SWEEP_JOBS, sweep_size

    try:
        params = config.hydra.sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=True) if params is not None else {}   # resolved, as Hydra instantiates the sweeper (compose_matrix picks its list by model)
        n = sweep_size(list(config.hydra.overrides.task), params)
    except Exception:  # noqa: BLE001 - the count is a courtesy; the line then says "job k"
        n = None
    if n is not None:
        os.environ[ENV_SWEEP_JOBS] = str(n)
    else:
        os.environ.pop(ENV_SWEEP_JOBS, None)


class AggregateOnMultirunEnd(Callback):
    """Clears the sweep's failure notes at the start; at the end, aggregates the finished records,
    reports the failed jobs and exits non-zero if any failed."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from varbench.cli.report import DONE_LOG

        failures_path(config.hydra.sweep.dir).unlink(missing_ok=True)  # a relaunch into the same folder
        (Path(config.hydra.sweep.dir) / DONE_LOG).unlink(missing_ok=True)   # the ETA counts this launch's jobs
        _announce_sweep_size(config)
        launcher_watch.sweep_started(config)  # submitit: one job per device, jobs' lines here
        if not str(config.hydra.launcher.get("_target_", "")).endswith(".BasicLauncher"):
            from varbench.core.interrupt import set_immediate

            # the jobs run in other processes: Ctrl-C here only stops waiting for them
            store = Path(config.paths.store_dir) / str(config.experiment_name)
            local = "Local" in str(config.hydra.launcher.get("_target_", ""))
            running = ("the jobs already started keep running (kill their processes to stop them); the ones not "
                       "started yet will not start (relaunch the sweep: finished jobs are skipped)" if local else
                       "the submitted jobs keep running (scancel them to stop them)")
            set_immediate(True, farewell=(
                f"[varbench] stopped waiting; {running}. "
                f"Once they finish: python -m varbench.aggregate {store} --out "
                f"{Path(config.paths.results_dir) / str(config.experiment_name)}"))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        launcher_watch.announce_job(config)   # a submitit job's first line names it

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        import os

        from varbench.cli.report import ENV_SWEEP_JOBS

        launcher_watch.sweep_stopped()    # the jobs' last lines before the table
        failed = read_failures(config.hydra.sweep.dir)
        n_jobs = os.environ.get(ENV_SWEEP_JOBS)
        try:
            if n_jobs is not None and failed and len(failed) >= int(n_jobs):
                # the table could only show earlier runs' records: reprinting it would look like success
                from varbench.analysis.layout import is_results_folder

                out = Path(config.paths.results_dir) / str(config.experiment_name)
                print("[varbench] no job of this sweep finished: no table written"
                      + (f" (the tables under {out} are from an earlier run)" if is_results_folder(out) else ""))
            elif config.get("aggregate", True):
                aggregate_experiment(config, failed)
        finally:
            n_failed = report_failures(config.hydra.sweep.dir, failed)
        if n_failed:
            raise SystemExit(1)

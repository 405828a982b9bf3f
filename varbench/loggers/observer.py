"""W&B as a job observer: the job's hooks (:mod:`varbench.harness.events`) drive its W&B run.

Usage (the command line does this, :func:`varbench.cli.run.job_observers`)::

    from varbench.loggers.observer import observers_from_cfg
    observers = observers_from_cfg(cfg.logger)     # logger=wandb: [WandbObserver]; logger=none: []
    run_job(cfg, observers)

What each hook does (the run itself: :mod:`varbench.loggers.publish`):

* ``job_started``: opens the job's run (:meth:`JobRun.open`); a missing login fails the job here,
  before any model is built, naming the fix;
* ``progress``: live progress (``progress/<stage>``, throttled to ``logger.progress_every_s``);
* ``job_finished``: logs the finished record (summary with the paired speed-up and deltas, tables,
  artifact), ends the run, writes the entry's ``.published`` marker; a W&B error is printed, never raised;
* ``job_failed``: ends the run with exit code 1;
* ``job_skipped`` / ``record_assembled``: publishes the record if it never was (:func:`republish`).
"""
from __future__ import annotations

from typing import Any, Mapping

from varbench.harness.events import JobObserver
from varbench.loggers.publish import JobRun, republish, sink_from_cfg, stage_key
from varbench.loggers.wandb import WandbSink


class WandbObserver(JobObserver):
    """One job's W&B run, opened and filled from the job's hooks (see the module docstring)."""

    def __init__(self, sink: WandbSink):
        self.sink = sink
        self.run: JobRun | None = None

    def job_skipped(self, job: Any, record: Mapping) -> None:
        republish(job, record, self.sink)

    def job_started(self, job: Any) -> None:
        self.run = JobRun.open(job, self.sink)

    def progress(self, job: Any, stage: str, done: int, total: int) -> None:
        if self.run is not None:
            self.run.progress(stage_key(stage), done, total)

    def job_finished(self, job: Any, record: Mapping | None) -> None:
        if self.run is not None:
            self.run.finish(job, record)

    def job_failed(self, job: Any, error: BaseException) -> None:
        if self.run is not None:
            self.run.fail(error)

    def record_assembled(self, job: Any, record: Mapping) -> None:
        republish(job, record, self.sink)


def observers_from_cfg(logger_cfg: Any) -> list[JobObserver]:
    """The observers a ``logger`` config node names by its ``_target_`` (``varbench/conf/logger/``):
    ``logger=wandb`` (:class:`varbench.loggers.wandb.WandbSink`) -> one :class:`WandbObserver`;
    ``logger=none`` or no node -> none. A bad mode or an unknown target is a ConfigError naming the
    fix (:func:`varbench.loggers.publish.sink_from_cfg`)."""
    sink = sink_from_cfg(logger_cfg)
    return [] if sink is None else [WandbObserver(sink)]
